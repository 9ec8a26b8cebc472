#!/usr/bin/python3
"""Fan-out through peer daemons: N sluiced on loopback (one cache directory and HTTP port
each) share one object from s3rver; one `sluice cat --cache` per daemon reads it at once.
Prints, for each N, the bytes the daemons read from the backing store over the object's
size (target <= 1.05), the bytes that came from peers, and the wall time of the slowest
reader. A count, not a timing: it does not depend on the machine's noise.

Case peer: a fetch-only daemon reads --size from the daemon that owns every chunk (held on
its NVMe, sent with sendfile) through to a reader on its node, against iperf3 on loopback
(target >= 0.8) and against fio writing as much to the same disk (the fetching daemon keeps
every chunk it fetches on NVMe), interleaved, --rounds rounds, median ratios. With
--asker-ram SIZE the fetching daemon has a RAM tier of that size (default none): the chunks
it fetches land there, and its NVMe writes follow behind. CPU seconds per GiB fetched: both
daemons and the reader, from /proc and the children's rusage.

    bench/peers_compare.py [--size 256M] [--daemons 2,4,8] [--cases fanout,peer]
                           [--asker-ram 0] [--rounds 5] [--markdown]
"""
import argparse
import hashlib
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
from s3_harness import S3rver, find_s3rver, free_port  # noqa: E402
import sluiced_harness  # noqa: E402

BIN = os.path.dirname(os.path.abspath(SLUICE_DEFAULT))


def env(work):
    e = dict(os.environ, SLUICE_HOME=os.path.join(work, "home"), AWS_ACCESS_KEY_ID="S3RVER",
             AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return e


def fan_out(work, endpoint, n, size, digest):
    d = tempfile.mkdtemp(prefix=f"fan{n}-", dir=work)
    names = [f"n{i}" for i in range(n)]
    daemons, socks, _ = start_daemons(d, work, endpoint, names, size)
    try:
        t0 = time.perf_counter()
        readers = [subprocess.Popen([f"{BIN}/sluice", "cat", "--cache", "--daemon", sock, "s3://test/bench/fan"],
                                    env=env(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for sock in socks]
        for r in readers:
            out, err = r.communicate()
            if r.returncode != 0 or hashlib.sha256(out).hexdigest() != digest:
                sys.exit(f"peers_compare: a reader failed: {err.decode()[-2000:]}")
        wall = time.perf_counter() - t0
        stats = [stat(work, sock) for sock in socks]
        backing = sum(st["bytes_from"]["backing"] for st in stats)
        peer = sum(st["bytes_from"]["peer"] for st in stats)
        errors = sum(x["errors"] for st in stats for x in st["peers"])
        return backing / size, peer / size, errors, wall
    finally:
        stop_daemons(daemons)
        shutil.rmtree(d, ignore_errors=True)


def start_daemons(d, work, endpoint, names, size, fetch_only=(), ram=None):
    """Daemons named `names` on loopback with one peers file; returns (daemons, socks, ports).
    `ram`: {name: RAM tier bytes} (default none), waited for until it is touched."""
    ram = ram or {}
    ports = [free_port() for _ in names]
    with open(os.path.join(d, "peers"), "w") as f:
        f.writelines(f"{n} 127.0.0.1:{p}{' fetch-only' if n in fetch_only else ''}\n" for n, p in zip(names, ports))
    secret = os.path.join(d, "secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("bench-secret-0123456789\n")
    daemons = []
    try:
        for n, p in zip(names, ports):
            daemons.append(sluiced_harness.Sluiced(
                f"{BIN}/sluiced", os.path.join(d, f"{n}.sock"), os.path.join(d, f"c-{n}"),
                ["--cache-ram", f"{ram.get(n, 0) >> 20}M", "--cache-size",
                 f"{2 * size >> 20}M", "--endpoint-url",
                 endpoint, "--peer-listen", f"127.0.0.1:{p}", "--peers", os.path.join(d, "peers"),
                 "--node-name", n, "--node-secret-file", secret],
                env=env(work), log=os.path.join(d, f"{n}.log")))
            if ram.get(n):
                daemons[-1].wait_for("RAM tier ready")
    except Exception:
        stop_daemons(daemons)
        raise
    return daemons, [x.socket for x in daemons], ports


def stop_daemons(daemons):
    for x in daemons:
        x.stop(timeout=60)


def stat(work, sock):
    p = subprocess.run([f"{BIN}/sluice", "cache", "stat", "--daemon", sock, "--json"], capture_output=True,
                       env=env(work))
    return json.loads(p.stdout)


def settle(work, sock):
    """Waits until a daemon's NVMe tier stops growing (its writes behind a RAM tier)."""
    last = None
    for _ in range(600):
        n = stat(work, sock)["nvme"]["chunks"]
        if n == last:
            return
        last = n
        time.sleep(0.1)


def peer_case(work, endpoint, size, rounds, rows, asker_ram=0):
    """1 GiB (--size) fetched by a fetch-only daemon from the daemon that owns every chunk
    and holds it on NVMe (sendfile), through to a reader on the fetching node, against
    iperf3 on loopback; the fetcher's cache is evicted before each round."""
    d = tempfile.mkdtemp(prefix="peer-", dir=work)
    daemons, socks, _ = start_daemons(d, work, endpoint, ["owner", "asker"], size, fetch_only=("asker",),
                                      ram={"asker": asker_ram})
    cpu = {"sluiced": [], "warm": [], "iperf3": []}  # CPU s/GiB per round
    iperf_port = free_port()
    iperf_server = None
    try:  # the daemons are stopped whatever fails from here on
        iperf_server = subprocess.Popen(["iperf3", "-s", "-p", str(iperf_port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cat = [f"{BIN}/sluice", "cat", "--cache", "--daemon"]
        subprocess.run(cat + [socks[0], "s3://test/bench/fan"], check=True, env=env(work),
                       stdout=subprocess.DEVNULL)
        chunks = (size + (4 << 20) - 1) // (4 << 20)
        for _ in range(600):
            if stat(work, socks[0])["nvme"]["chunks"] >= chunks:
                break
            time.sleep(0.05)
        time.sleep(0.5)

        def via_peer(command=None):
            subprocess.run([f"{BIN}/sluice", "cache", "evict", "s3://test/bench/", "--daemon", socks[1]],
                           check=True, env=env(work), capture_output=True)
            before = stat(work, socks[1])["bytes_from"]
            c0 = sum(process_cpu(x.proc.pid) for x in daemons) + children_cpu()
            t0 = time.perf_counter()
            subprocess.run(command or cat + [socks[1], "s3://test/bench/fan"], check=True, env=env(work),
                           stdout=subprocess.DEVNULL)
            secs = time.perf_counter() - t0
            c1 = children_cpu()
            # Behind a RAM tier the fetching daemon's NVMe writes go on after the read: their
            # CPU is the fetch's, not the next round's.
            settle(work, socks[1])
            c1 += sum(process_cpu(x.proc.pid) for x in daemons)
            cpu["warm" if command else "sluiced"].append((c1 - c0) / (size / (1 << 30)))
            after = stat(work, socks[1])["bytes_from"]
            if after["peer"] - before["peer"] != size or after["backing"] != before["backing"]:
                sys.exit(f"peers_compare: the asker did not fetch everything from its peer: {before} -> {after}")
            return size / secs / (1 << 30)

        def disk_write():
            # What the fetching daemon's disk writes (it keeps every fetched chunk on NVMe):
            # 4 MiB O_DIRECT writes, 4 at once, as its writer lanes do, beside its cache.
            path = os.path.join(d, "fio-write")
            out = subprocess.run(["fio", "--name=anchor", f"--filename={path}", "--size", str(size),
                                  "--bs=4M", "--rw=write", "--direct=1", "--ioengine=io_uring", "--iodepth=4",
                                  "--output-format=json"], capture_output=True, text=True, check=True)
            os.unlink(path)
            return json.loads(out.stdout)["jobs"][0]["write"]["bw_bytes"] / (1 << 30)

        def loopback():
            c0 = process_cpu(iperf_server.pid) + children_cpu()
            out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(iperf_port), "-n", str(size), "-J"],
                                 capture_output=True, text=True)
            cpu["iperf3"].append((process_cpu(iperf_server.pid) + children_cpu() - c0) / (size / (1 << 30)))
            return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8 / (1 << 30)

        res = []
        # Daemon to daemon only: the fetching daemon fills its cache (WARM), no reader.
        warm = [f"{BIN}/sluice", "cache", "warm", "s3://test/bench/fan", "--daemon", socks[1], "--no-progress"]
        for r in range(rounds):
            order = [("sluiced", via_peer), ("iperf3", loopback), ("fio", disk_write),
                     ("warm", lambda: via_peer(warm))]
            got = {k: f() for k, f in (order if r % 2 == 0 else order[::-1])}
            print(f"  peer fetch round {r + 1}: sluiced {got['sluiced']:.3f} GiB/s "
                  f"({cpu['sluiced'][-1]:.3f} CPU s/GiB), daemon to daemon {got['warm']:.3f} "
                  f"({cpu['warm'][-1]:.3f}), iperf3 {got['iperf3']:.3f} ({cpu['iperf3'][-1]:.3f}), "
                  f"fio write {got['fio']:.3f}", file=sys.stderr)
            res.append(got)
        med = statistics.median
        into = f", into a {asker_ram >> 20} MiB RAM tier" if asker_ram else ""
        iperf_cpu = f"{med(cpu['iperf3']):.3f}"
        ratios = [x["sluiced"] / x["iperf3"] for x in res]
        rows.append([f"peer fetch to a reader (NVMe -> sendfile -> HTTP -> cache -> window){into}",
                     f"{size >> 20} MiB", f"{med(x['sluiced'] for x in res):.3f} GiB/s",
                     f"{med(x['iperf3'] for x in res):.3f} GiB/s", "iperf3", f"{med(ratios):.2f}",
                     f"{min(ratios):.2f}-{max(ratios):.2f}", f"{med(cpu['sluiced']):.3f}", iperf_cpu])
        ratios = [x["warm"] / x["iperf3"] for x in res]
        rows.append([f"peer fetch daemon to daemon (cache warm through the fetching daemon){into}",
                     f"{size >> 20} MiB", f"{med(x['warm'] for x in res):.3f} GiB/s",
                     f"{med(x['iperf3'] for x in res):.3f} GiB/s", "iperf3", f"{med(ratios):.2f}",
                     f"{min(ratios):.2f}-{max(ratios):.2f}", f"{med(cpu['warm']):.3f}", iperf_cpu])
        # The fetching daemon writes every byte to its disk: that disk's own write rate is
        # the other ceiling of this chain.
        ratios = [x["warm"] / x["fio"] for x in res]
        rows.append(["daemon to daemon, against the fetching node's disk writes", f"{size >> 20} MiB",
                     f"{med(x['warm'] for x in res):.3f} GiB/s", f"{med(x['fio'] for x in res):.3f} GiB/s",
                     "fio write (4M, O_DIRECT, QD 4)", f"{med(ratios):.2f}", f"{min(ratios):.2f}-{max(ratios):.2f}",
                     "", ""])
        ratios = [x["sluiced"] / x["fio"] for x in res]
        rows.append(["to a reader, against the fetching node's disk writes", f"{size >> 20} MiB",
                     f"{med(x['sluiced'] for x in res):.3f} GiB/s", f"{med(x['fio'] for x in res):.3f} GiB/s",
                     "fio write (4M, O_DIRECT, QD 4)", f"{med(ratios):.2f}", f"{min(ratios):.2f}-{max(ratios):.2f}",
                     "", ""])
    finally:
        if iperf_server:
            iperf_server.terminate()
            iperf_server.wait(10)
        stop_daemons(daemons)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--daemons", default="2,4,8")
    ap.add_argument("--cases", default="fanout,peer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--asker-ram", default="0", help="the fetching daemon's RAM tier (case peer)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not find_s3rver():
        print("SKIP: s3rver not found (make test-tools)", file=sys.stderr)
        return
    missing = [t for t in ("iperf3", "fio") if "peer" in a.cases.split(",") and not shutil.which(t)]
    if missing:
        sys.exit(f"peers_compare: case peer needs {' and '.join(missing)} "
                 "(scripts/install-deps.sh --bench)")
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
        if "peer" in a.cases.split(","):
            peer_rows = []
            peer_case(work, s3.endpoint, size, a.rounds, peer_rows, parse_size(a.asker_ram))
            print_table(["case", "object", "sluiced", "anchor", "anchor tool", "median ratio", "range",
                         "CPU s/GiB", "iperf3 CPU s/GiB"], peer_rows, a.markdown)
        for n in (int(x) for x in a.daemons.split(",") if "fanout" in a.cases.split(",")):
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
