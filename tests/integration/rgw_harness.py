#!/usr/bin/python3
"""A real Ceph RADOS Gateway (S3 server) on loopback for the integration tests.

Unlike s3rver, RGW checks SigV4 signatures, answers conditional requests with 412 and
produces AWS-style multipart ETags, so tests that need those behaviours start one of these.

    with Rgw(buckets=("test",)) as rgw:
        ... rgw.endpoint, rgw.access_key, rgw.secret_key ...

or, for tests written in another language (C++):

    /usr/bin/python3 tests/integration/rgw_harness.py serve --bucket unit

which prints one JSON line {"endpoint", "access_key", "secret_key"} (or {"skip": reason})
and keeps the server up until stdin reaches EOF or it gets SIGTERM/SIGINT.

Standard library only (any Python 3.9+). The Ceph binaries come from Debian's `radosgw`,
`ceph-mon`, `ceph-osd` and `ceph-common` (scripts/install-test-tools.sh installs them).
Ceph 16 (Pacific) has no RADOS-less RGW backend, so this runs a one-node cluster in a
temporary directory: a mon, a memstore OSD (objects live in the OSD's RAM) and radosgw,
all on 127.0.0.1 with msgr2 and `auth none`. /work/shared/MACHINE.md records how the
settings below were chosen.
"""
import contextlib
import ctypes
import datetime
import functools
import hashlib
import hmac
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

# Every program the start-up needs. `ceph-common` brings the Python `rados` module that
# the pool set-up uses, for Debian's /usr/bin/python3 (the `ceph` CLI is built on it).
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph-authtool", "monmaptool")
CEPH_PYTHON = "/usr/bin/python3"

# Fixed, known credentials: the server is private to one test run on loopback.
ACCESS_KEY = "SLUICERGWTESTACCESS0"
SECRET_KEY = "sluice-rgw-test-secret-key-not-a-secret0"

# RGW's pools (Pacific, default zone). Creating them ourselves, all at once, is much
# faster than letting radosgw create them one after another on its first start.
POOLS = (".rgw.root", "default.rgw.control", "default.rgw.meta", "default.rgw.log",
         "default.rgw.buckets.index", "default.rgw.buckets.data", "default.rgw.buckets.non-ec")


class RgwUnavailable(Exception):
    """RGW cannot run here (missing binaries, or the cluster did not start): tests SKIP."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def find_rgw():
    """None when RGW can run here, else the reason why not (for a SKIP line)."""
    if not sys.platform.startswith("linux"):
        return "the Ceph test cluster needs Linux"
    missing = [b for b in BINARIES if not shutil.which(b)]
    if missing:
        return ("Ceph binaries not found: " + ", ".join(missing) +
                " (apt-get install radosgw ceph-mon ceph-osd ceph-common, or scripts/install-test-tools.sh)")
    if not _python_with_rados():
        return "Python module 'rados' not found (Debian package python3-rados, from ceph-common)"
    return None


@functools.lru_cache(maxsize=None)
def _python_with_rados():
    """A Python that can import `rados`: this one, or Debian's (python3 on the PATH may
    be a separate build that cannot see Debian's packages)."""
    for exe in (sys.executable, CEPH_PYTHON):
        if exe and os.path.exists(exe) and subprocess.run(
                [exe, "-c", "import rados"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return exe
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """preexec_fn: the daemon gets SIGKILL if the process that started it dies, so a
    crashed or killed test leaves no Ceph daemons behind. (Linux ties this to the
    starting *thread*: create Rgw on a thread that outlives it.)"""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _sweep_stale_dirs():
    """Removes the directories of harnesses that died without close() (SIGKILL): their
    daemons died with them (see _die_with_parent), but the mon's store and the
    logs stay behind. A directory is stale when the PID in its owner.pid no longer runs."""
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            if not name.startswith("sluice-rgw-"):
                continue
            path = os.path.join(tmp, name)
            try:
                with open(os.path.join(path, "owner.pid")) as f:
                    owner = int(f.read())
            except (OSError, ValueError):
                continue  # being created right now, or not ours
            if owner != os.getpid() and not os.path.exists(f"/proc/{owner}"):
                shutil.rmtree(path, ignore_errors=True)


# A child of /usr/bin/python3 that creates the OSD id and the pools through librados
# (one process instead of ~15 `ceph` CLI runs at ~0.3 s each). It prints "osd-ready" once
# osd.0 exists, so the harness can start ceph-osd while the pools are being created, then
# "pools-ready" when they exist and the OSD is up. Pools are created on parallel threads so
# the mon commits them together.
_POOL_SCRIPT = r"""
import json, sys, threading, time, rados
conf, osd_uuid, pools = sys.argv[1], sys.argv[2], sys.argv[3:]
cluster = rados.Rados(conffile=conf, name="client.admin")
cluster.connect(timeout=30)
def mon(**cmd):
    ret, out, err = cluster.mon_command(json.dumps(dict(cmd, format="json")), b"", timeout=30)
    if ret != 0:
        raise SystemExit("mon command %r failed: %d %s" % (cmd["prefix"], ret, err))
    return out
mon(prefix="osd new", uuid=osd_uuid, id=0)
print("osd-ready", flush=True)
errors = []
def make(pool):
    try:
        mon(prefix="osd pool create", pool=pool, pg_num=8, pgp_num=8)
        mon(prefix="osd pool application enable", pool=pool, app="rgw")
    except BaseException as e:
        errors.append(str(e))
threads = [threading.Thread(target=make, args=(p,)) for p in pools]
for t in threads: t.start()
for t in threads: t.join()
if errors:
    raise SystemExit("; ".join(errors))
# Wait for osd.0 to be up in the osdmap. A client that starts earlier parks its first
# requests until its Objecter's 5-second tick asks for a newer map: radosgw then takes
# 5 s longer to start, about one time in three.
deadline = time.monotonic() + 30
while not any(o["osd"] == 0 and o["up"] for o in json.loads(mon(prefix="osd dump"))["osds"]):
    if time.monotonic() > deadline:
        raise SystemExit("osd.0 did not come up")
    time.sleep(0.02)
print("pools-ready", flush=True)
cluster.shutdown()
"""


class Rgw:
    """A one-node Ceph cluster and radosgw on 127.0.0.1:<free port>, with an S3 user whose
    keys are .access_key / .secret_key and the given buckets. Raises RgwUnavailable when
    it cannot run. close() (or leaving a `with` block) stops every process and removes
    the temporary directory; it is idempotent."""

    def __init__(self, buckets=("test",), memstore_bytes=8 << 30, timeout=60):
        self.procs = []  # (name, Popen) of the daemons, in start order
        self.dir = None
        self.closed = False
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = "us-east-1"  # what the signer puts in the SigV4 scope; RGW takes any
        reason = find_rgw()
        if reason:
            raise RgwUnavailable(reason)
        _sweep_stale_dirs()
        self.dir = tempfile.mkdtemp(prefix="sluice-rgw-")
        with open(os.path.join(self.dir, "owner.pid"), "w") as f:
            f.write(str(os.getpid()))
        self.mon_port = free_port()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.deadline = time.monotonic() + timeout
        try:
            self._start(memstore_bytes, buckets)
        except BaseException as e:  # a signal or Ctrl-C during start-up, too: never leave daemons
            self.close()
            if isinstance(e, (RgwUnavailable, ValueError)) or not isinstance(e, Exception):
                raise
            raise RgwUnavailable(f"RGW did not start: {e!r}") from e

    # --- start-up -------------------------------------------------------------------

    def _start(self, memstore_bytes, buckets):
        self.t0 = time.monotonic()
        self.timings = []
        d = self.dir
        for sub in ("run", "log", "crash", "mon", "osd/ceph-0", "rgw"):
            os.makedirs(os.path.join(d, sub))
        self.conf = os.path.join(d, "ceph.conf")
        fsid = str(uuid.uuid4())
        with open(self.conf, "w") as f:
            f.write(self._ceph_conf(fsid, memstore_bytes))
        # Every Ceph program reads this file and nothing from /etc/ceph or /var/lib/ceph.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CEPH_")}
        self.env["CEPH_CONF"] = self.conf

        # The mon needs a keyring even with `auth none`; the admin key is there for the tools.
        keyring = os.path.join(d, "keyring")
        self._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.",
                  "--cap", "mon", "allow *")
        self._run("ceph-authtool", keyring, "--gen-key", "-n", "client.admin",
                  "--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *")
        monmap = os.path.join(d, "monmap")
        self._run("monmaptool", "--create", "--fsid", fsid,
                  "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]", monmap)
        self._mark("monmap")
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self._mark("mon-mkfs")
        self._spawn("mon", "ceph-mon", "-f", "-i", "a")

        # osd.0's store needs no mon, so it is made while the mon starts; `osd new` with id 0
        # then registers it under the same uuid.
        osd_uuid = str(uuid.uuid4())
        self._run("ceph-osd", "--mkfs", "-i", "0", "--osd-uuid", osd_uuid)
        self._mark("osd-mkfs")
        pools = subprocess.Popen([_python_with_rados(), "-c", _POOL_SCRIPT, self.conf, osd_uuid, *POOLS],
                                 env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=_die_with_parent)
        try:
            if pools.stdout.readline().strip() != "osd-ready":
                raise RgwUnavailable("creating osd.0 failed: " + self._tail(pools.communicate(timeout=5)[1]))
            self._spawn("osd", "ceph-osd", "-f", "-i", "0")
            self._mark("osd-new")
            out, err = pools.communicate(timeout=max(1, self.deadline - time.monotonic()))
            if pools.returncode != 0 or "pools-ready" not in out:
                raise RgwUnavailable("creating RGW's pools failed: " + self._tail(err) +
                                     " | osd: " + self._log_tail("osd"))
            self._mark("pools")
        finally:
            if pools.poll() is None:
                pools.kill()
                pools.wait()

        # radosgw blocks in its start-up until the OSD has booted and the PGs are active,
        # then sets up the default zone and starts answering.
        self._start_gateway()
        self._mark("rgw-answers")
        self._run("radosgw-admin", "user", "create", "--uid", "sluice", "--display-name", "sluice tests",
                  "--access-key", self.access_key, "--secret-key", self.secret_key)
        self._mark("user")
        for b in buckets:
            self.create_bucket(b)
        self._mark("buckets")
        self.startup_seconds = time.monotonic() - self.t0

    def _ceph_conf(self, fsid, memstore_bytes):
        d = self.dir
        return f"""\
[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{self.mon_port}
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
# msgr2 only, loopback only.
ms bind msgr1 = false
ms bind msgr2 = true
ms bind ipv6 = false
# No cephx: this cluster is private to one test. RGW checks S3 SigV4 signatures itself.
auth cluster required = none
auth service required = none
auth client required = none
# Everything lives in this directory, nothing in /var/lib/ceph, /var/log/ceph, /run/ceph.
run dir = {d}/run
pid file = {d}/run/$name.pid
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
mon cluster log file = {d}/log/cluster.log
crash dir = {d}/crash
keyring = {d}/keyring
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
rgw data = {d}/rgw
log to stderr = false
err to stderr = true
# One OSD and no mgr: single-copy pools, few PGs, no autoscaler, no health chatter.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
# CRUSH places replicas across OSDs, not hosts (the default rule is made at mon mkfs).
osd crush chooseleaf type = 0
# Commit each mon change after 0.1 s instead of 1 s: pool creation dominated start-up.
paxos propose interval = 0.1
# A nearly full /tmp must not make the mon shut itself down mid-test.
mon data avail crit = 0
mon data avail warn = 0
# Clients fail rather than hang forever if the OSD is gone.
rados osd op timeout = 60
rados mon op timeout = 60

[client]
# Tools (radosgw-admin, the pool set-up) may run beside each other and the gateway.
admin socket = {d}/run/$name.$pid.asok

[osd]
# Objects live in the OSD's memory; the size is what it reports as capacity.
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd data avail crit = 0

[client.rgw.a]
# radosgw's built-in defaults ask for a "secure" (encrypted, cephx-only) mon connection,
# which `auth none` cannot give: without this it retries authentication forever (-13).
ms mon client mode = crc
rgw frontends = beast endpoint=127.0.0.1:{self.port}
# Reclaim overwritten and deleted objects' space within a minute: with the two-hour
# default, overwrites filled the memstore and RGW then hung.
rgw gc obj min wait = 60
rgw gc processor period = 30
# Less background work on a two-core machine.
rgw dynamic resharding = false
rgw enable usage log = false
"""

    def _mark(self, phase):
        """Records how long start-up took to reach `phase` (self.timings, for reports)."""
        self.timings.append((phase, round(time.monotonic() - self.t0, 3)))

    def _run(self, *args, timeout=30):
        """Runs a Ceph tool to completion; RgwUnavailable with its output on failure."""
        timeout = max(1, min(timeout, self.deadline - time.monotonic()))
        try:
            r = subprocess.run(args, env=self.env, cwd=self.dir, capture_output=True, text=True,
                               timeout=timeout, preexec_fn=_die_with_parent)
        except subprocess.TimeoutExpired:
            raise RgwUnavailable(f"{args[0]} {args[1]} timed out after {timeout:.0f} s") from None
        if r.returncode != 0:
            raise RgwUnavailable(f"{' '.join(args[:3])} failed ({r.returncode}): " +
                                 self._tail(r.stderr + r.stdout))
        return r.stdout

    def _spawn(self, name, *args):
        """Starts a daemon in the foreground (-f), its stdout and stderr in log/<name>.out."""
        with open(os.path.join(self.dir, "log", name + ".out"), "wb") as out:
            p = subprocess.Popen(args, env=self.env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.procs.append((name, p))

    def _start_gateway(self):
        """radosgw on self.port. free_port() only found a port that was free a moment ago:
        when something else (a test running beside this one) took it first, radosgw exits
        98 (address in use), and it starts again on another port."""
        for attempt in range(4):
            self._spawn("rgw", "radosgw", "-f", "-n", "client.rgw.a",
                        "--rgw_frontends", f"beast endpoint=127.0.0.1:{self.port}")
            try:
                self._wait_http()
                return
            except RgwUnavailable as e:
                if attempt == 3 or "Address already in use" not in str(e):
                    raise
            self.procs = [(n, p) for n, p in self.procs if n != "rgw"]
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"

    def _check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise RgwUnavailable(f"ceph {name} exited with status {p.returncode}: " +
                                     self._log_tail(name))

    def _wait_http(self):
        """Until an anonymous GET / (ListBuckets) answers 200."""
        while time.monotonic() < self.deadline:
            self._check_alive()
            with contextlib.suppress(OSError, http.client.HTTPException):
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                try:
                    c.request("GET", "/")
                    if c.getresponse().status == 200:
                        return
                finally:
                    c.close()
            time.sleep(0.05)
        raise RgwUnavailable("radosgw did not answer in time: " + self._log_tail("rgw"))

    def _tail(self, text, lines=8):
        return " | ".join(text.strip().splitlines()[-lines:])

    def _log_tail(self, name):
        """The last lines a daemon wrote, for the RgwUnavailable reason."""
        files = {"mon": "mon.a.log", "osd": "osd.0.log", "rgw": "client.rgw.a.log"}
        text = ""
        for f in (os.path.join(self.dir, "log", name + ".out"), os.path.join(self.dir, "log", files[name])):
            with contextlib.suppress(OSError), open(f, errors="replace") as fh:
                text += fh.read()[-4000:]
        return self._tail(text) or "(no log)"

    # --- S3 ---------------------------------------------------------------------------

    def request(self, method, path, body=b"", headers=None, query="", secret=None):
        """One SigV4-signed S3 request as the test user (path-style): (status, headers, body)."""
        return s3_request(self.endpoint, method, path, body=body, headers=headers, query=query,
                          access_key=self.access_key, secret_key=secret or self.secret_key,
                          region=self.region)

    def create_bucket(self, bucket):
        status, _, body = self.request("PUT", "/" + bucket)
        if 400 <= status < 500:
            # The caller's mistake (InvalidBucketName, say), not RGW's: fail, do not SKIP.
            raise ValueError(f"creating bucket {bucket!r} got {status}: {body[:300]!r}")
        if status != 200:
            raise RgwUnavailable(f"creating bucket {bucket} got {status}: {body[:300]!r}")

    # --- shut-down --------------------------------------------------------------------

    def close(self):
        """Stops radosgw, then the OSD and the mon, by PID, and removes the directory.

        radosgw gets SIGTERM (it exits in well under a second). The OSD and mon get SIGKILL
        straight away: their data is thrown away anyway, and a memstore OSD's orderly
        shutdown would first write every object it holds into the directory."""
        if self.closed:
            return
        self.closed = True
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if name == "rgw" else signal.SIGKILL)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
        if self.dir and os.environ.get("SLUICE_RGW_KEEP"):
            print(f"rgw_harness: SLUICE_RGW_KEEP is set: logs left in {self.dir}", file=sys.stderr)
        elif self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- a small SigV4 signer (AWS Signature Version 4, written from the specification) ------

def _quote(s, keep_slash):
    return urllib.parse.quote(s, safe="-_.~" + ("/" if keep_slash else ""))


def sign_v4(method, host, path, query, headers, body, access_key, secret_key, region="us-east-1",
            service="s3", now=None):
    """Returns `headers` plus x-amz-date, x-amz-content-sha256 and Authorization, signing
    every header given. `path` is unencoded ("/bucket/key"); `query` a raw query string."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    h = {k.lower(): str(v) for k, v in (headers or {}).items()}
    h["host"] = host
    h["x-amz-date"] = amz_date
    h["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    signed = sorted(h)
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    canonical_query = "&".join(sorted(f"{_quote(k, False)}={_quote(v, False)}" for k, v in pairs))
    canonical = "\n".join([method, _quote(path, True), canonical_query,
                           "".join(f"{k}:{' '.join(h[k].split())}\n" for k in signed),
                           ";".join(signed), h["x-amz-content-sha256"]])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                          f"SignedHeaders={';'.join(signed)}, Signature={signature}")
    return h


def s3_request(endpoint, method, path, body=b"", headers=None, query="", *, access_key, secret_key,
               region="us-east-1", timeout=30):
    """A signed request to `endpoint` (http://host:port): (status, {lower-case headers}, body)."""
    u = urllib.parse.urlsplit(endpoint)
    h = sign_v4(method, u.netloc, path, query, headers, body, access_key, secret_key, region)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request(method, _quote(path, True) + ("?" + query if query else ""), body=body, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


# --- CLI: `serve` for tests in other languages -------------------------------------------

def _serve(argv):
    import argparse
    ap = argparse.ArgumentParser(
        prog="rgw_harness.py serve",
        description="Start RGW, print one JSON line, stay up until stdin EOF or SIGTERM.")
    ap.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    ap.add_argument("--no-stdin", action="store_true", help="ignore stdin; wait only for a signal")
    args = ap.parse_args(argv)

    class Stop(BaseException):  # like KeyboardInterrupt: Rgw's start-up lets it through
        pass

    def on_signal(signum, frame):
        raise Stop()

    # Installed before start-up, so a SIGTERM that arrives while the cluster is starting
    # still unwinds through Rgw's clean-up.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rgw = None
    try:
        try:
            rgw = Rgw(buckets=tuple(args.bucket))
        except RgwUnavailable as e:
            print(json.dumps({"skip": e.reason}), flush=True)
            return 0
        print(json.dumps({"endpoint": rgw.endpoint, "access_key": rgw.access_key,
                          "secret_key": rgw.secret_key}), flush=True)
        if args.no_stdin or sys.stdin is None:
            while True:
                signal.pause()
        else:
            # An empty read is EOF: the test closed its end of the pipe, or exited (even
            # killed), so the cluster never outlives the test that asked for it.
            while sys.stdin.buffer.read1(65536):
                pass
    except Stop:
        pass
    finally:
        # No second signal may interrupt the clean-up.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if rgw:
            rgw.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        sys.exit(_serve(sys.argv[2:]))
    print("usage: rgw_harness.py serve [--bucket NAME]... [--no-stdin]\n"
          "Starts a Ceph RGW on loopback and prints one JSON line: endpoint, access_key,\n"
          "secret_key (or skip); stays up until stdin reaches EOF or SIGTERM/SIGINT.", file=sys.stderr)
    sys.exit(2)
