#!/usr/bin/python3
"""sluiced, the node daemon, against a real s3rver: eight processes reading one object fetch
each chunk once; warm reads are handed off as descriptors; malformed and oversize frames
leave it up; a uid in no team is refused; SIGTERM stops it cleanly; kill -9 mid-fill and a
restart serve exact bytes; with a ledger, a team's nvme quota bounds what is kept of its
data and the usage says so. s3rver missing: SKIP.

    /usr/bin/python3 tests/integration/sluiced_test.py build/bin/sluice build/bin/sluiced
"""
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import Runner, S3rver, Skip, find_s3rver  # noqa: E402
import sluiced_harness  # noqa: E402

SLUICE = os.path.abspath(sys.argv[1])
SLUICED = os.path.abspath(sys.argv[2])
WORK = tempfile.mkdtemp(prefix="sluice-sluiced-")
SOCK = os.path.join(WORK, "sluiced.sock")
CACHE = os.path.join(WORK, "cache")
MIB = 1 << 20
OBJ_BYTES = 24 * MIB + 4321  # 25 chunks of 1 MiB
CHUNKS = 25


def env():
    e = dict(os.environ, SLUICE_HOME=os.path.join(WORK, "home"), AWS_ACCESS_KEY_ID="S3RVER",
             AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return e


class Daemon(sluiced_harness.Sluiced):
    def __init__(self, endpoint, *extra):
        super().__init__(SLUICED, SOCK, CACHE,
                         ["--chunk-size", "1M", "--cache-ram", "0", "--endpoint-url", endpoint,
                          *extra], env=env(), log=os.path.join(WORK, "sluiced.log"))


def stacks(pid):
    """Every thread's stack of process `pid` (gdb), for a command that hangs; empty without gdb."""
    if not shutil.which("gdb"):
        return "(no gdb for stacks)"
    r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                       capture_output=True, text=True, timeout=120)
    return "\n".join(line for line in r.stdout.splitlines() if line.startswith(("#", "Thread")))


def sluice(*args, check=True):
    proc = subprocess.Popen([SLUICE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        # A hang (seen once, under ASan in CI, in `cache warm` through the daemon): the client's
        # and the daemons' stacks and the daemon's log, before the client is killed.
        report = [f"sluice {' '.join(args)} hung for 300 s", "client:", stacks(proc.pid)]
        for pid in subprocess.run(["pgrep", "-f", SLUICED], capture_output=True,
                                  text=True).stdout.split():
            report += [f"sluiced {pid}:", stacks(int(pid))]
        log = os.path.join(WORK, "sluiced.log")
        if os.path.exists(log):
            report += ["sluiced.log (tail):", open(log, errors="replace").read()[-4000:]]
        proc.kill()
        proc.communicate()
        raise AssertionError("\n".join(report))
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and p.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {p.returncode}: {p.stderr.decode()}")
    return p


def daemon_stat():
    return json.loads(sluice("cache", "stat", "--daemon", SOCK, "--json").stdout)


def cat(uri):
    return subprocess.Popen([SLUICE, "cat", "--cache", "--daemon", SOCK, uri], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_eight_processes_fetch_each_chunk_once(s3, digest):
    d = Daemon(s3.endpoint)
    try:
        procs = [cat("s3://test/ds/obj") for _ in range(8)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            assert b"embedded" not in err, err  # it went through the daemon
            assert hashlib.sha256(out).hexdigest() == digest
        st = daemon_stat()
        assert st["misses"] == CHUNKS, st  # one backing read per chunk for eight readers
        assert st["miss_bytes"] == OBJ_BYTES, st
        # Warm: a copy through the daemon gets whole chunks as descriptors.
        dst = os.path.join(WORK, "copy.bin")
        p = sluice("cp", "--cache", "--daemon", SOCK, "s3://test/ds/obj", dst, "--json",
                   "--endpoint-url", s3.endpoint)
        rep = json.loads(p.stdout)
        assert rep["cache"]["daemon"] and rep["cache"]["handoff_bytes"] >= 20 * MIB, rep
        assert hashlib.sha256(open(dst, "rb").read()).hexdigest() == digest
        st = daemon_stat()
        assert st["misses"] == CHUNKS
        # A chunk handed off by descriptor was served by the NVMe tier: a hit.
        assert st["nvme"]["hit_bytes"] >= rep["cache"]["handoff_bytes"], st
    finally:
        assert d.stop() == 0


def test_cache_commands_act_through_the_daemon(s3, digest):
    d = Daemon(s3.endpoint)
    try:
        # warm through the daemon: every chunk fetched once, then already cached.
        rep = json.loads(sluice("cache", "warm", "s3://test/ds/", "--daemon", SOCK, "--json", "--no-progress",
                                "--endpoint-url", s3.endpoint).stdout)
        assert rep["objects"] == 2 and rep["failed"] == 0, rep
        assert rep["fetched_bytes"] == OBJ_BYTES + 64 * MIB, rep
        again = json.loads(sluice("cache", "warm", "s3://test/ds/obj", "--daemon", SOCK, "--json",
                                  "--no-progress", "--endpoint-url", s3.endpoint).stdout)
        assert again["fetched_bytes"] == 0 and again["already_cached_bytes"] == OBJ_BYTES, again
        server = daemon_stat()["server"]
        assert server["inline_bytes"] == 0 and server["handoff_bytes"] == 0, server  # no byte to the CLI
        # ls, pin, evict: the daemon's chunks, not the directory's lock error.
        ls = json.loads(sluice("cache", "ls", "s3://test/ds/obj", "--daemon", SOCK, "--json").stdout)
        assert len(ls) == CHUNKS and all(c["store"] == "s3://test" and c["key"] == "ds/obj" for c in ls), ls[:2]
        assert "ds/obj" in sluice("cache", "ls", "--daemon", SOCK).stdout.decode()
        pin = json.loads(sluice("cache", "pin", "s3://test/ds/obj", "--daemon", SOCK, "--json").stdout)
        assert pin["chunks"] == CHUNKS, pin
        ls = json.loads(sluice("cache", "ls", "s3://test/ds/obj", "--daemon", SOCK, "--json").stdout)
        assert all(c["pinned"] for c in ls), ls[:2]
        sluice("cache", "unpin", "s3://test/ds/obj", "--daemon", SOCK)
        ev = json.loads(sluice("cache", "evict", "s3://test/ds/big", "--daemon", SOCK, "--json").stdout)
        assert ev["chunks"] == 64, ev
        assert json.loads(sluice("cache", "ls", "s3://test/ds/big", "--daemon", SOCK, "--json").stdout) == []
        # verify needs the directory to itself: a clear refusal, not a lock error.
        p = sluice("cache", "verify", "--daemon", SOCK, check=False)
        assert p.returncode == 1 and b"stop it" in p.stderr, p.stderr
        # A root the team may not read, a path trick: refused by the daemon.
        p = sluice("cache", "evict", "s3://test/../etc/", "--daemon", SOCK, check=False)
        assert p.returncode != 0, p.stderr
    finally:
        assert d.stop() == 0


def test_sixteen_clients_never_exceed_the_capacity(s3, digest):
    d = Daemon(s3.endpoint, "--cache-size", "8M")
    try:
        want = hashlib.sha256(open(os.path.join(WORK, "big.bin"), "rb").read()).hexdigest()
        outs = [open(os.path.join(WORK, f"out{i}.bin"), "w+b") for i in range(16)]
        procs = [subprocess.Popen([SLUICE, "cat", "--cache", "--daemon", SOCK, "s3://test/ds/big"], env=env(),
                                  stdout=o, stderr=subprocess.PIPE) for o in outs]
        peak = 0
        while any(p.poll() is None for p in procs):
            st = daemon_stat()
            peak = max(peak, st["nvme"]["bytes"])
            assert st["nvme"]["bytes"] <= st["nvme"]["capacity"] == 8 * MIB, st["nvme"]
            time.sleep(0.02)
        for p, o in zip(procs, outs):
            err = p.stderr.read()
            assert p.wait(300) == 0, err
            o.seek(0)
            assert hashlib.sha256(o.read()).hexdigest() == want
            o.close()
        print(f"  16 clients over 64 MiB, 8 MiB NVMe tier: peak {peak} bytes", flush=True)
    finally:
        assert d.stop() == 0


def test_a_replaced_object_is_not_served_stale(s3, digest):
    d = Daemon(s3.endpoint, "--revalidate-ms", "200")
    try:
        src = os.path.join(WORK, "swap.bin")
        first, second = random.randbytes(3 * MIB + 5), random.randbytes(2 * MIB + 9)
        for data in (first, second):
            with open(src, "wb") as f:
                f.write(data)
            sluice("cp", src, "s3://test/swap/obj", "--endpoint-url", s3.endpoint)
            time.sleep(0.3)  # past the revalidation time
            for _ in range(2):  # cold, then warm
                out, err = cat("s3://test/swap/obj").communicate(timeout=120)
                assert out == data, (len(out), len(data), err)
        assert daemon_stat()["stale_drops"] >= 1
    finally:
        assert d.stop() == 0


def frame(ftype, body, data_len=0):
    head = b"SLND" + struct.pack("<HHIIQ", 1, ftype, len(body), data_len, 7)
    return head + struct.pack("<Q", 0) + body  # a wrong checksum


def test_bad_frames_leave_the_daemon_up(s3, digest):
    d = Daemon(s3.endpoint)
    try:
        cases = [os.urandom(64), b"SLND" + b"\xff" * 28, frame(3, b"{}", data_len=1 << 30),
                 frame(3, b'{"root":"s3://test/../etc","key":"x"}'), b"SLND\x01\x00"]
        for raw in cases:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(SOCK)
                s.sendall(raw)
                s.shutdown(socket.SHUT_WR)
                reply = s.recv(65536)
                assert reply == b"" or reply.startswith(b"SLND"), reply
        # A client that connects and says nothing costs a connection, not the daemon.
        idle = [socket.socket(socket.AF_UNIX) for _ in range(20)]
        for s in idle:
            s.connect(SOCK)
        p = cat("s3://test/ds/obj")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err
        for s in idle:
            s.close()
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0
    log = open(os.path.join(WORK, "sluiced.log")).read()
    assert "bad magic" in log and "over the limit" in log, log


def test_a_uid_in_no_team_is_refused(s3, digest):
    cfg = os.path.join(WORK, "teams.json")
    with open(cfg, "w") as f:
        json.dump({"teams": [{"name": "vision", "uids": [54321], "roots": ["s3://test/"]}]}, f)
    d = Daemon(s3.endpoint, "--config", cfg)
    try:
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", check=False)
        assert p.returncode != 0 and b"in no team" in p.stderr, p.stderr
    finally:
        assert d.stop() == 0
    assert "refused uid" in open(os.path.join(WORK, "sluiced.log")).read()


def test_a_team_granted_a_prefix_reads_it_through_the_cli(s3, digest):
    """Defect 7 of the hostile test: a team granted s3://test/ds/ (not the bucket) reads its
    objects with plain `cat --cache` and `cache warm`; keys outside the prefix are refused."""
    cfg = os.path.join(WORK, "teams.json")
    with open(cfg, "w") as f:
        json.dump({"teams": [{"name": "vision", "uids": [os.getuid()], "roots": ["s3://test/ds/"]}]}, f)
    d = Daemon(s3.endpoint, "--config", cfg)
    try:
        out, err = cat("s3://test/ds/obj").communicate(timeout=120)
        assert hashlib.sha256(out).hexdigest() == digest, err
        sluice("cache", "warm", "--daemon", SOCK, "s3://test/ds/")
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/other", check=False)
        assert p.returncode != 0 and b"permission_denied" in p.stderr, p.stderr
    finally:
        assert d.stop() == 0


def test_a_team_proves_access_with_its_own_credentials(s3, digest):
    d = Daemon(s3.endpoint)  # the daemon's credentials fill the cache
    try:
        out, err = cat("s3://test/ds/obj").communicate(timeout=120)
        assert hashlib.sha256(out).hexdigest() == digest, err
    finally:
        assert d.stop() == 0
    cfg = os.path.join(WORK, "team-keys.json")

    def team(key_id):
        with open(cfg, "w") as f:
            json.dump({"teams": [{"name": "vision", "uids": [os.getuid()], "roots": ["s3://test/"],
                                  "aws_access_key_id": key_id, "aws_secret_access_key": "S3RVER"}]}, f)
        return Daemon(s3.endpoint, "--config", cfg)
    # Keys s3rver does not know: the cached chunks are not served to this team.
    d = team("NOT-A-KEY")
    try:
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", check=False)
        assert p.returncode != 0 and b"team vision's credentials may not read" in p.stderr, p.stderr
        p = sluice("cache", "ls", "s3://test/ds/", "--daemon", SOCK, check=False)
        assert p.returncode != 0 and b"may not list" in p.stderr, p.stderr
        assert daemon_stat()["misses"] == 0
    finally:
        assert d.stop() == 0
    assert "team vision's credentials may not read" in open(os.path.join(WORK, "sluiced.log")).read()
    # The team's own valid keys: served from the cache, nothing fetched again.
    d = team("S3RVER")
    try:
        out, err = cat("s3://test/ds/obj").communicate(timeout=120)
        assert hashlib.sha256(out).hexdigest() == digest, err
        assert daemon_stat()["misses"] == 0
    finally:
        assert d.stop() == 0
    # Both credential forms at once, or half a pair: refused at start.
    with open(cfg, "w") as f:
        json.dump({"teams": [{"name": "v", "uids": [1], "roots": ["*"], "aws_access_key_id": "x"}]}, f)
    p = subprocess.run([SLUICED, "--socket", SOCK, "--cache-dir", CACHE, "--config", cfg], capture_output=True,
                       env=env(), timeout=30)
    assert p.returncode != 0 and b"go together" in p.stderr, p.stderr
    # A setting of the wrong type is named; prefault_ram takes true or false.
    with open(cfg, "w") as f:
        json.dump({"prefault_ram": "yes"}, f)
    p = subprocess.run([SLUICED, "--socket", SOCK, "--cache-dir", CACHE, "--config", cfg], capture_output=True,
                       env=env(), timeout=30)
    assert p.returncode != 0 and b'"prefault_ram" must be true or false' in p.stderr, p.stderr


def test_the_ram_tier_is_prefaulted_unless_told_not(s3, digest):
    cfg = os.path.join(WORK, "prefault.json")
    for setting, said in ((None, True), (False, False)):
        with open(cfg, "w") as f:
            json.dump({} if setting is None else {"prefault_ram": setting}, f)
        d = sluiced_harness.Sluiced(SLUICED, SOCK, CACHE,
                                    ["--chunk-size", "1M", "--cache-ram", "8M", "--endpoint-url",
                                     s3.endpoint, "--config", cfg],
                                    env=env(), log=os.path.join(WORK, "sluiced.log"))
        try:
            if said:  # by default: all 8 buffers of the RAM tier, on their own thread
                d.wait_for("RAM tier ready: 8.00 MiB allocated and touched", timeout=60)
        finally:
            assert d.stop() == 0
        with open(d.log.name, "rb") as f:
            f.seek(d.log_start)
            assert (b"RAM tier ready" in f.read()) == said, setting


def test_sigterm_stops_cleanly_and_kill9_loses_nothing(s3, digest):
    d = Daemon(s3.endpoint)
    p = cat("s3://test/ds/big")  # a fill in progress when the daemon dies
    time.sleep(0.1)
    d.proc.kill()
    d.proc.wait(10)
    out, _ = p.communicate(timeout=60)
    # The reader learns the daemon is gone: never a silent short read.
    assert p.returncode != 0 or len(out) == 64 * MIB, (p.returncode, len(out))
    d = Daemon(s3.endpoint)
    try:
        for _ in range(2):
            q = cat("s3://test/ds/obj")
            out, err = q.communicate(timeout=300)
            assert q.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err
    finally:
        assert d.stop(signal.SIGTERM) == 0
    assert not os.path.exists(SOCK), "the socket outlived the daemon"
    # Without a daemon, --cache says so and reads through the embedded cache.
    p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", "--endpoint-url", s3.endpoint)
    assert b"embedded cache" in p.stderr and hashlib.sha256(p.stdout).hexdigest() == digest


def test_a_teams_cache_quota_keeps_only_what_it_allows(s3, digest):
    ledger = os.path.join(WORK, "ledger.db")
    if os.path.exists(ledger):
        os.remove(ledger)
    sluice("team", "add", "vision", "--ledger", ledger)
    sluice("project", "add", "vision-ds", "--team", "vision", "--location", "s3://test/ds", "--ledger", ledger)
    sluice("quota", "set", "vision", "--tier", "nvme", "--hard-bytes", "10M", "--ledger", ledger)
    d = Daemon(s3.endpoint, "--ledger", ledger)
    try:
        # Past the quota the warm cannot keep the chunks: it says so and does not exit 0.
        p = sluice("cache", "warm", "s3://test/ds/obj", "--daemon", SOCK, "--json", "--no-progress",
                   "--endpoint-url", s3.endpoint, check=False)
        rep = json.loads(p.stdout)
        assert rep["failed"] == 0, rep
        assert p.returncode == 1 and rep["not_kept_bytes"] >= 14 * MIB, (p.returncode, rep)
        assert b"could not be kept" in p.stderr, p.stderr
        p = cat("s3://test/ds/obj")  # every byte served, kept or not
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and hashlib.sha256(out).hexdigest() == digest, err
        st = daemon_stat()
        # 10 MiB: ten whole chunks, or nine and the short one
        assert st["nvme"]["chunks"] == 10 and st["nvme"]["bytes"] <= 10 * MIB, st["nvme"]
        assert st["charging"]["refused_chunks"] >= CHUNKS - 10, st["charging"]
        kept = st["nvme"]["bytes"]
    finally:
        assert d.stop() == 0  # the last charges are committed as it stops
    log = open(os.path.join(WORK, "sluiced.log")).read()
    assert "not keeping chunks of project 'vision-ds' (team vision)" in log, log[-2000:]
    by_kind = json.loads(sluice("usage", "--by", "kind", "--json", "--ledger", ledger).stdout)
    assert [(u["kind"], u["bytes"]) for u in by_kind] == [("cache", kept)], by_kind
    by_tier = json.loads(sluice("usage", "--by", "tier", "--json", "--ledger", ledger).stdout)
    assert [(u["tier"], u["bytes"]) for u in by_tier] == [("nvme", kept)], by_tier


def test_a_client_asking_for_another_endpoint_is_refused(s3, digest):
    # The daemon reads s3:// from s3.endpoint; a command told another endpoint is refused
    # with an error that names both, not served from the daemon's server (issue 30, item 1).
    d = Daemon(s3.endpoint)
    try:
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", "--endpoint-url",
                   "http://127.0.0.1:9", check=False)
        err = p.stderr.decode()
        assert p.returncode == 2, (p.returncode, err)
        assert s3.endpoint in err and "http://127.0.0.1:9" in err and "without the daemon" in err, err
        # The same endpoint, or none given, is served.
        assert sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", "--endpoint-url",
                      s3.endpoint).returncode == 0
        # Another spelling of the same server (localhost, a trailing slash) is the same one.
        other = s3.endpoint.replace("127.0.0.1", "LOCALHOST") + "/"
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", "--endpoint-url", other,
                   check=False)
        assert p.returncode == 0 and b"without the daemon" not in p.stderr, p.stderr
        assert "s3:// from " + s3.endpoint in open(d.log.name).read()
    finally:
        assert d.stop() == 0


def test_a_busy_daemon_is_not_bypassed_to_another_server(s3, digest):
    # A command given no endpoint is served with the daemon's. When the daemon refuses its
    # connection (past --max-connections-per-uid), reading through the embedded cache instead
    # would send the request, signed with this process's credentials, to the default AWS
    # endpoint: another server with a bucket of the same name. It fails, naming the busy
    # daemon (issue 47, item 2).
    d = Daemon(s3.endpoint, "--max-connections-per-uid", "1")
    held = hold_a_connection()
    try:
        p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", check=False)
        err = p.stderr.decode()
        assert p.returncode != 0 and not p.stdout, (p.returncode, err)
        assert "too many connections" in err and SOCK in err, err
        assert "not read through the embedded cache" in err, err
        assert "using the embedded cache" not in err and "amazonaws" not in err, err
        held.close()
        # Once the connection is given back, the same command is served by the daemon.
        deadline = time.time() + 10
        while True:
            p = sluice("cat", "--cache", "--daemon", SOCK, "s3://test/ds/obj", check=False)
            if p.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.1)
        assert p.returncode == 0 and hashlib.sha256(p.stdout).hexdigest() == digest, p.stderr
    finally:
        held.close()
        assert d.stop() == 0


def hold_a_connection():
    """A connection to the daemon that it keeps open: the uid's one, once the harness's
    start-up probe has been let go (until then the daemon refuses and closes it)."""
    deadline = time.time() + 10
    while True:
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.connect(SOCK)
        held.settimeout(0.3)
        try:
            if not held.recv(1 << 16) and time.time() > deadline:
                raise AssertionError("sluiced refused every connection for 10 s")
        except socket.timeout:
            return held  # nothing said, nothing closed: the daemon serves it
        held.close()
        time.sleep(0.1)


def thread_sets(pid):
    """Each thread's capability sets and no_new_privs, from /proc/PID/task/*/status;
    io_uring's kernel workers aside (they take no signal, and only read and write
    descriptors already open: NodeServer::drop_privileges)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                v = dict(line.split(":", 1) for line in f if ":" in line)
        except FileNotFoundError:
            continue  # ended
        if v["Name"].strip().startswith("iou-"):
            continue
        out.append({k: int(v[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")}
                   | {"NoNewPrivs": int(v.get("NoNewPrivs", "1")), "name": v["Name"].strip()})
    return out


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID, CAP_NET_BIND_SERVICE = 1, 2, 6, 7, 10


def bits(*caps):
    return sum(1 << c for c in caps)


def test_capabilities_are_dropped_after_start(s3, digest):
    """Issue 48, item 2: a daemon that is not root, started with capabilities (as file
    capabilities or systemd's AmbientCapabilities give them), keeps in every thread only what
    serving its teams' local files needs, with empty inheritable and ambient sets and
    no_new_privs; it opens a caller's file without them (uid 65534 reads its readable file,
    not root's 0600 one). A root daemon keeps only cap_dac_read_search (uid 0 reads every
    local file)."""
    if os.geteuid() != 0:
        raise Skip("needs root to start sluiced as another uid with capabilities")
    if not shutil.which("setpriv"):
        raise Skip("setpriv (util-linux) not found")
    top = tempfile.mkdtemp(prefix="sluice-caps-")
    os.chmod(top, 0o755)
    data, state, client = (os.path.join(top, n) for n in ("data", "state", "client"))
    os.makedirs(data, 0o755)
    os.makedirs(state)
    os.makedirs(client)
    os.chown(state, 65533, 65533)
    os.chown(client, 65534, 65534)
    with open(os.path.join(data, "open"), "w") as f:
        f.write("for everyone\n")
    with open(os.path.join(data, "secret"), "w") as f:
        f.write("root's only\n")
    os.chmod(os.path.join(data, "secret"), 0o600)
    cfg = os.path.join(top, "teams.json")
    with open(cfg, "w") as f:
        json.dump({"teams": [{"name": "others", "uids": [65534], "roots": [f"file://{data}/"]}]}, f)
    given = "+dac_override,+dac_read_search,+setuid,+setgid,+net_bind_service"
    sock = os.path.join(state, "sluiced.sock")
    e = dict(env(), SLUICE_HOME=os.path.join(state, "home"))
    # sluiced as uid 65533 with capabilities (exec'd: the process the harness waits for).
    wrapper = os.path.join(top, "sluiced-with-caps")
    sluiced_copy = os.path.join(top, "sluiced")  # reachable by uid 65533 wherever the build is
    shutil.copy2(SLUICED, sluiced_copy)
    os.chmod(sluiced_copy, 0o755)
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nexec setpriv --reuid=65533 --regid=65533 --clear-groups "
                f"--inh-caps={given} --ambient-caps={given} -- {sluiced_copy} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    d = sluiced_harness.Sluiced(
        wrapper, sock, os.path.join(state, "cache"),
        ["--chunk-size", "1M", "--cache-ram", "0", "--endpoint-url", s3.endpoint, "--config", cfg],
        env=e, log=os.path.join(top, "sluiced.log"))
    try:
        d.wait_for("capabilities: kept")
        keep = bits(CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID)
        for t in thread_sets(d.proc.pid):
            assert t["CapPrm"] == keep and t["CapEff"] == keep, t
            assert t["CapInh"] == 0 and t["CapAmb"] == 0 and t["NoNewPrivs"] == 1, t
        log = open(d.log.name).read()
        assert "kept cap_dac_read_search, cap_setgid, cap_setuid" in log, log

        def nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        ce = dict(env(), SLUICE_HOME=client, HOME=client)
        # A copy uid 65534 can reach: the build may lie in a directory only root may enter
        # (a clone in a mktemp -d).
        sluice_copy = os.path.join(top, "sluice")
        shutil.copy2(SLUICE, sluice_copy)
        os.chmod(sluice_copy, 0o755)
        ok = subprocess.run([sluice_copy, "cat", "--cache", "--daemon", sock, f"file://{data}/open"],
                            capture_output=True, env=ce, preexec_fn=nobody, timeout=120)
        assert ok.returncode == 0 and ok.stdout == b"for everyone\n", ok.stderr
        no = subprocess.run([sluice_copy, "cat", "--cache", "--daemon", sock, f"file://{data}/secret"],
                            capture_output=True, env=ce, preexec_fn=nobody, timeout=120)
        assert no.returncode != 0 and b"permission_denied" in no.stderr, (no.stdout, no.stderr)
        # Threads started since (one per connection) inherited the dropped sets.
        for t in thread_sets(d.proc.pid):
            assert t["CapEff"] == keep and t["CapAmb"] == 0, t
    finally:
        assert d.stop() == 0
    # Root, every local file served to uid 0 (no teams): only cap_dac_read_search, the
    # bounding set too (root may empty it).
    d = Daemon(s3.endpoint)
    try:
        d.wait_for("capabilities: kept")
        for t in thread_sets(d.proc.pid):
            assert t["CapPrm"] == t["CapEff"] == t["CapBnd"] == bits(CAP_DAC_READ_SEARCH), t
            assert t["CapInh"] == 0 and t["CapAmb"] == 0 and t["NoNewPrivs"] == 1, t
    finally:
        assert d.stop() == 0
    shutil.rmtree(top, ignore_errors=True)


def test_chunks_an_embedded_cache_left_are_dropped(s3, digest):
    # Warmed by the embedded cache (keyed by store), they could never be served by the
    # daemon (keyed by root): it drops them at start, says so, and counts none of them.
    sluice("cache", "warm", "s3://test/ds/", "--cache-dir", CACHE, "--chunk-size", "1M",
           "--daemon", "none", "--endpoint-url", s3.endpoint)
    d = Daemon(s3.endpoint)
    try:
        st = daemon_stat()
        assert st["nvme"]["chunks"] == 0 and st["nvme"]["bytes"] == 0, st["nvme"]
        assert "dropped " in open(d.log.name).read()
        assert hashlib.sha256(cat("s3://test/ds/obj").communicate(timeout=300)[0]).hexdigest() \
            == digest
    finally:
        assert d.stop() == 0


def main():
    if not find_s3rver():
        print("SKIP: s3rver not found (npm install s3rver)")
        sys.exit(77)
    s3 = S3rver()
    try:
        data = random.randbytes(OBJ_BYTES)
        src = os.path.join(WORK, "obj.bin")
        with open(src, "wb") as f:
            f.write(data)
        sluice("cp", src, "s3://test/ds/obj", "--endpoint-url", s3.endpoint)
        big = os.path.join(WORK, "big.bin")
        with open(big, "wb") as f:
            f.write(random.randbytes(64 * MIB))
        sluice("cp", big, "s3://test/ds/big", "--endpoint-url", s3.endpoint)
        digest = hashlib.sha256(data).hexdigest()
        r = Runner()
        for name, fn in [("eight processes fetch each chunk once", test_eight_processes_fetch_each_chunk_once),
                         ("cache commands act through the daemon", test_cache_commands_act_through_the_daemon),
                         ("16 clients never exceed the capacity", test_sixteen_clients_never_exceed_the_capacity),
                         ("a replaced object is not served stale", test_a_replaced_object_is_not_served_stale),
                         ("bad frames leave the daemon up", test_bad_frames_leave_the_daemon_up),
                         ("a uid in no team is refused", test_a_uid_in_no_team_is_refused),
                         ("a team granted a prefix reads it through the CLI",
                          test_a_team_granted_a_prefix_reads_it_through_the_cli),
                         ("a team proves access with its own credentials",
                          test_a_team_proves_access_with_its_own_credentials),
                         ("the RAM tier is prefaulted unless told not",
                          test_the_ram_tier_is_prefaulted_unless_told_not),
                         ("SIGTERM is clean, kill -9 loses nothing",
                          test_sigterm_stops_cleanly_and_kill9_loses_nothing),
                         ("a team's cache quota keeps only what it allows",
                          test_a_teams_cache_quota_keeps_only_what_it_allows),
                         ("a client asking for another endpoint is refused",
                          test_a_client_asking_for_another_endpoint_is_refused),
                         ("chunks an embedded cache left are dropped",
                          test_chunks_an_embedded_cache_left_are_dropped),
                         ("a busy daemon is not bypassed to another server",
                          test_a_busy_daemon_is_not_bypassed_to_another_server),
                         ("capabilities are dropped after start",
                          test_capabilities_are_dropped_after_start)]:
            shutil.rmtree(CACHE, ignore_errors=True)
            r.run(name, fn, s3, digest)
        r.finish()
    finally:
        s3.close()
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
