#!/usr/bin/python3
"""The ledger's reserve/commit pairs per second, on SQLite and on a real PostgreSQL server,
against pgbench on the same server in the same run.

    bench/ledger_compare.py [--rounds 5] [--seconds 3] [--markdown]

Each round runs every case once, in turn (interleaved, so the machine's noise falls on all
of them alike); the table gives medians over the rounds. The PostgreSQL server is a private
one (tests/integration/pg_harness.py) with fsync on: a commit waits for the disk, as a
real ledger's does.

Cases (W writers charge one team: every pair touches the same account row, the worst case):
  sqlite W=1, W=16              threads sharing one ledger ($SLUICE_HOME's embedded default)
  sqlite W=16 separate          16 ledgers (16 connections: like 16 processes)
  postgresql W=1, W=16, W=64    threads sharing one ledger (its group commit batches them)
  postgresql W=16 separate      16 ledgers, each its own connection: no batching across them
  postgresql W=16 async commit  synchronous_commit=off on the ledger's sessions (see docs/ledger.md)
  pgbench -N, 16 clients        the anchor: PostgreSQL's own TPC-B-like writes (3 updates and an
                                insert per transaction, one fsync per commit) on the same server
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from benchlib import print_table  # noqa: E402
from pg_harness import Postgres, find_bindir  # noqa: E402

BENCH = os.path.join(HERE, "..", "build", "bin", "sluice_ledger_bench")


def run_bench(uri, writers, seconds, separate=False):
    cmd = [BENCH, "--ledger", uri, "--writers", str(writers), "--seconds", str(seconds)]
    if separate:
        cmd.append("--separate")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr}")
    return json.loads(r.stdout)["pairs_per_s"]


def run_pgbench(bindir, pg, seconds):
    r = subprocess.run([os.path.join(bindir, "pgbench"), "-N", "-c", "16", "-j", "2", "-T", str(max(1, round(seconds))),
                        "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "bench"],
                       capture_output=True, text=True, timeout=seconds * 10 + 60)
    if r.returncode != 0:
        raise RuntimeError("pgbench: " + r.stderr)
    for line in r.stdout.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError("pgbench printed no tps: " + r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} not built: run make build")
    bindir = find_bindir()
    work = tempfile.mkdtemp(prefix="sluice-ledger-bench-")
    sqlite = os.path.join(work, "ledger.db")
    with Postgres(durable=True) as pg:
        base = pg.uri.rsplit("/", 1)[0]
        for db in ("ledger", "bench"):
            subprocess.run([os.path.join(bindir, "psql"), pg.uri, "-qc", f"CREATE DATABASE {db}"], check=True,
                           capture_output=True)
        subprocess.run([os.path.join(bindir, "pgbench"), "-i", "-q", "-s", "10", "-h", "127.0.0.1",
                        "-p", str(pg.port), "-U", "postgres", "bench"], check=True, capture_output=True)
        pgl = base + "/ledger"
        cases = [
            ("sqlite", "1 writer", lambda: run_bench(sqlite, 1, args.seconds)),
            ("sqlite", "16 writers", lambda: run_bench(sqlite, 16, args.seconds)),
            ("sqlite", "16 separate", lambda: run_bench(sqlite, 16, args.seconds, True)),
            ("postgresql", "1 writer", lambda: run_bench(pgl, 1, args.seconds)),
            ("postgresql", "16 writers", lambda: run_bench(pgl, 16, args.seconds)),
            ("postgresql", "64 writers", lambda: run_bench(pgl, 64, args.seconds)),
            ("postgresql", "16 separate", lambda: run_bench(pgl, 16, args.seconds, True)),
            ("postgresql", "16 writers, async commit",
             lambda: run_bench(pgl + "?options=-csynchronous_commit%3Doff", 16, args.seconds)),
            ("pgbench -N", "16 clients (tps)", lambda: run_pgbench(bindir, pg, args.seconds)),
        ]
        results = {i: [] for i in range(len(cases))}
        for rnd in range(args.rounds):
            for i, (_, _, fn) in enumerate(cases):
                results[i].append(fn())
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    anchor = statistics.median(results[len(cases) - 1])
    rows = []
    for i, (backend, case, _) in enumerate(cases):
        med = statistics.median(results[i])
        ratio = f"{med / anchor:.2f}" if backend == "postgresql" else "-"
        rows.append([backend, case, f"{med:,.0f}", f"{min(results[i]):,.0f}-{max(results[i]):,.0f}", ratio])
    print_table(["ledger", "case", "pairs/s (median)", "range", "vs pgbench tps"], rows, args.markdown)


if __name__ == "__main__":
    main()
