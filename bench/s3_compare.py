#!/usr/bin/python3
"""sluice cp against aws s3 cp and curl, on one s3rver on loopback, interleaved.

Cases (issue 3):
  - download and upload of one large object (default 1 GiB);
  - download of many small objects (default 1000 x 64 KiB): sluice cp --recursive,
    aws s3 cp --recursive, and one curl with 16 parallel connections.
curl is the server's own ceiling: s3rver is single-threaded and burns a core on GETs.

    bench/s3_compare.py [--size 1G] [--small 1000] [--rounds 5] [--markdown]

Needs s3rver (make test installs it into .cache/npm), awscli and curl (make bench
installs them). Each round runs the tools in a rotated order; the table shows medians of
MiB/s (objects/s for the small case) and the median of the per-round ratios.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from s3_harness import S3rver  # noqa: E402
from benchlib import SLUICE_DEFAULT, parse_size, print_table  # noqa: E402

MIB = 1 << 20


def env():
    e = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
             AWS_DEFAULT_REGION="us-east-1", AWS_PAGER="")
    e.pop("AWS_PROFILE", None)
    return e


def timed(cmd, **kw):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), **kw)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"s3_compare: {' '.join(cmd[:6])}... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default=SLUICE_DEFAULT)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--small", type=int, default=1000, help="number of 64 KiB objects")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--cases", default="download large,upload large,download small",
                    help="comma-separated subset of the cases")
    a = ap.parse_args()
    aws = "/usr/bin/aws" if os.path.exists("/usr/bin/aws") else shutil.which("aws")  # Debian's awscli
    for tool in (aws, "curl"):
        if not tool or not shutil.which(tool):
            sys.exit(f"s3_compare: {tool} not found (make bench installs awscli and curl)")
    size = parse_size(a.size)
    sluice = os.path.abspath(a.sluice)
    work = tempfile.mkdtemp(prefix="sluice-s3bench-", dir="/var/tmp")
    s3 = S3rver(buckets=("bench",))
    ep = s3.endpoint
    results = {}  # case -> tool -> [rate]
    try:
        big = os.path.join(work, "big.bin")
        with open(big, "wb") as f:
            for _ in range(0, size, 64 * MIB):
                f.write(os.urandom(min(64 * MIB, size - f.tell())))
        small_dir = os.path.join(work, "small")
        os.makedirs(small_dir)
        for i in range(a.small):
            with open(os.path.join(small_dir, f"obj-{i:05d}"), "wb") as f:
                f.write(os.urandom(64 * 1024))
        timed([sluice, "cp", big, "s3://bench/big.bin", "--endpoint-url", ep])
        timed([sluice, "cp", "-r", small_dir, "s3://bench/small", "--endpoint-url", ep])
        curl_cfg = os.path.join(work, "curl.cfg")
        out_dir = os.path.join(work, "out")

        def fresh_out():
            shutil.rmtree(out_dir, ignore_errors=True)
            os.makedirs(out_dir)

        with open(curl_cfg, "w") as f:
            for i in range(a.small):
                f.write(f'url = "{ep}/bench/small/obj-{i:05d}"\noutput = "{out_dir}/obj-{i:05d}"\n')
        out_big = os.path.join(work, "big.out")
        mib = size / MIB
        cases = {
            "download large": {
                "sluice": lambda: mib / timed([sluice, "cp", "s3://bench/big.bin", out_big, "--endpoint-url", ep]),
                "aws": lambda: mib / timed([aws, "s3", "cp", "s3://bench/big.bin", out_big, "--endpoint-url", ep,
                                            "--only-show-errors"]),
                "curl": lambda: mib / timed(["curl", "-sf", "-o", out_big, f"{ep}/bench/big.bin"]),
            },
            "upload large": {
                "sluice": lambda: mib / timed([sluice, "cp", big, "s3://bench/up-sluice", "--endpoint-url", ep]),
                "aws": lambda: mib / timed([aws, "s3", "cp", big, "s3://bench/up-aws", "--endpoint-url", ep,
                                            "--only-show-errors"]),
                "curl": lambda: mib / timed(["curl", "-sf", "-T", big, f"{ep}/bench/up-curl"]),
            },
            "download small": {
                "sluice": lambda: (fresh_out(), a.small / timed([sluice, "cp", "-r", "s3://bench/small/", out_dir,
                                                                 "--endpoint-url", ep]))[1],
                "aws": lambda: (fresh_out(), a.small / timed([aws, "s3", "cp", "--recursive", "s3://bench/small/",
                                                              out_dir, "--endpoint-url", ep, "--only-show-errors"]))[1],
                "curl": lambda: (fresh_out(), a.small / timed(["curl", "-sf", "--parallel", "--parallel-max", "16",
                                                               "-K", curl_cfg]))[1],
            },
        }
        wanted = [c.strip() for c in a.cases.split(",")]
        cases = {c: t for c, t in cases.items() if c in wanted}
        for r in range(a.rounds):
            for case, tools in cases.items():
                order = list(tools)
                order = order[r % 3:] + order[:r % 3]
                for tool in order:
                    rate = tools[tool]()
                    results.setdefault(case, {}).setdefault(tool, []).append(rate)
                    print(f"  round {r + 1} {case:15s} {tool:6s} {rate:9.1f}", file=sys.stderr, flush=True)
    finally:
        s3.close()
        shutil.rmtree(work, ignore_errors=True)

    hdr = ["case", "unit", "sluice", "aws", "curl", "sluice/aws", "sluice/curl"]
    rows = []
    for case, tools in results.items():
        unit = "objects/s" if "small" in case else "MiB/s"
        med = {t: statistics.median(v) for t, v in tools.items()}
        ratio = {t: statistics.median(s / o for s, o in zip(tools["sluice"], tools[t])) for t in ("aws", "curl")}
        rows.append([case, unit, f"{med['sluice']:.1f}", f"{med['aws']:.1f}", f"{med['curl']:.1f}",
                     f"{ratio['aws']:.2f}", f"{ratio['curl']:.2f}"])
    print_table(hdr, rows, a.markdown)
    print(f"\nmedians of {a.rounds} interleaved rounds; ratios are medians of per-round ratios")


if __name__ == "__main__":
    main()
