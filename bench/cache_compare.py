#!/usr/bin/python3
"""The tiered cache against its anchors, interleaved, several rounds, median ratios.

Cases (issue 7's):
  - warm read from the NVMe tier (RAM tier off) against fio reading the same chunk files
    with O_DIRECT and io_uring (bs 1M, iodepth 16): target >= 0.9x;
  - warm read from the RAM tier against a memcpy of the same bytes into touched memory,
    same threads: target >= 0.7x;
  - cold `sluice cp --cache` from s3rver (empty cache; it also fills the NVMe tier) against
    a plain `sluice cp` of the same object: target >= 0.9x; once with the destination on
    tmpfs (what the cache adds to a read), once on the disk that holds the cache;
  - hit ratios of lru, s3fifo and declared on the 1.5x trace, beside the offline optimum.

    bench/cache_compare.py [--size 1G] [--rounds 5] [--targets disk,ramloop,s3rver] [--markdown]

Warm rows also give CPU seconds (user + system) per GiB read over the timed pass only:
sluice_cache_bench's rusage around it (not the cache's open, nor the RAM tier's untimed
load, nor memcpy's source being touched), and fio's own usr_cpu + sys_cpu over its run.

The RAM-backed target (ext4 on a loop device over /dev/shm) needs root; without it, SKIP.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import S3rver, find_s3rver  # noqa: E402
from benchlib import SLUICE_DEFAULT, fio_cpu, parse_size, print_table  # noqa: E402
from fio_compare import RamLoop  # noqa: E402

BIN = os.path.dirname(os.path.abspath(SLUICE_DEFAULT))
MIB = 1 << 20


last_cpu = [None]  # CPU seconds per GiB of the last bench() or fio(), for interleaved()


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"cache_compare: {' '.join(cmd[:4])}... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def bench(mode, data, cache, threads=4):
    j = json.loads(run([f"{BIN}/sluice_cache_bench", mode, "--data", data, "--cache", cache,
                        "--threads", str(threads)]))
    last_cpu[0] = j["cpu_s"] / (j["bytes"] / (1 << 30))
    return j["gib_s"]


def fio(cache):
    out = run(["fio", "--name=anchor", f"--opendir={cache}/chunks", "--ioengine=io_uring", "--direct=1",
               "--rw=read", "--bs=1M", "--iodepth=16", "--numjobs=1", "--thread", "--output-format=json"])
    job = json.loads(out[out.index("{"):])["jobs"][0]  # after "opendir added N files"
    last_cpu[0] = fio_cpu(job, "read") / (job["read"]["io_bytes"] / (1 << 30))
    return job["read"]["bw_bytes"] / (1 << 30)


def interleaved(rounds, pair):
    """pair: [(name, fn), (name, fn)]; alternates who goes first; returns per-round results."""
    results = []
    for r in range(rounds):
        order = pair if r % 2 == 0 else pair[::-1]
        got = {}
        for name, fn in order:
            last_cpu[0] = None
            got[name] = fn()
            if last_cpu[0] is not None:
                got[f"{name} cpu"] = last_cpu[0]
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), file=sys.stderr)
        results.append(got)
    return results


def summarize(label, case, unit, results, a, b):
    med = statistics.median
    ratio = med(x[a] / x[b] for x in results)
    cpu = ["", ""]
    if f"{a} cpu" in results[0] and f"{b} cpu" in results[0]:
        cpu = [f"{med(x[f'{a} cpu'] for x in results):.3f}", f"{med(x[f'{b} cpu'] for x in results):.3f}"]
    return [label, case, unit, f"{med(x[a] for x in results):.3f}",
            f"{med(x[b] for x in results):.3f}", b, f"{ratio:.2f}",
            f"{min(x[a] / x[b] for x in results):.2f}-{max(x[a] / x[b] for x in results):.2f}", *cpu]


def warm_cases(directory, size, rounds, label, rows):
    data, cache = os.path.join(directory, "data"), os.path.join(directory, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    run([f"{BIN}/sluice_cache_bench", "prepare", "--data", data, "--cache", cache, "--size", f"{size // MIB}M"])
    print(f"{label}: warm NVMe tier against fio", file=sys.stderr)
    res = interleaved(rounds, [("sluice", lambda: bench("nvme", data, cache)), ("fio", lambda: fio(cache))])
    rows.append(summarize(label, "warm read, NVMe tier", "GiB/s", res, "sluice", "fio"))
    print(f"{label}: warm RAM tier against memcpy", file=sys.stderr)
    res = interleaved(rounds, [("sluice", lambda: bench("ram", data, cache)),
                               ("memcpy", lambda: bench("memcpy", data, cache))])
    rows.append(summarize(label, "warm read, RAM tier", "GiB/s", res, "sluice", "memcpy"))
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)


def cold_case(work, size, rounds, rows):
    if not find_s3rver():
        print("cache_compare: SKIP cold read: s3rver not installed (make test-tools)", file=sys.stderr)
        return
    srv = S3rver(buckets=("bench",))
    try:
        env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
                   SLUICE_HOME=os.path.join(work, "home"))
        big = os.path.join(work, "big.bin")
        with open(big, "wb") as f:
            for _ in range(size // (64 * MIB)):
                f.write(os.urandom(64 * MIB))
        ep = ["--endpoint-url", srv.endpoint, "--no-progress", "--json"]
        run([SLUICE_DEFAULT, "cp", big, "s3://bench/big.bin", *ep], env)
        # The destination on tmpfs isolates what the cache adds to a read (its copy, checksum
        # and NVMe write); on the cache's own disk, the two writes also share one virtio disk.
        for where, out in (("tmpfs", "/dev/shm/sluice-cache-bench-out.bin"),
                           ("disk", os.path.join(work, "out.bin"))):
            def cp(cached, out=out):
                shutil.rmtree(os.path.join(work, "home"), ignore_errors=True)
                if os.path.exists(out):
                    os.remove(out)
                # The previous run's dirty pages and deletions are written back now, not
                # during this run: otherwise whichever tool runs first in a round pays them.
                os.sync()
                j = json.loads(run([SLUICE_DEFAULT, "cp", "s3://bench/big.bin", out, *ep,
                                    *(["--cache"] if cached else [])], env))
                return j["bytes"] / MIB / j["seconds"]

            print(f"s3rver: cold read through the cache against plain cp, destination on {where}",
                  file=sys.stderr)
            try:
                res = interleaved(rounds, [("cached", lambda: cp(True)), ("plain", lambda: cp(False))])
            finally:
                if os.path.exists(out):
                    os.remove(out)
            rows.append(summarize("s3rver", f"cold cp --cache, destination on {where}", "MiB/s",
                                  res, "cached", "plain"))
    finally:
        srv.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--targets", default="disk,ramloop,s3rver")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    size = parse_size(a.size)
    rows = []
    work = tempfile.mkdtemp(prefix="sluice-cache-bench-", dir="/var/tmp")
    try:
        for target in a.targets.split(","):
            if target == "disk":
                warm_cases(work, size, a.rounds, "disk", rows)
            elif target == "ramloop":
                if os.geteuid() != 0:
                    print("cache_compare: SKIP ramloop: needs root for losetup and mount", file=sys.stderr)
                    continue
                loop = RamLoop(size * 2)
                try:
                    warm_cases(loop.mount, size, a.rounds, "ramloop", rows)
                finally:
                    loop.close()
            elif target == "s3rver":
                cold_case(work, size, a.rounds, rows)
            else:
                sys.exit(f"cache_compare: unknown target '{target}' (disk, ramloop, s3rver)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(["target", "case", "unit", "sluice", "anchor", "anchor tool", "ratio", "range",
                 "CPU s/GiB sluice", "CPU s/GiB anchor"], rows, a.markdown)
    print(f"\nmedians of {a.rounds} interleaved rounds; ratio is the median of per-round ratios\n")
    trace = json.loads(run([f"{BIN}/sluice_cache_bench", "trace"]))
    print_table(["trace (1.5x the cache, 3 epochs)", "policy", "epoch 1", "epoch 2", "epoch 3"],
                [[t["trace"], t["policy"], *(f"{x:.3f}" for x in t["epochs"])] for t in trace], a.markdown)


if __name__ == "__main__":
    main()
