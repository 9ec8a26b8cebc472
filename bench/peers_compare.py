#!/usr/bin/python3
"""Fan-out through peer daemons: N sluiced on loopback (one cache directory and HTTP port
each) share one object from s3rver; one `sluice cat --cache` per daemon reads it at once.
Prints, for each N, the bytes the daemons read from the backing store over the object's
size (target <= 1.05), the bytes that came from peers, and the wall time of the slowest
reader. A count, not a timing: it does not depend on the machine's noise.

    bench/peers_compare.py [--size 256M] [--daemons 2,4,8] [--markdown]
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
sys.path.insert(0, os.path.dirname(__file__))
from benchlib import SLUICE_DEFAULT, parse_size, print_table  # noqa: E402
from s3_harness import S3rver, find_s3rver, free_port  # noqa: E402

BIN = os.path.dirname(os.path.abspath(SLUICE_DEFAULT))


def env(work):
    e = dict(os.environ, SLUICE_HOME=os.path.join(work, "home"), AWS_ACCESS_KEY_ID="S3RVER",
             AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return e


def fan_out(work, endpoint, n, size, digest):
    d = tempfile.mkdtemp(prefix=f"fan{n}-", dir=work)
    ports = [free_port() for _ in range(n)]
    with open(os.path.join(d, "peers"), "w") as f:
        f.writelines(f"n{i} 127.0.0.1:{p}\n" for i, p in enumerate(ports))
    secret = os.path.join(d, "secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("bench-secret-0123456789\n")
    procs = []
    try:
        for i in range(n):
            procs.append(subprocess.Popen(
                [f"{BIN}/sluiced", "--socket", os.path.join(d, f"n{i}.sock"), "--cache-dir",
                 os.path.join(d, f"c{i}"), "--cache-ram", "0", "--cache-size", f"{2 * size >> 20}M",
                 "--endpoint-url", endpoint, "--peer-listen", f"127.0.0.1:{ports[i]}",
                 "--peers", os.path.join(d, "peers"), "--node-name", f"n{i}", "--node-secret-file", secret],
                env=env(work), stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, f"n{i}.log"), "wb")))
        for i in range(n):
            for _ in range(400):
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(os.path.join(d, f"n{i}.sock"))
                    break
                except OSError:
                    time.sleep(0.05)
        t0 = time.perf_counter()
        readers = [subprocess.Popen([f"{BIN}/sluice", "cat", "--cache", "--daemon", os.path.join(d, f"n{i}.sock"),
                                     "s3://test/bench/fan"], env=env(work), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for i in range(n)]
        for r in readers:
            out, err = r.communicate()
            if r.returncode != 0 or hashlib.sha256(out).hexdigest() != digest:
                sys.exit(f"peers_compare: a reader failed: {err.decode()[-2000:]}")
        wall = time.perf_counter() - t0
        backing = peer = errors = 0
        for i in range(n):
            p = subprocess.run([f"{BIN}/sluice", "cache", "stat", "--daemon", os.path.join(d, f"n{i}.sock"),
                                "--json"], capture_output=True, env=env(work))
            st = json.loads(p.stdout)
            backing += st["bytes_from"]["backing"]
            peer += st["bytes_from"]["peer"]
            errors += sum(x["errors"] for x in st["peers"])
        return backing / size, peer / size, errors, wall
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--daemons", default="2,4,8")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not find_s3rver():
        print("SKIP: s3rver not found (make test-tools)", file=sys.stderr)
        return
    size = parse_size(a.size)
    work = tempfile.mkdtemp(prefix="sluice-peers-bench-", dir="/var/tmp")
    s3 = S3rver(buckets=("test",))
    try:
        src = os.path.join(work, "fan.bin")
        h = hashlib.sha256()
        with open(src, "wb") as f:
            for _ in range(size >> 20):
                b = os.urandom(1 << 20)
                h.update(b)
                f.write(b)
        subprocess.run([f"{BIN}/sluice", "cp", src, "s3://test/bench/fan", "--endpoint-url", s3.endpoint],
                       check=True, env=env(work), capture_output=True)
        rows = []
        for n in (int(x) for x in a.daemons.split(",")):
            ratio, from_peers, errors, wall = fan_out(work, s3.endpoint, n, size, h.hexdigest())
            print(f"  {n} daemons: backing {ratio:.3f}x, peers {from_peers:.2f}x, {errors} peer errors, "
                  f"{wall:.2f} s", file=sys.stderr)
            rows.append([str(n), a.size, f"{ratio:.3f}", f"{from_peers:.2f}", str(errors), f"{wall:.2f}"])
        print_table(["daemons", "object", "backing bytes / object", "peer bytes / object", "peer errors",
                     "slowest reader s"], rows, a.markdown)
    finally:
        s3.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
