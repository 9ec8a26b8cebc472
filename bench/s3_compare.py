#!/usr/bin/python3
"""sluice cp against rclone, aws s3 cp and curl, on real S3 servers on loopback, interleaved.

Cases:
  - download and upload of one large object (default 1 GiB);
  - download of many small objects (default 1000 x 64 KiB): sluice cp --recursive,
    rclone copy --transfers 16, aws s3 cp --recursive, and one curl with 16 parallel
    connections (s3rver only: curl cannot sign requests for RGW).
curl is a server's own ceiling for one stream (and, with 16 connections, for small GETs).

    bench/s3_compare.py [--servers s3rver,rgw] [--size 1G] [--small 1000] [--rounds 5]
                        [--sluice-args "--part-size 32M"] [--markdown]

Servers: s3rver (make test installs it into .cache/npm) and Ceph RGW (scripts/
install-test-tools.sh installs it; tests/integration/rgw_harness.py starts it). Tools:
rclone, awscli and curl (make bench installs them). Each round runs the tools in a rotated
order; the table shows medians of MiB/s (objects/s for the small case) and the median of
the per-round ratios of sluice to each tool.
"""
import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from s3_harness import S3rver, find_s3rver  # noqa: E402
from rgw_harness import Rgw, find_rgw  # noqa: E402
from benchlib import SLUICE_DEFAULT, parse_size, print_table  # noqa: E402

MIB = 1 << 20
TOOLS = ("sluice", "rclone", "aws", "curl")


class Target:
    def __init__(self, name, endpoint, access_key, secret_key, close, anonymous_get):
        self.name, self.endpoint = name, endpoint
        self.access_key, self.secret_key = access_key, secret_key
        self.close = close
        self.anonymous_get = anonymous_get  # curl can GET without signing

    def env(self):
        e = dict(os.environ, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key,
                 AWS_DEFAULT_REGION="us-east-1", AWS_PAGER="")
        e.pop("AWS_PROFILE", None)
        # rclone, configured without a file; it fails while AWS_CA_BUNDLE is set.
        e.pop("AWS_CA_BUNDLE", None)
        e.update(RCLONE_CONFIG_BENCH_TYPE="s3", RCLONE_CONFIG_BENCH_PROVIDER="Other",
                 RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=self.access_key,
                 RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=self.secret_key,
                 RCLONE_CONFIG_BENCH_ENDPOINT=self.endpoint, RCLONE_CONFIG_BENCH_REGION="us-east-1")
        return e


def start(name):
    if name == "s3rver":
        if not find_s3rver():
            return None, "s3rver not installed"
        s = S3rver(buckets=("bench",))
        return Target("s3rver", s.endpoint, "S3RVER", "S3RVER", s.close, True), None
    why = find_rgw()
    if why:
        return None, why
    r = Rgw(buckets=("bench",), memstore_bytes=12 << 30)
    return Target("rgw", r.endpoint, r.access_key, r.secret_key, r.close, False), None


def timed(cmd, env, **kw):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"s3_compare: {' '.join(cmd[:6])}... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return dt


def run_server(t, a, sluice, aws, work):
    env = t.env()
    ep = t.endpoint
    extra = shlex.split(a.sluice_args)
    size = parse_size(a.size)
    big = os.path.join(work, "big.bin")
    if not os.path.exists(big):
        with open(big, "wb") as f:
            for _ in range(0, size, 64 * MIB):
                f.write(os.urandom(min(64 * MIB, size - f.tell())))
    small_dir = os.path.join(work, "small")
    if not os.path.exists(small_dir):
        os.makedirs(small_dir)
        for i in range(a.small):
            with open(os.path.join(small_dir, f"obj-{i:05d}"), "wb") as f:
                f.write(os.urandom(64 * 1024))
    timed([sluice, "cp", big, "s3://bench/big.bin", "--endpoint-url", ep], env)
    timed([sluice, "cp", "-r", small_dir, "s3://bench/small", "--endpoint-url", ep], env)
    out_dir = os.path.join(work, "out")
    out_big = os.path.join(work, "big.out")
    curl_cfg = os.path.join(work, "curl.cfg")
    with open(curl_cfg, "w") as f:
        for i in range(a.small):
            f.write(f'url = "{ep}/bench/small/obj-{i:05d}"\noutput = "{out_dir}/obj-{i:05d}"\n')

    def fresh_out():
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)

    def fresh_big():  # rclone skips a destination that already matches
        if os.path.exists(out_big):
            os.remove(out_big)

    mib = size / MIB
    n = [0]

    def key(tool):  # a fresh key per upload: rclone skips a matching object
        n[0] += 1
        return f"s3://bench/up/{tool}-{n[0]}"

    def upload(tool, cmd_for):
        k = key(tool)
        rate = mib / timed(cmd_for(k), env)
        # Not timed: the object goes, so RGW's in-memory OSD does not fill up.
        timed([aws, "s3", "rm", k, "--endpoint-url", ep, "--only-show-errors"], env)
        return rate

    cases = {
        "download large": {
            "sluice": lambda: (fresh_big(), mib / timed([sluice, "cp", "s3://bench/big.bin", out_big,
                                                         "--endpoint-url", ep, *extra], env))[1],
            "rclone": lambda: (fresh_big(), mib / timed(["rclone", "copyto", "bench:bench/big.bin", out_big],
                                                        env))[1],
            "aws": lambda: (fresh_big(), mib / timed([aws, "s3", "cp", "s3://bench/big.bin", out_big,
                                                      "--endpoint-url", ep, "--only-show-errors"], env))[1],
            "curl": lambda: (fresh_big(), mib / timed(["curl", "-sf", "-o", out_big, f"{ep}/bench/big.bin"],
                                                      env))[1],
        },
        "upload large": {
            "sluice": lambda: upload("sluice", lambda k: [sluice, "cp", big, k, "--endpoint-url", ep, *extra]),
            "rclone": lambda: upload("rclone", lambda k: ["rclone", "copyto", big, "bench:" + k[5:]]),
            "aws": lambda: upload("aws", lambda k: [aws, "s3", "cp", big, k, "--endpoint-url", ep,
                                                    "--only-show-errors"]),
            "curl": lambda: upload("curl", lambda k: ["curl", "-sf", "-T", big, f"{ep}/{k[5:]}"]),
        },
        "download small": {
            "sluice": lambda: (fresh_out(), a.small / timed([sluice, "cp", "-r", "s3://bench/small/", out_dir,
                                                             "--endpoint-url", ep, *extra], env))[1],
            "rclone": lambda: (fresh_out(), a.small / timed(["rclone", "copy", "--transfers", "16",
                                                             "bench:bench/small/", out_dir], env))[1],
            "aws": lambda: (fresh_out(), a.small / timed([aws, "s3", "cp", "--recursive", "s3://bench/small/",
                                                          out_dir, "--endpoint-url", ep, "--only-show-errors"],
                                                         env))[1],
            "curl": lambda: (fresh_out(), a.small / timed(["curl", "-sf", "--parallel", "--parallel-max", "16",
                                                           "-K", curl_cfg], env))[1],
        },
    }
    if not t.anonymous_get:  # curl cannot sign: only s3rver lets it GET and PUT
        for tools in cases.values():
            tools.pop("curl")
    wanted = [c.strip() for c in a.cases.split(",")]
    cases = {c: tools for c, tools in cases.items() if c in wanted}
    results = {}
    for r in range(a.rounds):
        for case, tools in cases.items():
            order = list(tools)
            order = order[r % len(order):] + order[:r % len(order)]
            for tool in order:
                rate = tools[tool]()
                results.setdefault(case, {}).setdefault(tool, []).append(rate)
                print(f"  {t.name} round {r + 1} {case:15s} {tool:6s} {rate:9.1f}", file=sys.stderr, flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default=SLUICE_DEFAULT)
    ap.add_argument("--servers", default="s3rver,rgw")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--small", type=int, default=1000, help="number of 64 KiB objects")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sluice-args", default="", help="extra arguments for sluice cp")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--cases", default="download large,upload large,download small",
                    help="comma-separated subset of the cases")
    a = ap.parse_args()
    aws = "/usr/bin/aws" if os.path.exists("/usr/bin/aws") else shutil.which("aws")  # Debian's awscli
    for tool in (aws, "curl", "rclone"):
        if not tool or not shutil.which(tool):
            sys.exit(f"s3_compare: {tool} not found (make bench installs awscli, curl and rclone)")
    sluice = os.path.abspath(a.sluice)
    work = tempfile.mkdtemp(prefix="sluice-s3bench-", dir="/var/tmp")
    rows = []
    try:
        for name in [s.strip() for s in a.servers.split(",")]:
            target, why = start(name)
            if not target:
                print(f"s3_compare: SKIP {name}: {why}", file=sys.stderr)
                continue
            try:
                results = run_server(target, a, sluice, aws, work)
            finally:
                target.close()
            for case, tools in results.items():
                unit = "objects/s" if "small" in case else "MiB/s"
                med = {t: statistics.median(v) for t, v in tools.items()}
                row = [name, case, unit] + [f"{med[t]:.1f}" if t in med else "-" for t in TOOLS]
                for t in TOOLS[1:]:
                    row.append(f"{statistics.median(s / o for s, o in zip(tools['sluice'], tools[t])):.2f}"
                               if t in tools else "-")
                rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hdr = ["server", "case", "unit", *TOOLS, "sluice/rclone", "sluice/aws", "sluice/curl"]
    print_table(hdr, rows, a.markdown)
    print(f"\nmedians of {a.rounds} interleaved rounds; ratios are medians of per-round ratios"
          + (f"; sluice cp {a.sluice_args}" if a.sluice_args else ""))


if __name__ == "__main__":
    main()
