#!/usr/bin/python3
"""What charging costs a copy to an object store: `sluice cp -r` of many small files into an
s3rver bucket, under a project (charged: a reservation, a publish lock, a fresh HEAD and a
charge per object, docs/ledger.md) and outside every project (uncharged), same files, same
server, same run.

    bench/charging_compare.py [--rounds 5] [--files 200] [--size 16K] [--markdown]

Each round copies once into each prefix, in turn (interleaved, so the machine's noise falls
on both alike), each time into a fresh destination; the table gives medians over the rounds
and the charged/uncharged ratio of objects per second. The ledger is the embedded SQLite one.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from benchlib import parse_size, print_table  # noqa: E402
from s3_harness import S3rver, find_s3rver  # noqa: E402

SLUICE = os.path.join(HERE, "..", "build", "bin", "sluice")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--size", default="16K")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not find_s3rver():
        sys.exit("charging_compare: s3rver is not installed (scripts/install-test-tools.sh)")
    work = tempfile.mkdtemp(prefix="sluice-charging-")
    s3 = S3rver(buckets=("charging",))
    try:
        env = dict(os.environ, SLUICE_HOME=os.path.join(work, "home"), AWS_ACCESS_KEY_ID="S3RVER",
                   AWS_SECRET_ACCESS_KEY="S3RVER")
        env.pop("SLUICE_LEDGER", None)

        def sluice(*args):
            r = subprocess.run([SLUICE, *args], env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"sluice {' '.join(args)}: {r.stderr}")
            return r

        sluice("team", "add", "bench")
        sluice("project", "add", "bench-p", "--team", "bench", "--location", "s3://charging/charged")
        src = os.path.join(work, "src")
        os.makedirs(src)
        size = parse_size(a.size)
        for i in range(a.files):
            with open(os.path.join(src, f"f{i:05d}"), "wb") as f:
                f.write(os.urandom(size))
        rates = {"charged": [], "uncharged": []}
        for r in range(a.rounds):
            for case in ("charged", "uncharged"):
                t0 = time.monotonic()
                sluice("cp", "-r", "--no-progress", src + "/", f"s3://charging/{case}/r{r}/",
                       "--endpoint-url", s3.endpoint)
                rates[case].append(a.files / (time.monotonic() - t0))
        med = {k: statistics.median(v) for k, v in rates.items()}
        rows = [[k, f"{med[k]:.0f}", " ".join(f"{x:.0f}" for x in rates[k])] for k in ("uncharged", "charged")]
        rows.append(["charged / uncharged", f"{med['charged'] / med['uncharged']:.2f}",
                     " ".join(f"{c / u:.2f}" for c, u in zip(rates["charged"], rates["uncharged"]))])
        print(f"sluice cp -r of {a.files} x {a.size} files to s3rver, {a.rounds} rounds (objects/s)")
        print_table(["case", "median", "rounds"], rows, a.markdown)
    finally:
        s3.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
