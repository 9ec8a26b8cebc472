#!/usr/bin/python3
"""Checkpoints: sluice's Checkpointer against memcpy, fio and torch.save/torch.load, on the
same state size, interleaved, several rounds; prints the median of the per-round ratios.

    bench/ckpt_compare.py                       # 2 GiB of 128 float32 tensors, 5 rounds
    bench/ckpt_compare.py --bytes 512M --rounds 3 --dir /mnt/nvme/bench
    bench/ckpt_compare.py --markdown            # a table for docs/performance.md
    bench/ckpt_compare.py --target ramloop      # on ext4 over a RAM-backed loop device (root)

What is compared, each round:
  stall     sluice save() returning (bytes staged)   vs  memcpy of the same bytes into
                                                         already-touched memory (same process)
  durable   sluice save() until the local tier       vs  fio writing the same bytes
            committed (fdatasync, rename, manifest)      (O_DIRECT, io_uring, 4M x 16, end_fsync)
  save      sluice save() until every tier committed vs  torch.save of the tensors + fsync
  restore   sluice restore() into allocated tensors, vs  torch.load from a cold page cache
            every chunk checked                          (the file's pages dropped first),
                                                         and fio reading fio's file back
                                                         (O_DIRECT, io_uring, 4M x 16)
  CPU       seconds (user + system) per GiB: sluice's over save() until every tier
            committed and over restore() (its rusage, every thread), fio's over its write
            and its read (its own usr_cpu + sys_cpu)
The rounds alternate which side goes first. Needs fio and Debian's python3-torch
(scripts/install-deps.sh --bench); run with /usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchlib import fio_cpu, parse_size, print_table
from fio_compare import RamLoop

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DEFAULT = os.path.join(HERE, "..", "build", "bin", "sluice_ckpt_bench")

TORCH_SCRIPT = r"""
import json, os, sys, time, torch
path, nbytes, ntensors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per = nbytes // ntensors // 4
sd = {f"layer.{i}.weight": torch.empty(per, dtype=torch.float32).fill_(i) for i in range(ntensors)}
t0 = time.monotonic()
with open(path, "wb") as f:
    torch.save(sd, f)
    f.flush()
    os.fsync(f.fileno())
save_s = time.monotonic() - t0
del sd
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a cold page cache for the load
os.close(fd)
t0 = time.monotonic()
sd = torch.load(path)
load_s = time.monotonic() - t0
assert len(sd) == ntensors
print(json.dumps({"save_s": save_s, "load_s": load_s}))
"""


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ckpt_compare: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def drop_cache(path):
    for root, _, names in os.walk(path):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def sluice_round(bench, d, nbytes, ntensors, step):
    save = json.loads(run([bench, "save", "--dir", d, "--bytes", str(nbytes), "--tensors",
                           str(ntensors), "--step", str(step)]))
    save["save_cpu_per_gib"] = save["save_cpu_s"] / (nbytes / (1 << 30))
    drop_cache(d)
    restore = json.loads(run([bench, "restore", "--dir", d, "--bytes", str(nbytes), "--tensors",
                              str(ntensors), "--step", str(step)]))
    restore["restore_cpu_per_gib"] = restore["restore_cpu_s"] / (nbytes / (1 << 30))
    shutil.rmtree(os.path.join(d, "bench"), ignore_errors=True)
    return {**save, **restore}


def fio_round(path, nbytes):
    j = json.loads(run(["fio", "--name=anchor", f"--filename={path}", "--ioengine=io_uring",
                        "--direct=1", "--rw=write", "--bs=4M", "--iodepth=16", f"--size={nbytes}",
                        "--end_fsync=1", "--thread", "--output-format=json"]))
    write_cpu = fio_cpu(j["jobs"][0], "write") / (nbytes / (1 << 30))
    drop_cache(os.path.dirname(path))
    r = json.loads(run(["fio", "--name=anchor", f"--filename={path}", "--ioengine=io_uring",
                        "--direct=1", "--rw=read", "--bs=4M", "--iodepth=16", f"--size={nbytes}",
                        "--thread", "--output-format=json"]))
    os.unlink(path)
    return {"fio_s": j["jobs"][0]["write"]["runtime"] / 1000.0, "fio_write_cpu_per_gib": write_cpu,
            "fio_read_s": r["jobs"][0]["read"]["runtime"] / 1000.0,
            "fio_read_cpu_per_gib": fio_cpu(r["jobs"][0], "read") / (nbytes / (1 << 30))}


def torch_round(path, nbytes, ntensors):
    j = json.loads(run(["/usr/bin/python3", "-c", TORCH_SCRIPT, path, str(nbytes), str(ntensors)]))
    os.unlink(path)
    return {"torch_save_s": j["save_s"], "torch_load_s": j["load_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", default="2G")
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir in /var/tmp, on disk)")
    ap.add_argument("--target", choices=["disk", "ramloop"], default="disk",
                    help="ramloop: ext4 on a loop device over /dev/shm, a steadier fast NVMe (needs root)")
    ap.add_argument("--bench", default=BENCH_DEFAULT)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    nbytes = parse_size(a.bytes)
    for tool in ("fio",):
        if not shutil.which(tool):
            sys.exit(f"ckpt_compare: {tool} is missing (scripts/install-deps.sh --bench)")
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode:
        sys.exit("ckpt_compare: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
    loop = RamLoop(nbytes * 2) if a.target == "ramloop" else None
    d = tempfile.mkdtemp(prefix="sluice-ckpt-bench-", dir=loop.mount if loop else (a.dir or "/var/tmp"))
    rows = []
    try:
        for r in range(a.rounds):
            sides = [lambda: sluice_round(a.bench, os.path.join(d, "sluice"), nbytes, a.tensors, r + 1),
                     lambda: fio_round(os.path.join(d, "fio.dat"), nbytes),
                     lambda: torch_round(os.path.join(d, "torch.pt"), nbytes, a.tensors)]
            if r % 2:
                sides.reverse()
            got = {}
            for side in sides:
                got.update(side())
            rows.append(got)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(got.items())
                                                 if k.endswith("_s")), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if loop:
            loop.close()

    def med(key):
        return statistics.median(x[key] for x in rows)

    def ratio(f):
        vals = [f(x) for x in rows]
        return statistics.median(vals), min(vals), max(vals)

    table = [
        ("stall: save() returned / memcpy", lambda x: x["stall_s"] / x["memcpy_s"], "<= 1.5",
         f"{med('stall_s'):.3f} / {med('memcpy_s'):.3f}"),
        ("durable: local tier committed / fio + fsync", lambda x: x["durable_s"] / x["fio_s"], "<= 1.15",
         f"{med('durable_s'):.3f} / {med('fio_s'):.3f}"),
        ("save CPU s/GiB: sluice / fio write", lambda x: x["save_cpu_per_gib"] / x["fio_write_cpu_per_gib"],
         "-", f"{med('save_cpu_per_gib'):.3f} / {med('fio_write_cpu_per_gib'):.3f} (CPU s/GiB)"),
        ("save: torch.save + fsync / sluice save", lambda x: x["torch_save_s"] / x["total_s"], ">= 3",
         f"{med('torch_save_s'):.3f} / {med('total_s'):.3f}"),
        ("restore: torch.load cold / sluice restore", lambda x: x["torch_load_s"] / x["restore_s"], ">= 2",
         f"{med('torch_load_s'):.3f} / {med('restore_s'):.3f}"),
        ("restore: fio read (O_DIRECT) / sluice restore", lambda x: x["fio_read_s"] / x["restore_s"], "-",
         f"{med('fio_read_s'):.3f} / {med('restore_s'):.3f}"),
        ("restore CPU s/GiB: sluice / fio read", lambda x: x["restore_cpu_per_gib"] / x["fio_read_cpu_per_gib"],
         "-", f"{med('restore_cpu_per_gib'):.3f} / {med('fio_read_cpu_per_gib'):.3f} (CPU s/GiB)"),
    ]
    out = []
    for name, f, target, secs in table:
        m, lo, hi = ratio(f)
        out.append([name, f"{m:.2f}", f"{lo:.2f}-{hi:.2f}", target, secs])
    print(f"{nbytes / (1 << 30):.2f} GiB in {a.tensors} float32 tensors, {a.rounds} rounds, medians, "
          f"on {a.target}")
    print_table(["comparison", "median ratio", "range", "target", "medians"], out, a.markdown)


if __name__ == "__main__":
    main()
