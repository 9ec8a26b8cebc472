#!/usr/bin/python3
"""sluice doctor's ceiling against fio's best over the same grid, interleaved, several rounds.

Each round runs `sluice doctor --path TARGET --json` (its sweep: sequential O_DIRECT reads
through io_uring at 4K/64K/1M x QD1/4/16/64, plus one thread-pool and one buffered point) and
fio over the same io_uring grid with the same time per point, alternating which goes first.
It prints each round's two ceilings and the median ratio doctor/fio; the issue asks for the
ceiling within 10% of fio's best (a ratio from 0.9 to 1.1).

    bench/doctor_compare.py                       # a 1 GiB RAM-backed loop device (needs root)
    bench/doctor_compare.py --target /dev/vdb --rounds 5
    bench/doctor_compare.py --markdown            # a table for docs/performance.md

Only reads are made on a given target. Standard library only: Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchlib import SLUICE_DEFAULT, print_table

GIB = 1 << 30
GRID = [(bs, qd) for bs in ("4k", "64k", "1m") for qd in (1, 4, 16, 64)]
POINTS = len(GRID) + 2  # the doctor's grid plus its thread-pool and buffered points


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"doctor_compare: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def doctor_once(sluice, target, budget):
    c = json.loads(run([sluice, "doctor", "--path", target, "--seconds", str(budget), "--json"]))["ceiling"]
    uring = [p for p in c["points"] if p["engine"] == "uring"]
    best = max(uring, key=lambda p: p["bytes_s"])
    return best["bytes_s"] / GIB, f"{best['bs'] >> 10}K QD{best['qd']}"


def fio_once(target, per_point):
    best, where = 0.0, ""
    for bs, qd in GRID:
        out = run(["fio", "--name=anchor", f"--filename={target}", "--readonly", "--rw=read",
                   f"--bs={bs}", f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1",
                   f"--runtime={per_point}", "--time_based", "--output-format=json"])
        j = json.loads(out[out.index("{"):])
        bw = j["jobs"][0]["read"]["bw_bytes"] / GIB
        if bw > best:
            best, where = bw, f"{bs.upper()} QD{qd}"
    return best, where


def ram_loop(size):
    img = tempfile.mktemp(prefix="sluice-doctor-bench-", dir="/dev/shm")
    with open(img, "wb") as f:
        for _ in range(size // (1 << 20)):
            f.write(os.urandom(1 << 20))
    dev = run(["losetup", "-f", "--show", img]).strip()
    return dev, img


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", default=SLUICE_DEFAULT)
    ap.add_argument("--target", help="a device or file to read (default: a RAM-backed loop device)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=14, help="the doctor's sweep budget")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    target, img = a.target, None
    if not target:
        if os.geteuid() != 0:
            sys.exit("doctor_compare: a RAM-backed loop device needs root; give --target")
        target, img = ram_loop(GIB)
    per_point = max(0.25, a.seconds / POINTS)
    rows, ratios = [], []
    try:
        for r in range(a.rounds):
            if r % 2 == 0:
                d, dw = doctor_once(a.sluice, target, a.seconds)
                f, fw = fio_once(target, per_point)
            else:
                f, fw = fio_once(target, per_point)
                d, dw = doctor_once(a.sluice, target, a.seconds)
            ratios.append(d / f)
            rows.append([str(r + 1), f"{d:.2f} GiB/s at {dw}", f"{f:.2f} GiB/s at {fw}", f"{d / f:.2f}"])
    finally:
        if img:
            subprocess.run(["losetup", "-d", target])
            os.unlink(img)
    print_table(["round", "sluice doctor ceiling", "fio best over the grid", "doctor/fio"], rows, a.markdown)
    med = statistics.median(ratios)
    print(f"\nmedian ceiling ratio doctor/fio: {med:.2f} over {a.rounds} rounds "
          f"({per_point:.2f} s per point){'' if 0.9 <= med <= 1.1 else '  (outside 0.9-1.1)'}")


if __name__ == "__main__":
    main()
