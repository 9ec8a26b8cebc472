#!/usr/bin/python3
"""The streaming loader against plain tools on the same data, on s3rver on loopback,
interleaved, several rounds; prints medians and the median of the per-round ratios.

    bench/stream_compare.py                  # 5 rounds
    bench/stream_compare.py --rounds 3 --markdown
    bench/stream_compare.py --cases small --cache-on ramloop   # caches on a RAM-backed loop (root)

Datasets (made once, on s3rver):
  d100k   100 KiB samples in 16 MiB WebDataset shards with indexes (sluice dataset pack)
  d1k     1 KiB samples in tar shards with indexes
  o1k     1 KiB plain objects, one sample per object

What is compared, each round:
  epoch 1 (cold)  `sluice dataset read` of d100k through a fresh cache  vs  `sluice cp -r` of
                  the same shards to a local directory (bytes of the shards / seconds)
  epoch 2 (warm)  the same read again, 3 epochs in one process (the cache's NVMe tier)  vs
                  fio reading the cache directory's chunk files 3 times (O_DIRECT, io_uring,
                  1M x 16); each side's CPU seconds (user + system, rusage) per GiB delivered
  1 KiB warm      d1k read from a warm cache, 3 epochs in one process: samples/s, samples per
                  CPU second (user + system, rusage: "on one core" is at least the rate), time
                  to the first sample  vs  fio reading the cache's chunk files as often, in
                  samples/s at the bytes the loader read per sample (the device's ceiling)
  1 KiB objects   `sluice dataset read --no-cache` of o1k: objects/s    vs  curl with 16 parallel
                  connections GETting the same objects (the server's ceiling)
With --cache-on ramloop the caches live on ext4 over a loop device in /dev/shm, a fast
device that leaves the CPU to measure (this VM's disk reads at 1-2 GiB/s, which caps the
1 KiB case near its own speed). Needs s3rver (make test-tools), fio and curl. Run with
/usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from benchlib import SLUICE_DEFAULT, children_cpu, print_table  # noqa: E402
from fio_compare import RamLoop  # noqa: E402
from s3_harness import S3rver, find_s3rver  # noqa: E402

WARM_EPOCHS = 3  # read by the warm case, in one process (and as many loops of fio)
ENV = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")


def run(cmd, **kw):
    """Runs `cmd`; the result carries `cpu`: its user + system seconds (rusage)."""
    c0 = children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, **kw)
    p.cpu = children_cpu() - c0
    if p.returncode != 0:
        sys.exit(f"stream_compare: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p


def timed(cmd):
    t0 = time.monotonic()
    run(cmd)
    return time.monotonic() - t0


def make_dir(d, n, size, fields=1):
    os.makedirs(d, exist_ok=True)
    block = os.urandom(size)
    for i in range(n):
        for f in range(fields):
            with open(os.path.join(d, f"{i:07d}.f{f}"), "wb") as out:
                out.write(block[i % 97:] + block[:i % 97])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default=SLUICE_DEFAULT)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big-samples", type=int, default=2000, help="100 KiB samples in d100k")
    ap.add_argument("--small-samples", type=int, default=100000, help="1 KiB samples in d1k")
    ap.add_argument("--objects", type=int, default=2000, help="1 KiB objects in o1k")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--read-args", default="", help="extra arguments for sluice dataset read")
    ap.add_argument("--cases", default="cold,warm,small,objects",
                    help="which cases to run (comma-separated: cold, warm, small, objects)")
    ap.add_argument("--cache-on", choices=["disk", "ramloop"], default="disk",
                    help="where the caches live: this machine's disk, or ext4 on a RAM-backed loop "
                         "device (needs root)")
    a = ap.parse_args()
    if a.cache_on == "ramloop" and os.geteuid() != 0:
        sys.exit("stream_compare: --cache-on ramloop needs root (losetup, mount)")
    for tool in ("fio", "curl"):
        if not shutil.which(tool):
            sys.exit(f"stream_compare: {tool} not found (scripts/install-deps.sh --bench)")
    if not find_s3rver():
        sys.exit("stream_compare: s3rver not found (make test-tools)")
    sluice = os.path.abspath(a.sluice)
    work = tempfile.mkdtemp(prefix="sluice-stream-bench-")
    ENV["SLUICE_HOME"] = os.path.join(work, "home")  # its own catalogs and caches
    s3 = S3rver(buckets=("bench",))
    ep = s3.endpoint
    loop = None
    try:
        caches = work
        if a.cache_on == "ramloop":
            # One round's caches at a time: the 100 KiB and 1 KiB datasets, and ext4's share.
            loop = RamLoop(a.big_samples * (110 << 10) + a.small_samples * 1600)
            caches = loop.mount
        print("preparing datasets on s3rver ...", file=sys.stderr)
        src = os.path.join(work, "src")
        make_dir(src + "100k", a.big_samples, 100 << 10)
        run([sluice, "dataset", "pack", src + "100k", "s3://bench/d100k", "--shard-size", "16M",
             "--endpoint-url", ep])
        if "small" in a.cases:
            make_dir(src + "1k", a.small_samples, 1 << 10)
            run([sluice, "dataset", "pack", src + "1k", "s3://bench/d1k", "--shard-size", "16M",
                 "--endpoint-url", ep])
        make_dir(src + "obj", a.objects, 1 << 10)
        if "objects" in a.cases:
            run([sluice, "cp", "-r", src + "obj", "s3://bench/o1k", "--endpoint-url", ep])
        shards = json.loads(run([sluice, "dataset", "stat", "s3://bench/d100k", "--json",
                                 "--endpoint-url", ep]).stdout)
        shard_bytes = shards["bytes"]
        objects = sorted(os.listdir(src + "obj"))
        curl_cfg = os.path.join(work, "curl.cfg")
        with open(curl_cfg, "w") as f:
            for k in objects:
                f.write(f'url = "{ep}/bench/o1k/{k}"\noutput = "{work}/curl-out/{k}"\n')

        def read(uri, *extra):
            r = run([sluice, "dataset", "read", uri, "--json", "--daemon", "none", "--no-progress",
                     "--endpoint-url", ep, *a.read_args.split(), *extra])
            j = json.loads(r.stdout)
            j["cpu"] = j["cpu_user_s"] + j["cpu_system_s"]  # the process: start, listing, reading
            return j

        rows = {k: [] for k in ("cold", "cp", "warm", "fio", "fio_wide", "warm_cpu", "fio_cpu",
                                "amplification", "small_rate", "small_per_cpu", "small_fio",
                                "small_ttfb", "objs", "curl")}

        def fio_loops(directory, depth=16):
            """fio reading the chunk files under `directory` WARM_EPOCHS times, `depth` 1 MiB
            reads in flight: (bytes/s, CPU seconds, bytes read)."""
            r = run(["fio", "--name=warm", f"--opendir={directory}/chunks", "--rw=read", "--bs=1M",
                     "--direct=1", "--ioengine=io_uring", f"--iodepth={depth}", "--readonly",
                     f"--loops={WARM_EPOCHS}", "--output-format=json"])
            job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
            return job["io_bytes"] / (job["runtime"] / 1000), r.cpu, job["io_bytes"]

        for rnd in range(a.rounds):
            cache = os.path.join(caches, f"cache-{rnd}")
            first = rnd % 2 == 0
            # epoch 1 (cold) against cp -r of the same shards
            def cold():
                j = read("s3://bench/d100k", "--cache-dir", cache, "--seed", str(rnd))
                rows["cold"].append(shard_bytes / j["seconds"] / (1 << 20))

            def cp():
                out = os.path.join(work, "cp-out")
                shutil.rmtree(out, ignore_errors=True)
                s = timed([sluice, "cp", "-r", "s3://bench/d100k/", out, "--endpoint-url", ep, "--no-progress"])
                rows["cp"].append(shard_bytes / s / (1 << 20))
            cases = a.cases.split(",")
            if "cold" in cases or "warm" in cases:
                for fn in ((cold, cp) if first else (cp, cold)):
                    fn()

            # epoch 2 (warm) against fio over the cache's chunk files
            def warm():
                # Three warm epochs in one process, as a training job reads them: the
                # loader's buffers are touched for the first time in the first only.
                j = read("s3://bench/d100k", "--cache-dir", cache, "--seed", str(rnd), "--epoch", "1",
                         "--epochs", str(WARM_EPOCHS))
                rows["warm"].append(WARM_EPOCHS * shard_bytes / j["seconds"] / (1 << 20))
                rows["warm_cpu"].append(j["cpu"] / (j["bytes"] / (1 << 30)))  # per GiB of samples
                rows["amplification"].append(j["read_bytes"] / j["bytes"])

            def fio():
                rate, cpu, io_bytes = fio_loops(cache)
                rows["fio"].append(rate / (1 << 20))
                rows["fio_cpu"].append(cpu / (io_bytes / (1 << 30)))

            def fio_wide():
                # fio with as much memory in flight as the loader's read-ahead (three 64 MiB
                # slices): where the device is a CPU copy (the RAM loop), a larger, colder
                # destination costs it 16-17% (docs/performance.md, fourth pass).
                rows["fio_wide"].append(fio_loops(cache, depth=192)[0] / (1 << 20))
            if "warm" in cases:
                for fn in ((warm, fio, fio_wide) if first else (fio_wide, fio, warm)):
                    fn()

            # 1 KiB samples, warm, against fio on the same chunk files
            if "small" in cases:
                small_cache = os.path.join(caches, f"small-cache-{rnd}")
                read("s3://bench/d1k", "--cache-dir", small_cache, "--seed", str(rnd))
                got = {}

                def small():
                    j = read("s3://bench/d1k", "--cache-dir", small_cache, "--seed", str(rnd),
                             "--epoch", "1", "--epochs", str(WARM_EPOCHS))
                    rows["small_rate"].append(j["samples_per_s"])
                    rows["small_per_cpu"].append(j["samples"] / j["cpu"])
                    rows["small_ttfb"].append(j["first_batch_s"] * 1e3)
                    got["bytes_per_sample"] = j["read_bytes"] / j["samples"]  # from the cache

                def small_fio():
                    got["fio"] = fio_loops(small_cache)[0]
                for fn in ((small, small_fio) if first else (small_fio, small)):
                    fn()
                rows["small_fio"].append(got["fio"] / got["bytes_per_sample"])
                shutil.rmtree(small_cache, ignore_errors=True)

            # 1 KiB objects, cold, against curl with 16 connections
            def objs():
                j = read("s3://bench/o1k", "--no-cache", "--seed", str(rnd))
                rows["objs"].append(j["samples"] / j["seconds"])

            def curl():
                shutil.rmtree(os.path.join(work, "curl-out"), ignore_errors=True)
                os.makedirs(os.path.join(work, "curl-out"))
                s = timed(["curl", "-sf", "--parallel", "--parallel-max", "16", "-K", curl_cfg])
                rows["curl"].append(len(objects) / s)
            if "objects" in cases:
                for fn in ((objs, curl) if first else (curl, objs)):
                    fn()
            shutil.rmtree(cache, ignore_errors=True)
            print(f"  round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items() if v),
                  file=sys.stderr)

        def med(k):
            return statistics.median(rows[k]) if rows[k] else float("nan")

        def ratio(x, y):
            rs = [p / q for p, q in zip(rows[x], rows[y])]
            if not rs:
                return "-", "-"
            return f"{statistics.median(rs):.2f}", f"{min(rs):.2f}-{max(rs):.2f}"
        table = [
            ["epoch 1 (cold), 100 KiB samples", "MiB/s", f"{med('cold'):.0f}", "sluice cp -r",
             f"{med('cp'):.0f}", *ratio("cold", "cp"), "0.9"],
            ["epoch 2 (warm), 100 KiB samples", "MiB/s", f"{med('warm'):.0f}", "fio on the cache",
             f"{med('fio'):.0f}", *ratio("warm", "fio"), "0.9"],
            ["epoch 2 (warm), 100 KiB samples", "MiB/s", f"{med('warm'):.0f}",
             "fio, 192 MiB in flight (1M x 192)", f"{med('fio_wide'):.0f}", *ratio("warm", "fio_wide"),
             "-"],
            ["epoch 2 (warm): CPU s per GiB", "s/GiB", f"{med('warm_cpu'):.3f}", "fio",
             f"{med('fio_cpu'):.3f}", *ratio("warm_cpu", "fio_cpu"), "2.0"],
            ["epoch 2 (warm): bytes read per byte delivered", "x", f"{med('amplification'):.2f}", "-",
             "-", "-", "-", "1.05"],
            ["1 KiB samples, warm", "samples/s", f"{med('small_rate'):.0f}",
             "fio on the cache, in samples/s", f"{med('small_fio'):.0f}",
             *ratio("small_rate", "small_fio"), "1000000"],
            ["1 KiB samples, warm: per CPU second", "samples", f"{med('small_per_cpu'):.0f}", "-",
             "-", "-", "-", "1000000"],
            ["1 KiB samples, warm: first sample", "ms", f"{med('small_ttfb'):.1f}", "-", "-", "-", "-",
             "-"],
            ["1 KiB objects, cold", "objects/s", f"{med('objs'):.0f}", "curl, 16 connections",
             f"{med('curl'):.0f}", *ratio("objs", "curl"), "0.9"],
        ]
        table = [row for row in table if row[2] != "nan"]  # the cases not run
        print(f"s3rver on loopback, caches on {a.cache_on}, {a.rounds} rounds, medians; "
              "ratio = sluice / anchor per round")
        print_table(["case", "unit", "sluice", "anchor", "anchor value", "ratio", "range", "target"],
                    table, a.markdown)
    finally:
        s3.close()
        if loop:
            loop.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
