#!/usr/bin/python3
"""sluice bench against fio: same file, same parameters, interleaved, several rounds.

For each case and file system it runs `sluice bench --json` and `fio --output-format=json`
alternately (sluice first in even rounds, fio first in odd ones), then prints the median of
the per-round ratios sluice/fio for throughput (or IOPS) and for CPU seconds per GiB.

    bench/fio_compare.py                      # 4 GiB on the disk and on a RAM-backed loop
    bench/fio_compare.py --size 1G --rounds 3 --targets disk
    bench/fio_compare.py --markdown           # a table for docs/performance.md

The RAM-backed target is ext4 on a loop device over a file in /dev/shm (needs root and
size + 25% of free memory); it is much less noisy than the shared virtio disk. Only the
standard library is used, so Debian's /usr/bin/python3 runs it as is.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchlib import SLUICE_DEFAULT, fio_cpu, parse_size, print_table

GIB = 1 << 30

CASES = [
    # name, rw, bs, qd, timed (seconds; 0 = one pass over the file), metric
    ("seq read 1M qd32", "read", "1M", 32, 0, "throughput"),
    ("seq write 1M qd32", "write", "1M", 32, 0, "throughput"),
    ("rand read 4K qd32", "randread", "4K", 32, 8, "iops"),
]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"fio_compare: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def sluice_once(sluice, path, size, rw, bs, qd, runtime):
    cmd = [sluice, "bench", "--file", path, "--mode", "uring", "--rw", rw, "--bs", bs,
           "--qd", str(qd), "--size", str(size), "--json"]
    if runtime:
        cmd += ["--runtime", str(runtime)]
    j = json.loads(run(cmd))
    gib = j["bytes"] / GIB
    return {
        "gib_s": j["throughput_gib_s"],
        "iops": j["iops"],
        "cpu_s_per_gib": j["cpu_pct"] / 100 * j["seconds"] / gib,
        "p99_us": j["lat_us"]["p99"],
    }


def fio_once(path, size, rw, bs, qd, runtime):
    cmd = ["fio", "--name=anchor", f"--filename={path}", "--ioengine=io_uring", "--direct=1",
           f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", f"--size={size}", "--numjobs=1",
           "--thread", "--output-format=json", "--randrepeat=0"]
    if runtime:
        cmd += [f"--runtime={runtime}", "--time_based"]
    j = json.loads(run(cmd))["jobs"][0]
    kind = "write" if rw in ("write", "randwrite") else "read"
    side = j[kind]
    gib = side["io_bytes"] / GIB
    cpu_s = fio_cpu(j, kind)
    return {
        "gib_s": side["bw_bytes"] / GIB,
        "iops": side["iops"],
        "cpu_s_per_gib": cpu_s / gib,
        "p99_us": side["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0,
    }


class RamLoop:
    """ext4 on a loop device backed by a file in /dev/shm."""

    def __init__(self, size):
        self.image = tempfile.mktemp(prefix="sluice-bench-", suffix=".img", dir="/dev/shm")
        self.mount = tempfile.mkdtemp(prefix="sluice-bench-mnt-")
        self.dev = None
        with open(self.image, "wb") as f:
            f.truncate(int(size * 1.25) + (256 << 20))
        try:
            self.dev = run(["losetup", "--find", "--show", self.image]).strip()
            run(["mkfs.ext4", "-q", "-F", self.dev])
            run(["mount", self.dev, self.mount])
        except BaseException:
            self.close()  # no image left in /dev/shm, no loop device left attached
            raise

    def close(self):
        subprocess.run(["umount", self.mount], capture_output=True)
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
        os.unlink(self.image)
        os.rmdir(self.mount)


def compare(sluice, directory, size, rounds, label, report):
    path = os.path.join(directory, "fio-compare.dat")
    # Lay the file out once (sluice writes its verification pattern), so neither tool
    # measures a fresh file's allocation.
    run([sluice, "bench", "--file", path, "--size", str(size), "--rw", "read", "--bs", "1M",
         "--runtime", "0.1"])
    for name, rw, bs, qd, runtime, metric in CASES:
        pairs = []
        for r in range(rounds):
            order = [("sluice", sluice_once), ("fio", fio_once)]
            if r % 2:
                order.reverse()
            got = {}
            for who, fn in order:
                args = (path, size, rw, bs, qd, runtime)
                got[who] = fn(sluice, *args) if who == "sluice" else fn(*args)
            pairs.append(got)
            print(f"  [{label}] {name} round {r + 1}: sluice {got['sluice']['gib_s']:.3f} GiB/s "
                  f"{got['sluice']['iops']:.0f} IOPS, fio {got['fio']['gib_s']:.3f} GiB/s "
                  f"{got['fio']['iops']:.0f} IOPS", file=sys.stderr)
        key = "gib_s" if metric == "throughput" else "iops"
        s_med = statistics.median(p["sluice"][key] for p in pairs)
        f_med = statistics.median(p["fio"][key] for p in pairs)
        ratio = statistics.median(p["sluice"][key] / p["fio"][key] for p in pairs)
        cpu_ratio = statistics.median(
            p["sluice"]["cpu_s_per_gib"] / p["fio"]["cpu_s_per_gib"] for p in pairs)
        report.append({
            "target": label, "case": name, "metric": key, "rounds": rounds,
            "sluice": s_med, "fio": f_med, "ratio": ratio,
            "sluice_cpu_s_per_gib": statistics.median(p["sluice"]["cpu_s_per_gib"] for p in pairs),
            "fio_cpu_s_per_gib": statistics.median(p["fio"]["cpu_s_per_gib"] for p in pairs),
            "cpu_ratio": cpu_ratio,
            "ratio_min": min(p["sluice"][key] / p["fio"][key] for p in pairs),
            "ratio_max": max(p["sluice"][key] / p["fio"][key] for p in pairs),
        })
    os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default=SLUICE_DEFAULT)
    ap.add_argument("--size", default="4G", help="file size (default 4G)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case (default 5)")
    ap.add_argument("--targets", default="disk,ramloop", help="disk, ramloop or both")
    ap.add_argument("--dir", default=os.environ.get("SLUICE_BENCH_DIR", "/var/tmp"),
                    help="directory on the disk target (default /var/tmp)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio_compare: fio not found (apt-get install fio, or: make bench)")
    size = parse_size(a.size)
    report = []
    for target in a.targets.split(","):
        if target == "disk":
            d = tempfile.mkdtemp(prefix="sluice-bench-", dir=a.dir)
            try:
                compare(a.sluice, d, size, a.rounds, "disk", report)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        elif target == "ramloop":
            if os.geteuid() != 0:
                print("fio_compare: SKIP ramloop: needs root for losetup and mount", file=sys.stderr)
                continue
            loop = RamLoop(size)
            try:
                compare(a.sluice, loop.mount, size, a.rounds, "ramloop", report)
            finally:
                loop.close()
        else:
            sys.exit(f"fio_compare: unknown target {target!r}")
    if a.json:
        print(json.dumps(report, indent=2))
        return
    hdr = ["target", "case", "sluice", "fio", "median ratio", "range", "CPU s/GiB sluice", "CPU s/GiB fio", "CPU ratio"]
    rows = []
    for r in report:
        unit = "GiB/s" if r["metric"] == "gib_s" else "IOPS"
        fmt = (lambda v: f"{v:.3f} {unit}") if unit == "GiB/s" else (lambda v: f"{v:,.0f} {unit}")
        rows.append([r["target"], r["case"], fmt(r["sluice"]), fmt(r["fio"]), f"{r['ratio']:.3f}",
                     f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}", f"{r['sluice_cpu_s_per_gib']:.3f}",
                     f"{r['fio_cpu_s_per_gib']:.3f}", f"{r['cpu_ratio']:.3f}"])
    print_table(hdr, rows, a.markdown)
    print(f"\nratios are sluice/fio, median of {a.rounds} interleaved rounds; "
          "CPU ratio below 1 means sluice used less CPU per GiB")


if __name__ == "__main__":
    main()
