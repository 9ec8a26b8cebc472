#!/usr/bin/python3
"""sluiced against its anchor, interleaved, several rounds, median ratio.

Case (issue 8's first): a warm read through the daemon from another process (`sluice cat
--cache` of a file:// object whose chunks the daemon holds on NVMe, RAM tier off: every
chunk is handed off as a descriptor and read with O_DIRECT by the client) against fio
reading the same chunk files from the daemon's cache directory (O_DIRECT, io_uring, bs 1M,
iodepth 16). Target >= 0.9x. Beside it, the same read through the embedded cache (`--daemon
none`, a cache directory of its own), and each side's CPU seconds per GiB (issue 31): the
client's and the daemon's together for sluiced, from rusage and /proc.

Case small: 1000 objects of 4 KiB served warm by the daemon to another process
(sluice_node_bench, 1 and 16 threads): ops/s and p99 latency, beside pread of the same files
from the page cache.

    bench/sluiced_compare.py [--size 1G] [--rounds 5] [--targets disk,ramloop]
                             [--cases warm,small] [--markdown]

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
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
sys.path.insert(0, os.path.dirname(__file__))
from benchlib import SLUICE_DEFAULT, children_cpu, parse_size, print_table, process_cpu  # noqa: E402
from cache_compare import fio, interleaved, summarize  # noqa: E402
from fio_compare import RamLoop  # noqa: E402

BIN = os.path.dirname(os.path.abspath(SLUICE_DEFAULT))
MIB = 1 << 20


def sluice(*args, env=None):
    p = subprocess.run([f"{BIN}/sluice", *args], capture_output=True, env=env)
    if p.returncode != 0:
        sys.exit(f"sluiced_compare: sluice {' '.join(args[:3])} failed: {p.stderr.decode()[-2000:]}")
    return p.stdout


def warm_case(directory, size, rounds, label, rows):
    data, cache, sock = (os.path.join(directory, n) for n in ("data.bin", "cache", "sluiced.sock"))
    shutil.rmtree(cache, ignore_errors=True)
    with open(data, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    env = dict(os.environ, SLUICE_HOME=os.path.join(directory, "home"))
    daemon = subprocess.Popen([f"{BIN}/sluiced", "--socket", sock, "--cache-dir", cache, "--cache-ram", "0",
                               "--cache-size", f"{2 * size // MIB}M"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        chunks = (size + 4 * MIB - 1) // (4 * MIB)
        sluice("cat", "--cache", "--daemon", sock, data, env=env)
        for _ in range(600):
            st = json.loads(sluice("cache", "stat", "--daemon", sock, "--json", env=env))
            if st["nvme"]["chunks"] >= chunks:
                break
            time.sleep(0.05)

        embedded_cache = os.path.join(directory, "cache-embedded")
        shutil.rmtree(embedded_cache, ignore_errors=True)
        sluice("cat", "--cache", "--daemon", "none", "--cache-dir", embedded_cache, data, env=env)
        cpu = {"sluiced": [], "embedded": [], "fio": []}  # CPU seconds per GiB, per round

        def cat(name, *how):
            # stdout to /dev/null, as fio's reads go nowhere: a pipe into this script would
            # measure Python's reading of the pipe (it did: 0.24x before this change).
            c0, d0 = children_cpu(), process_cpu(daemon.pid)
            t0 = time.perf_counter()
            p = subprocess.run([f"{BIN}/sluice", "cat", "--cache", *how, data], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if p.returncode != 0:
                sys.exit(f"sluiced_compare: sluice cat failed: {p.stderr.decode()[-2000:]}")
            secs = time.perf_counter() - t0
            used = children_cpu() - c0 + (process_cpu(daemon.pid) - d0 if name == "sluiced" else 0)
            cpu[name].append(used / (size / (1 << 30)))
            return size / secs / (1 << 30)

        def anchor():
            c0 = children_cpu()
            got = fio(cache)
            cpu["fio"].append((children_cpu() - c0) / (size / (1 << 30)))
            return got

        print(f"{label}: warm read through sluiced and the embedded cache against fio", file=sys.stderr)
        res = []
        for r in range(rounds):
            pair = [("sluiced", lambda: cat("sluiced", "--daemon", sock)),
                    ("embedded", lambda: cat("embedded", "--daemon", "none", "--cache-dir", embedded_cache)),
                    ("fio", anchor)]
            got = {name: fn() for name, fn in (pair if r % 2 == 0 else pair[::-1])}
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v:.3f} GiB/s {cpu[k][-1]:.3f} s/GiB"
                                                    for k, v in got.items()), file=sys.stderr)
            res.append(got)
        rows.append(summarize(label, "warm read via sluiced (fd hand-off)", "GiB/s", res, "sluiced", "fio"))
        rows.append(summarize(label, "warm read, embedded cache", "GiB/s", res, "embedded", "fio"))
        per_round = [{k: cpu[k][i] for k in cpu} for i in range(rounds)]
        rows.append(summarize(label, "CPU per GiB via sluiced (client + daemon)", "s/GiB", per_round,
                              "sluiced", "fio"))
        rows.append(summarize(label, "CPU per GiB, embedded cache", "s/GiB", per_round, "embedded", "fio"))
        st = json.loads(sluice("cache", "stat", "--daemon", sock, "--json", env=env))
        print(f"  daemon: {st['server']['handoff_chunks']} chunks handed off, "
              f"{st['server']['inline_bytes']} bytes inline, {st['misses']} misses", file=sys.stderr)
    finally:
        daemon.terminate()
        daemon.wait(30)


def small_case(directory, rounds, rows):
    """4 KiB objects served warm by the daemon to another process: ops/s and p99, with 1 and
    16 client threads, beside pread of the same files from the page cache (the floor)."""
    objs = os.path.join(directory, "small")
    os.makedirs(objs)
    n = 1000
    for i in range(n):
        with open(os.path.join(objs, f"obj-{i:06d}"), "wb") as f:
            f.write(os.urandom(4096))
    cache, sock = os.path.join(directory, "cache-small"), os.path.join(directory, "small.sock")
    env = dict(os.environ, SLUICE_HOME=os.path.join(directory, "home"))
    daemon = subprocess.Popen([f"{BIN}/sluiced", "--socket", sock, "--cache-dir", cache, "--cache-ram", "256M"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)

        def bench(threads, via_daemon, secs=2):
            args = [f"{BIN}/sluice_node_bench", "--keys", str(n), "--threads", str(threads), "--seconds", str(secs)]
            args += ["--socket", sock, "--root", f"file://{objs}"] if via_daemon else ["--local", objs]
            p = subprocess.run(args, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                sys.exit(f"sluiced_compare: node_bench failed: {p.stderr[-2000:]}")
            return json.loads(p.stdout)

        bench(4, True, 3)  # warm: every object read at least once (in RAM and on NVMe)
        for threads in (1, 16):
            res = []
            for r in range(rounds):
                order = [True, False] if r % 2 == 0 else [False, True]
                got = {v: bench(threads, v) for v in order}
                print(f"  4 KiB, {threads} threads, round {r + 1}: sluiced {got[True]['ops_per_s']:.0f} ops/s "
                      f"p99 {got[True]['p99_us']:.0f} us; pread {got[False]['ops_per_s']:.0f} ops/s "
                      f"p99 {got[False]['p99_us']:.0f} us", file=sys.stderr)
                res.append(got)
            med = statistics.median
            rows.append(["4 KiB objects, warm", f"{threads} threads", "ops/s",
                         f"{med(x[True]['ops_per_s'] for x in res):.0f}",
                         f"{med(x[False]['ops_per_s'] for x in res):.0f}", "pread (page cache)",
                         f"{med(x[True]['ops_per_s'] / x[False]['ops_per_s'] for x in res):.2f}",
                         f"p99 {med(x[True]['p99_us'] for x in res):.0f} us vs "
                         f"{med(x[False]['p99_us'] for x in res):.0f} us"])
    finally:
        daemon.terminate()
        daemon.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--targets", default="disk,ramloop")
    ap.add_argument("--cases", default="warm,small", help="warm (fd hand-off vs fio), small (4 KiB objects)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    cases = a.cases.split(",")
    size = parse_size(a.size)
    rows = []
    for target in a.targets.split(","):
        if target == "disk":
            d = tempfile.mkdtemp(prefix="sluiced-bench-", dir="/var/tmp")
            try:
                if "warm" in cases:
                    warm_case(d, size, a.rounds, "disk (/var/tmp)", rows)
                if "small" in cases:
                    small_case(d, a.rounds, rows)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        elif target == "ramloop":
            if os.geteuid() != 0:
                print("SKIP ramloop: needs root (losetup, mount)", file=sys.stderr)
                continue
            if "warm" not in cases:
                continue
            loop = RamLoop(size * 3)  # the data file, the cache and ext4 overhead: 2x was full
            try:
                warm_case(loop.mount, size, a.rounds, "RAM-backed loop (ext4)", rows)
            finally:
                loop.close()
    header = ["target", "case", "unit", "sluice", "anchor", "anchor tool", "median ratio", "range"]
    print_table(header, rows, a.markdown)


if __name__ == "__main__":
    main()
