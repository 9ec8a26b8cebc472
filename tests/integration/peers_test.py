#!/usr/bin/python3
"""Several sluiced on loopback sharing chunks as peers, against a real s3rver: fan-out reads
fetch each byte from S3 about once; a peer killed mid-read costs the reader nothing; wrong
secrets, stale or malformed HTTP requests are refused and leave the daemon up; /metrics
answers in Prometheus text; `sluice cache peers` shows the membership. s3rver missing: SKIP.

    /usr/bin/python3 tests/integration/peers_test.py build/bin/sluice build/bin/sluiced
"""
import hashlib
import hmac
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import Runner, S3rver, find_s3rver, free_port  # noqa: E402

SLUICE = os.path.abspath(sys.argv[1])
SLUICED = os.path.abspath(sys.argv[2])
WORK = tempfile.mkdtemp(prefix="sluice-peers-")
MIB = 1 << 20
SIZE = 48 * MIB + 777  # 49 chunks of 1 MiB
SECRET = "peer-secret-0123456789abcdef"


def env():
    e = dict(os.environ, SLUICE_HOME=os.path.join(WORK, "home"), AWS_ACCESS_KEY_ID="S3RVER",
             AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return e


def sluice(*args, check=True):
    p = subprocess.run([SLUICE, *args], capture_output=True, env=env(), timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {p.returncode}: {p.stderr.decode()}")
    return p


class Job:
    """n daemons named n0..n{n-1}, each with its own socket, cache directory and HTTP port."""

    def __init__(self, endpoint, n, tag, extra=()):
        self.dir = os.path.join(WORK, tag)
        os.makedirs(self.dir)
        self.ports = [free_port() for _ in range(n)]
        self.peers = os.path.join(self.dir, "peers")
        with open(self.peers, "w") as f:
            f.write("# the job's daemons\n")
            for i, p in enumerate(self.ports):
                f.write(f"n{i} 127.0.0.1:{p}\n")
        self.secret = os.path.join(self.dir, "secret")
        with open(os.open(self.secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(SECRET + "\n")
        self.procs, self.logs = [], []
        for i in range(n):
            log = open(os.path.join(self.dir, f"n{i}.log"), "ab")
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                [SLUICED, "--socket", self.sock(i), "--cache-dir", os.path.join(self.dir, f"cache{i}"),
                 "--chunk-size", "1M", "--cache-ram", "0", "--endpoint-url", endpoint,
                 "--peer-listen", f"127.0.0.1:{self.ports[i]}", "--peers", self.peers,
                 "--node-name", f"n{i}", "--node-secret-file", self.secret, "--peer-timeout-ms", "5000",
                 "--objects-dir", self.objects(i), *extra],
                env=env(), stdout=log, stderr=log))
        for i in range(n):
            self.wait_up(i)

    def sock(self, i):
        return os.path.join(self.dir, f"n{i}.sock")

    def objects(self, i):
        return os.path.join(self.dir, f"objects{i}")

    def state(self, size):
        """A checkpoint's files: DIR/state/model.bin of `size` random bytes; returns both."""
        src = os.path.join(self.dir, "state")
        os.makedirs(src)
        data = random.randbytes(size)
        with open(os.path.join(src, "model.bin"), "wb") as f:
            f.write(data)
        return src, data

    def wait_up(self, i):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"sluiced n{i} exited: " + self.log_text(i))
            try:
                with socket.create_connection(("127.0.0.1", self.ports[i]), 0.2):
                    pass
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.sock(i))
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sluiced n{i} did not start")

    def log_text(self, i):
        with open(self.logs[i].name, errors="replace") as f:
            return f.read()

    def stat(self, i):
        return json.loads(sluice("cache", "stat", "--daemon", self.sock(i), "--json").stdout)

    def cat(self, i, uri):
        return subprocess.Popen([SLUICE, "cat", "--cache", "--daemon", self.sock(i), uri], env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def alive(self, i):
        return self.procs[i].poll() is None

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()


def sign(node, t, root, key, etag, index, offset, length, secret=SECRET, target="n0", verify=False):
    msg = "\n".join(["sluice-peer-v1", node, target, str(t), root, key, etag, str(index), str(offset),
                     str(length), "verify" if verify else "plain"])
    return hmac.new(secret.encode(), msg.encode(), hashlib.sha256).hexdigest()


def reply_sig(request_sig, etag, length, xxh3_hex, secret=SECRET):
    msg = "\n".join(["sluice-peer-v1-reply", request_sig, etag, str(length), str(int(xxh3_hex, 16))])
    return hmac.new(secret.encode(), msg.encode(), hashlib.sha256).hexdigest()


def get(port, path, headers=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def chunk_path(root, key, etag, index, offset, length, verify=False):
    q = {"root": root, "key": key, "etag": etag, "index": index, "offset": offset, "length": length}
    if verify:
        q["verify"] = 1
    return "/v1/chunk?" + urllib.parse.urlencode(q)


def ask(port, root, key, etag, index, offset, length, node="n1", target="n0", secret=SECRET, when=None,
        verify=False):
    """A signed chunk request; returns (status, body, headers, signature)."""
    t = int(time.time()) if when is None else when
    sig = sign(node, t, root, key, etag, index, offset, length, secret=secret, target=target, verify=verify)
    headers = {"X-Sluice-Node": node, "X-Sluice-Target": target, "X-Sluice-Time": str(t),
               "X-Sluice-Signature": sig}
    status, body, hdrs = get(port, chunk_path(root, key, etag, index, offset, length, verify), headers)
    return status, body, hdrs, sig


def test_fan_out_fetches_each_byte_once(s3, digest):
    job = Job(s3.endpoint, 4, "fanout")
    try:
        readers = [job.cat(i, "s3://test/ds/fan") for i in range(4)]
        for i, p in enumerate(readers):
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err.decode()
            assert hashlib.sha256(out).hexdigest() == digest, f"reader on n{i}: wrong bytes"
        stats = [job.stat(i) for i in range(4)]
        backing = sum(s["bytes_from"]["backing"] for s in stats)
        peer = sum(s["bytes_from"]["peer"] for s in stats)
        print(f"  4 daemons: backing {backing} bytes ({backing / SIZE:.3f}x the object), "
              f"from peers {peer}", flush=True)
        assert backing <= 1.05 * SIZE, f"backing store read {backing / SIZE:.2f}x the object"
        assert peer > 0, "no chunk came from a peer"
        # No fetch failed or timed out: daemons filling for each other never wait on each
        # other in a cycle (fills are grouped by owner).
        errors = {f"n{i}": [(p["name"], p["errors"], p["last_error"]) for p in s["peers"] if p["errors"]]
                  for i, s in enumerate(stats)}
        assert not any(errors.values()), errors
        # The membership, as the CLI shows it.
        out = sluice("cache", "peers", "--daemon", job.sock(0)).stdout.decode()
        for i in range(4):
            assert f"n{i}" in out, out
        js = json.loads(sluice("cache", "peers", "--daemon", job.sock(0), "--json").stdout)
        assert [p["name"] for p in js["peers"]] == ["n0", "n1", "n2", "n3"], js
        assert sum(p["self"] for p in js["peers"]) == 1, js
        # One state per peer, as the table shows it: self, up, down or untried.
        states = {p["state"] for p in js["peers"]}
        assert "up" in states and states <= {"self", "up", "untried"}, js
        # Prometheus text on the HTTP port.
        status, body, headers = get(job.ports[1], "/metrics")
        text = body.decode()
        assert status == 200 and "text/plain" in headers.get("Content-Type", ""), (status, headers)
        for name in ("sluice_cache_misses_total", 'sluice_bytes_total{source="peer"}',
                     'sluice_bytes_total{source="backing"}', "sluice_peer_served_bytes_total",
                     'sluice_team_bytes_total{team="default"}', "sluice_cache_checksum_failures_total"):
            assert name in text, f"{name} missing from /metrics"
    finally:
        job.close()


def test_a_peer_killed_mid_read_costs_the_reader_nothing(s3, digest):
    job = Job(s3.endpoint, 3, "kill")
    try:
        reader = job.cat(0, "s3://test/ds/fan")
        time.sleep(0.15)
        job.procs[2].send_signal(signal.SIGKILL)
        out, err = reader.communicate(timeout=300)
        assert reader.returncode == 0, err.decode()
        assert hashlib.sha256(out).hexdigest() == digest
        # Another read with the peer gone: exact, and the dead peer shows as down or failed.
        p = job.cat(1, "s3://test/ds/fan")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err.decode()
        peers = {x["name"]: x for x in job.stat(1)["peers"]}
        assert peers["n2"]["errors"] > 0 or peers["n2"]["fetched_chunks"] == 0, peers
    finally:
        job.close()


def test_bad_requests_are_refused_and_the_daemon_stays_up(s3, digest):
    job = Job(s3.endpoint, 2, "bad")
    try:
        port = job.ports[0]
        root, key = "s3://test/ds", "fan"
        # Another etag than the object's: 412, and the answer names the etag there is.
        status, body, _, _ = ask(port, root, key, "feedface", 0, 0, 1)
        if status == 421:  # chunk 0 is n1's: any chunk says the etag once it is n0's
            status, body, _, _ = ask(port, root, key, "feedface", 1, 0, 1)
        assert status in (412, 421), (status, body)
        # Chunks n1 owns are refused with 421 (misdirected); n0 serves its own.
        etag, mine, theirs = None, None, None
        for idx in range(SIZE // MIB + 1):
            st, body, _, _ = ask(port, root, key, "feedface", idx, 0, 1)
            if st == 412:
                mine = idx if mine is None else mine
                etag = body.decode().split(" is etag ")[1].split(" here")[0]
            elif st == 421:
                theirs = idx if theirs is None else theirs
            else:
                raise AssertionError((idx, st, body))
        assert mine is not None and theirs is not None and etag, (mine, theirs)
        status, body, headers, sig = ask(port, root, key, etag, mine, 0, MIB)
        assert status == 200 and len(body) == MIB, (status, body[:200])
        assert headers.get("X-Sluice-Etag") == etag
        # The reply is signed for this request: a forged one would not verify.
        assert headers.get("X-Sluice-Reply-Signature") == reply_sig(sig, etag, MIB, headers["X-Sluice-Xxh3"])
        assert ask(port, root, key, etag, theirs, 0, MIB)[0] == 421
        status, body, _, _ = ask(port, root, key, etag, mine, 0, MIB, verify=True)  # through the checks
        assert status == 200 and len(body) == MIB
        # Wrong secret, stale time, another target, a node outside the job, a signature for
        # another chunk: 403, and the reason is logged.
        assert ask(port, root, key, etag, mine, 0, MIB, secret="x" * 20)[0] == 403
        assert ask(port, root, key, etag, mine, 0, MIB, when=int(time.time()) - 3600)[0] == 403
        assert ask(port, root, key, etag, mine, 0, MIB, target="n1")[0] == 403
        assert ask(port, root, key, etag, mine, 0, MIB, node="intruder")[0] == 403
        t = int(time.time())
        s = sign("n1", t, root, key, etag, mine, 0, MIB)
        other = chunk_path(root, key, etag, theirs, 0, MIB)
        assert get(port, other, {"X-Sluice-Node": "n1", "X-Sluice-Target": "n0", "X-Sluice-Time": str(t),
                                 "X-Sluice-Signature": s})[0] == 403
        time.sleep(1.1)  # refusals are logged at most once a second
        assert ask(port, root, key, etag, mine, 0, MIB, secret="y" * 20)[0] == 403
        assert "bad signature" in job.log_text(0), job.log_text(0)[-2000:]
        # Roots no team is granted for peers: local files, even with the default "*" grant.
        st = ask(port, "file:///etc", "passwd", "x", 0, 0, 1)[0]
        assert st == 403, st
        # Malformed: missing fields, path tricks, ranges past the chunk, control characters.
        assert get(port, "/v1/chunk?root=s3://test/ds", {"X-Sluice-Node": "n1"})[0] == 400
        for k, off, ln in [("../fan", 0, MIB), ("a/../../fan", 0, MIB), ("fan", MIB, 1), ("fan", 0, 0),
                           ("fan", 10, MIB), ("fan\nx", 0, 1)]:
            st = ask(port, root, k, etag, mine, off, ln)[0]
            assert st in (400, 421), (k, off, ln, st)
        assert ask(port, root, key, etag, 9999, 0, 1)[0] in (400, 421)
        assert ask(port, "s3://test/../etc", key, etag, 0, 0, MIB)[0] == 400
        assert get(port, "/nothing")[0] == 404
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chunk", data=b"x" * 100, method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("POST was accepted")
        except urllib.error.HTTPError as e:
            assert e.code in (405, 413), e.code
        # Raw garbage, oversize headers, truncated requests, slow clients: a small fuzz loop.
        rnd = random.Random(7)
        good = chunk_path(root, key, etag, mine, 0, MIB)
        line = f"GET {good} HTTP/1.1\r\nHost: x\r\nX-Sluice-Node: n1\r\n\r\n".encode()
        for n in range(150):
            kind = n % 5
            if kind == 0:
                payload = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 400)))
            elif kind == 1:
                payload = b"GET /v1/chunk HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n"
            elif kind == 2:
                payload = line[:rnd.randrange(len(line))]
            elif kind == 3:
                b = bytearray(line)
                for _ in range(rnd.randrange(1, 8)):
                    b[rnd.randrange(len(b))] = rnd.randrange(256)
                payload = bytes(b)
            else:
                payload = b"GET /v1/chunk?index=-1&offset=99999999999999999999999 HTTP/1.0\r\n\r\n"
            with socket.create_connection(("127.0.0.1", port), 5) as c:
                c.settimeout(2)
                try:
                    c.sendall(payload)
                    c.shutdown(socket.SHUT_WR)
                    c.recv(4096)
                except OSError:
                    pass
        idle = [socket.create_connection(("127.0.0.1", port), 5) for _ in range(10)]
        status, body, _, _ = ask(port, root, key, etag, mine, 0, MIB)
        assert status == 200 and len(body) == MIB, status
        for c in idle:
            c.close()
        assert job.alive(0), job.log_text(0)[-2000:]
        p = job.cat(0, "s3://test/ds/fan")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err.decode()
        status, body, _ = get(port, "/metrics")
        assert "sluice_peer_refused_total" in body.decode()
    finally:
        job.close()


def test_a_corrupt_chunk_on_the_owner_is_checked_and_refetched(s3, digest):
    job = Job(s3.endpoint, 2, "corrupt")
    try:
        p = job.cat(0, "s3://test/ds/fan")  # n1's chunks land on n1's NVMe (and on n0's)
        out, err = p.communicate(timeout=300)
        assert hashlib.sha256(out).hexdigest() == digest, err
        time.sleep(1)  # NVMe writes are queued behind fills
        chunks_dir = os.path.join(job.dir, "cache1", "chunks")
        files = [os.path.join(dp, f) for dp, _, fs in os.walk(chunks_dir) for f in fs
                 if os.path.getsize(os.path.join(dp, f)) >= MIB]
        assert files, "no chunk segment on n1"
        for f in files:  # flip a byte in every chunk n1 holds (1 MiB chunks, one per MiB)
            with open(f, "r+b") as fh:
                for at in range(0, os.path.getsize(f) - MIB + 1, MIB):
                    fh.seek(at)
                    b = fh.read(1)
                    fh.seek(at)
                    fh.write(bytes([b[0] ^ 0xFF]))
        sluice("cache", "evict", "s3://test/ds/", "--daemon", job.sock(0))
        p = job.cat(0, "s3://test/ds/fan")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err.decode()
        n0 = {x["name"]: x for x in job.stat(0)["peers"]}
        assert n0["n1"]["up"] and n0["n1"]["fetched_chunks"] > 0, n0  # retried with verify, not blamed
        assert job.stat(1)["checksum_failures"] > 0  # n1 found its corrupt chunks and refetched them
    finally:
        job.close()


def test_checkpoints_on_a_peer_survive_the_loss_of_the_node(s3):
    job = Job(s3.endpoint, 2, "ckpt")
    try:
        src, data = job.state(9 * MIB + 5)
        local, durable = os.path.join(job.dir, "local"), os.path.join(job.dir, "durable")
        peer = f"sluiced://n1@127.0.0.1:{job.ports[1]}/ckpt/"
        me = ["--node-name", "n0", "--node-secret-file", job.secret]
        sluice("ckpt", "save", "--series", "m", "--step", "1", "--to", local, "--to", peer, *me, src)
        # This node is lost: restore from the peer alone.
        out = os.path.join(job.dir, "out1")
        sluice("ckpt", "restore", "--series", "m", "--from", peer, "--to", out, *me)
        with open(os.path.join(out, "model.bin"), "rb") as f:
            assert f.read() == data
        sluice("ckpt", "verify", "--series", "m", "--from", peer, *me)
        # Without the secret, or as a stranger, the peer refuses.
        p = sluice("ckpt", "ls", "--series", "m", "--from", peer, "--node-name", "n0", check=False)
        assert p.returncode != 0 and b"--node-secret-file" in p.stderr, p.stderr
        p = sluice("ckpt", "ls", "--series", "m", "--from", peer, "--node-name", "zz",
                   "--node-secret-file", job.secret, check=False)
        assert p.returncode != 0 and b"not a member" in p.stderr, p.stderr
        # The peer dies: a save that only requires the first tier goes on to the next one,
        # and a restore skips the dead peer.
        job.procs[1].kill()
        job.procs[1].wait()
        p = sluice("ckpt", "save", "--series", "m", "--step", "2", "--to", local, "--to", peer, "--to", durable,
                   "--require", "first", "--json", *me, src)
        tiers = json.loads(p.stdout)["tiers"]
        assert [t["state"] for t in tiers] == ["committed", "failed", "committed"], tiers
        out = os.path.join(job.dir, "out2")
        sluice("ckpt", "restore", "--series", "m", "--step", "2", "--from", peer, "--from", durable,
               "--to", out, *me)
        with open(os.path.join(out, "model.bin"), "rb") as f:
            assert f.read() == data
    finally:
        job.close()


def test_a_peer_tier_chosen_from_the_membership(s3):
    """peer://FOLDER/: the copy goes to another member (never this node), the same one for
    the series whoever asks; any member restores it; with that member down the next save
    goes to the next one."""
    job = Job(s3.endpoint, 3, "ckpt-auto")
    try:
        src, data = job.state(3 * MIB + 7)
        auth = ["--peers", job.peers, "--node-secret-file", job.secret]

        def holders(step):
            return [i for i in range(3) if os.path.exists(
                os.path.join(job.objects(i), "ckpt", "m", f"step-{step:012d}"))]

        p = sluice("ckpt", "save", "--series", "m", "--step", "1", "--to", "peer://ckpt/",
                   "--node-name", "n0", "--json", *auth, src)
        assert json.loads(p.stdout)["tiers"][0]["state"] == "committed", p.stdout
        held = holders(1)
        assert len(held) == 1 and held != [0], held
        for me in ("n0", "n1", "n2"):  # any node finds it (a replacement node, say)
            out = os.path.join(job.dir, "out-" + me)
            sluice("ckpt", "restore", "--series", "m", "--from", "peer://ckpt/", "--to", out,
                   "--node-name", me, *auth)
            with open(os.path.join(out, "model.bin"), "rb") as f:
                assert f.read() == data, me
        # The node holding it saves too: its copy goes elsewhere, never to itself.
        h = held[0]
        sluice("ckpt", "save", "--series", "m", "--step", "2", "--to", "peer://ckpt/",
               "--node-name", f"n{h}", *auth, src)
        assert h not in holders(2) and len(holders(2)) == 1, holders(2)
        # The first choice down: n0's next save goes to the other member.
        job.procs[h].kill()
        job.procs[h].wait()
        p = sluice("ckpt", "save", "--series", "m", "--step", "3", "--to", "peer://ckpt/",
                   "--node-name", "n0", "--json", *auth, src)
        assert json.loads(p.stdout)["tiers"][0]["state"] == "committed", p.stdout
        assert holders(3) and h not in holders(3) and 0 not in holders(3), holders(3)
        out = os.path.join(job.dir, "out3")
        sluice("ckpt", "restore", "--series", "m", "--step", "3", "--from", "peer://ckpt/", "--to", out,
               "--node-name", "n0", *auth)
        with open(os.path.join(out, "model.bin"), "rb") as f:
            assert f.read() == data
        p = sluice("ckpt", "ls", "--from", "peer://ckpt/", "--node-name", "n0", *auth, check=False)
        assert p.returncode != 0 and b"chosen per series" in p.stderr, p.stderr
        # Bad settings: clear errors.
        for extra, words in ((["--node-secret-file", job.secret], b"--peers"),
                             (["--peers", job.peers], b"--node-secret-file"),
                             (["--peers", job.peers, "--node-secret-file", job.secret, "--node-name", "zz"],
                              b"not in the membership"),
                             (["--peers", job.peers, "--node-secret-file", job.secret, "--world", "2",
                               "--rank", "1", "--run-id", "r"], b"multi-rank")):
            p = sluice("ckpt", "save", "--series", "m", "--step", "9", "--to", "peer://ckpt/", *extra, src,
                       check=False)
            assert p.returncode != 0 and words in p.stderr, (extra, p.stderr)
    finally:
        job.close()


def owned_chunk(port, root, key, chunks):
    """(etag, a chunk index n0 owns, one it does not) of `key`, from 412 and 421 answers."""
    etag, mine, theirs = None, None, None
    for idx in range(chunks):
        st, body, _, _ = ask(port, root, key, "feedface", idx, 0, 1)
        if st == 412:
            mine = idx if mine is None else mine
            etag = body.decode().split(" is etag ")[1].split(" here")[0]
        elif st == 421:
            theirs = idx if theirs is None else theirs
        else:
            raise AssertionError((idx, st, body))
    return etag, mine, theirs


def test_local_files_go_to_peers_only_where_granted_for_them(s3, digest):
    """Issue 48, item 3: a file:// root's chunks were served to any member with the owner's
    rights once some team was granted the root. No caller's rights can be checked for a
    peer: local files go to peers only under --peer-file-root, and members ask each other
    for nothing else (a read of a local file through a daemon costs no refused request)."""
    data = os.path.join(WORK, "local-data")
    os.makedirs(data)
    body = random.randbytes(6 * MIB + 99)
    with open(os.path.join(data, "f"), "wb") as f:
        f.write(body)
    cfg = os.path.join(WORK, "local-teams.json")
    with open(cfg, "w") as f:
        json.dump({"teams": [{"name": "me", "uids": [os.getuid()], "roots": [f"file://{data}/"]}]}, f)
    root = f"file://{data}"
    job = Job(s3.endpoint, 2, "local-teams", extra=["--config", cfg])
    try:
        for idx in range(7):  # granted to a team, not to peers: refused before anything
            st, text, _, _ = ask(job.ports[0], root, "f", "feedface", idx, 0, 1)
            assert st == 403 and b"not served to peers" in text, (idx, st, text)
        p = subprocess.run([SLUICE, "cat", "--cache", "--daemon", job.sock(1), f"{root}/f"],
                           capture_output=True, env=env(), timeout=120)
        assert p.returncode == 0 and p.stdout == body, p.stderr
        errors = [(x["name"], x["errors"], x["last_error"]) for x in job.stat(1)["peers"] if x["errors"]]
        assert not errors, errors  # n0 was never asked for a local file
    finally:
        job.close()
    job = Job(s3.endpoint, 2, "local-peers", extra=["--config", cfg, "--peer-file-root", root + "/"])
    try:
        port = job.ports[0]
        etag, mine, _ = owned_chunk(port, root, "f", 7)
        assert etag and mine is not None, (etag, mine)
        status, got, headers, _ = ask(port, root, "f", etag, mine, 0, MIB)
        want = body[mine * MIB:(mine + 1) * MIB]
        assert status == 200 and got == want, (status, got[:100])
        assert ask(port, "file:///etc", "passwd", "x", 0, 0, 1)[0] == 403  # outside the grant
    finally:
        job.close()
    d = os.path.join(WORK, "bad-peer-root")
    base = [SLUICED, "--socket", os.path.join(d, "s.sock"), "--cache-dir", os.path.join(d, "c")]
    peers = ["--peer-listen", f"127.0.0.1:{free_port()}", "--peers", job.peers, "--node-name", "n0",
             "--node-secret-file", job.secret]
    for extra, want in ((["--peer-file-root", "*", *peers], b"not a file:// root"),
                        (["--peer-file-root", "s3://test/ds/", *peers], b"not a file:// root"),
                        (["--peer-file-root", root], b"needs --peers")):
        p = subprocess.run(base + extra, capture_output=True, env=env(), timeout=30)
        assert p.returncode != 0 and want in p.stderr, (extra, p.stderr)


def test_bad_peer_settings_are_refused():
    d = os.path.join(WORK, "settings")
    os.makedirs(d)
    peers = os.path.join(d, "peers")
    with open(peers, "w") as f:
        f.write("a 127.0.0.1:9\nb 127.0.0.1:10\n")
    open_secret = os.path.join(d, "secret")
    with open(open_secret, "w") as f:
        f.write(SECRET)
    os.chmod(open_secret, 0o644)
    base = [SLUICED, "--socket", os.path.join(d, "s.sock"), "--cache-dir", os.path.join(d, "c")]
    cases = [
        (["--peers", peers], "--peer-listen"),
        (["--peer-listen", "127.0.0.1:0", "--peers", peers, "--node-name", "a"], "--node-secret-file"),
        (["--peer-listen", "127.0.0.1:0", "--peers", peers, "--node-name", "zz",
          "--node-secret-file", open_secret], "not in the membership"),
        (["--peer-listen", "127.0.0.1:0", "--peers", peers, "--node-name", "a",
          "--node-secret-file", open_secret], "chmod 600"),
        (["--peer-listen", "nowhere"], "HOST:PORT"),
    ]
    # A FIFO or a device where a settings file belongs: refused, never waited on or read forever.
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo, 0o600)
    with open(os.path.join(d, "good-secret"), "w") as f:
        f.write(SECRET)
    os.chmod(os.path.join(d, "good-secret"), 0o600)
    good_secret = os.path.join(d, "good-secret")
    cases += [
        (["--peer-listen", "127.0.0.1:0", "--peers", peers, "--node-name", "a",
          "--node-secret-file", fifo], "not a regular file"),
        (["--peer-listen", "127.0.0.1:0", "--peers", fifo, "--node-name", "a",
          "--node-secret-file", good_secret], "not a regular file"),
        (["--peer-listen", "127.0.0.1:0", "--peers", "/dev/zero", "--node-name", "a",
          "--node-secret-file", good_secret], "not a regular file"),
        (["--config", fifo], "not a regular file"),
    ]
    for extra, want in cases:
        p = subprocess.run(base + extra, capture_output=True, env=env(), timeout=30)
        assert p.returncode != 0 and want in p.stderr.decode(), (extra, p.returncode, p.stderr.decode())
    with open(peers, "w") as f:
        f.write("a 127.0.0.1:9\na 127.0.0.1:10\n")
    os.chmod(open_secret, 0o600)
    p = subprocess.run(base + ["--peer-listen", "127.0.0.1:0", "--peers", peers, "--node-name", "a",
                               "--node-secret-file", open_secret], capture_output=True, env=env(), timeout=30)
    assert p.returncode != 0 and b"listed twice" in p.stderr, p.stderr


def main():
    if not find_s3rver():
        print("SKIP: s3rver not found (npm install s3rver)")
        sys.exit(77)
    s3 = S3rver()
    try:
        data = random.randbytes(SIZE)
        src = os.path.join(WORK, "fan.bin")
        with open(src, "wb") as f:
            f.write(data)
        sluice("cp", src, "s3://test/ds/fan", "--endpoint-url", s3.endpoint)
        digest = hashlib.sha256(data).hexdigest()
        r = Runner()
        r.run("fan-out: each byte from S3 about once", test_fan_out_fetches_each_byte_once, s3, digest)
        r.run("a peer killed mid-read costs the reader nothing",
              test_a_peer_killed_mid_read_costs_the_reader_nothing, s3, digest)
        r.run("bad requests refused, the daemon stays up",
              test_bad_requests_are_refused_and_the_daemon_stays_up, s3, digest)
        r.run("a corrupt chunk on the owner is checked and refetched",
              test_a_corrupt_chunk_on_the_owner_is_checked_and_refetched, s3, digest)
        r.run("checkpoints on a peer survive the loss of the node",
              test_checkpoints_on_a_peer_survive_the_loss_of_the_node, s3)
        r.run("a peer tier chosen from the membership", test_a_peer_tier_chosen_from_the_membership, s3)
        r.run("bad peer settings refused", test_bad_peer_settings_are_refused)
        r.run("local files go to peers only where granted for them",
              test_local_files_go_to_peers_only_where_granted_for_them, s3, digest)
        r.finish()
    finally:
        s3.close()
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
