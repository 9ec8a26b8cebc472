#!/usr/bin/python3
"""Fault injection for sluice's S3 store: real `sluice cp` runs against a real s3rver through
a loopback HTTP proxy that misbehaves on command.

    /usr/bin/python3 tests/integration/s3_faults_test.py build/bin/sluice

Standard library only (Debian's /usr/bin/python3). Prints "SKIP: s3rver not installed" and
exits 77 (SKIP to ctest) without s3rver (see s3_harness.find_s3rver).

The proxy (FaultProxy) forwards every request (GET, HEAD, PUT, POST, DELETE) with its headers
and body to s3rver and streams the answer back; each test gives it rules that pick, per
request, one fault:
  - ("error", status, code)  answer with an S3 XML error instead of forwarding (503, 503
                             SlowDown, 500 InternalError, 400 RequestTimeout, 403 AccessDenied)
  - ("reset", fraction)      forward, send the headers (full Content-Length) and that fraction
                             of the body, then reset the connection (SO_LINGER 0: an RST)
  - ("truncate", fraction)   the same, but close cleanly (FIN) after the short body
  - ("eof", fraction)        no Content-Length at all: a close-delimited, short body
  - ("delay", before, mid)   sleep before the headers, and again halfway through the body
  - ("lost",)                forward to s3rver, then reset without answering (the request
                             took effect, the client never hears)
  - ("drop",)                do not forward; close the connection (FIN) without answering, as
                             a server does with a keep-alive connection it has timed out
  - ("head-size", n)         forward, but answer a HEAD with Content-Length n
  - ("list-extra", key)      forward, but add `key` to a ListObjectsV2 answer
and can swap an object mid-read (SwapAfterFirstRangedGet).

Two things s3rver 3.7.1 lacks, which the proxy supplies so that sluice meets S3 semantics:
  - If-Match on GET: s3rver ignores it (a GET with a stale If-Match still gets 206). The
    proxy enforces it: before forwarding a GET that carries If-Match it HEADs the object on
    s3rver and answers 412 PreconditionFailed (S3's XML) when the ETag differs.
  - AbortMultipartUpload (DELETE ?uploadId=): s3rver answers 405. The proxy performs it by
    removing the upload's directory from s3rver's store (<dir>/<bucket>/._S3rver_uploads/<id>),
    answering 204, or 404 NoSuchUpload. ListMultipartUploads (GET ?uploads) is not
    implemented either (501), so leftover uploads are found by listing that directory.

Every test asserts one of two outcomes: the copy succeeded and the destination holds exactly
the source bytes, or it exited non-zero with a one-line error naming the object (as
s3://bucket/key, or for transport errors the request URL) and left nothing behind (no destination file, no .NAME.sluice-* temporary, no object, no multipart
upload). Retries are checked through `--json`'s "retries" against the faults injected.
The last line printed is "N passed, M failed"; the exit status is non-zero on any failure.
"""
import contextlib
import hashlib
import http.client
import http.server
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse



class _Server(http.server.ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: sluice opens 16 connections at once, and the
    # overflow was reset, which showed up as retries no fault had caused. Real servers
    # listen with far more.
    request_queue_size = 128

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3_harness import Runner, S3rver, find_s3rver, sluice  # noqa: E402

BUCKET = "test"
MiB = 1 << 20
BIG = 20 * MiB          # four 5 MiB parts / ranged GETs
PART = "5M"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
              "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}
CHUNK = 64 << 10


def s3_error_xml(code, message, resource=""):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{resource}</Resource><RequestId>FAULT{random.randrange(1 << 32):08X}</RequestId>"
            "</Error>").encode()


MESSAGES = {
    "ServiceUnavailable": "Please reduce your request rate.",
    "SlowDown": "Please reduce your request rate.",
    "InternalError": "We encountered an internal error. Please try again.",
    "RequestTimeout": "Your socket connection to the server was not read from or written to "
                      "within the timeout period.",
    "AccessDenied": "Access Denied",
    "PreconditionFailed": "At least one of the pre-conditions you specified did not hold",
    "NoSuchUpload": "The specified upload does not exist.",
}


# --- direct access to s3rver (anonymous requests: s3rver allows them) -----------------------

def direct(s3, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", s3.port, timeout=30)
    try:
        conn.request(method, urllib.parse.quote(path), body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def put_direct(s3, key, data):
    status, headers, body = direct(s3, "PUT", f"/{BUCKET}/{key}", body=data)
    assert status == 200, f"direct PUT {key}: {status} {body[:200]!r}"
    return headers.get("etag")


def head_direct(s3, key):
    status, headers, _ = direct(s3, "HEAD", f"/{BUCKET}/{key}")
    return status, headers.get("etag")


def get_direct(s3, key):
    status, _, body = direct(s3, "GET", f"/{BUCKET}/{key}")
    assert status == 200, f"direct GET {key}: {status}"
    return body


def uploads_dir(s3, bucket=BUCKET):
    return os.path.join(s3.dir, bucket, "._S3rver_uploads")


def pending_uploads(s3):
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir(uploads_dir(s3)))
    return []


# --- the proxy --------------------------------------------------------------------------------

class Req:
    """One request as the proxy saw it."""

    def __init__(self, method, raw_path, headers, body, conn_index):
        self.method = method
        self.conn_index = conn_index  # 1 for the first request on its connection, 2, ...
        self.raw_path = raw_path
        self.headers = headers
        self.body = body
        parts = urllib.parse.urlsplit(raw_path)
        self.query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
        path = urllib.parse.unquote(parts.path)
        bucket, _, key = path.lstrip("/").partition("/")
        self.bucket, self.key = bucket, key
        self.range = headers.get("Range")

    @property
    def kind(self):
        """A coarse name for what the request does, for rules and logs."""
        q = self.query
        if self.method == "HEAD":
            return "head"
        if self.method == "GET":
            return "list" if not self.key else "get"
        if self.method == "PUT":
            return "put-part" if "partNumber" in q else "put"
        if self.method == "POST":
            if "uploads" in q:
                return "initiate"
            if "uploadId" in q:
                return "complete"
            return "post"
        if self.method == "DELETE":
            return "abort" if "uploadId" in q else "delete"
        return self.method.lower()

    def __repr__(self):
        return f"{self.method} {self.raw_path}" + (f" [{self.range}]" if self.range else "")


class FaultProxy:
    """A threaded loopback proxy in front of s3rver. `rules` are callables (req) -> action or
    None, tried in order under one lock (so their counters need no locking of their own); the
    first action returned applies. `swap`, if given, is a SwapAfterFirstRangedGet."""

    def __init__(self, s3, rules=(), swap=None, enforce_if_match=True):
        self.s3 = s3
        self.enforce_if_match = enforce_if_match  # False: behave like s3rver (and some others)
        self.rules = list(rules)
        self.swap = swap
        self.lock = threading.Lock()
        self.log = []            # (Req, action or None)
        self.injected = []       # (Req, action) for every fault applied
        self.created_uploads = []
        self.aborted_uploads = []
        self.errors = []         # tracebacks from handler threads
        self.server = _Server(("127.0.0.1", 0), _make_handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def decide(self, req):
        with self.lock:
            action = None
            for rule in self.rules:
                action = rule(req)
                if action:
                    break
            self.log.append((req, action))
            if action:
                self.injected.append((req, action))
            return action

    def seen(self, kind=None):
        with self.lock:
            return [r for r, _ in self.log if kind is None or r.kind == kind]

    def faults(self, kind=None):
        with self.lock:
            return [(r, a) for r, a in self.injected if kind is None or r.kind == kind]

    def check_healthy(self):
        assert not self.errors, "proxy handler raised:\n" + "\n".join(self.errors)


class SwapAfterFirstRangedGet:
    """After the first ranged GET of `key` has been read from s3rver (and before its body goes
    back to the client), replaces the object on s3rver with `new_bytes`, so that every later
    GET pinned with If-Match to the old ETag gets 412."""

    def __init__(self, key, new_bytes):
        self.key = key
        self.new_bytes = new_bytes
        self.done = False
        self.lock = threading.Lock()

    def claim(self, req):
        with self.lock:
            if self.done or req.kind != "get" or req.key != self.key or not req.range:
                return False
            self.done = True
            return True


def _make_handler(proxy):
    s3 = proxy.s3

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3 does; curl reuses connections
        timeout = 30                   # an idle keep-alive connection is dropped after this

        def log_message(self, *args):
            pass

        def setup(self):
            super().setup()
            self.requests_here = 0  # requests seen on this connection

        def do_any(self):
            try:
                self._serve()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away: not the proxy's fault
            except Exception:  # recorded and checked by every test
                proxy.errors.append(traceback.format_exc())
                self.close_connection = True

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_any

        def _read_body(self):
            # The whole request body is read before any answer, so an error answered early
            # leaves the keep-alive connection in step.
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        # -- answers that do not come from s3rver --

        def _answer(self, status, body=b"", headers=()):
            self.send_response_only(status)
            self.send_header("Date", self.date_time_string())
            self.send_header("x-amz-request-id", "FAULTPROXY")
            for k, v in headers:
                self.send_header(k, v)
            if body:
                self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _reset(self):
            """Abortive close: RST, not FIN."""
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()

        # -- the request --

        def _serve(self):
            body = self._read_body()
            self.requests_here += 1
            req = Req(self.command, self.path, self.headers, body, self.requests_here)
            action = proxy.decide(req)
            kind = action[0] if action else None

            if kind == "error":
                _, status, code = action
                self._answer(status, s3_error_xml(code, MESSAGES.get(code, code), f"/{req.bucket}/{req.key}"))
                return

            if kind == "drop":
                self.close_connection = True
                return

            if req.kind == "abort":
                # s3rver 3.7.1 has no AbortMultipartUpload (405): do what S3 would.
                upload_id = req.query["uploadId"]
                path = os.path.join(uploads_dir(s3, req.bucket), os.path.basename(upload_id))
                with proxy.lock:
                    proxy.aborted_uploads.append(upload_id)
                if upload_id and os.path.isdir(path):
                    shutil.rmtree(path)
                    self._answer(204)
                else:
                    self._answer(404, s3_error_xml("NoSuchUpload", MESSAGES["NoSuchUpload"]))
                return

            if kind == "delay":
                time.sleep(action[1])

            if req.kind == "get" and req.headers.get("If-Match") and proxy.enforce_if_match:
                # s3rver 3.7.1 ignores If-Match on GET: enforce it here, as S3 does.
                status, etag = head_direct(s3, req.key)
                wanted = [t.strip() for t in req.headers["If-Match"].split(",")]
                if status == 200 and "*" not in wanted and etag not in wanted:
                    self._answer(412, s3_error_xml("PreconditionFailed", MESSAGES["PreconditionFailed"],
                                                   f"/{req.bucket}/{req.key}"))
                    return

            up = http.client.HTTPConnection("127.0.0.1", s3.port, timeout=60)
            try:
                up.putrequest(req.method, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in HOP_BY_HOP:
                        up.putheader(k, v)
                up.endheaders(body if body else None)
                resp = up.getresponse()

                if kind == "lost":  # it reached s3rver; the answer never reaches the client
                    resp.read()
                    self._reset()
                    return

                headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
                has_body = req.method != "HEAD" and resp.status not in (204, 304)
                length = resp.getheader("Content-Length")
                buffered = None
                if has_body and (length is None or req.kind == "initiate" or kind == "list-extra"):
                    buffered = resp.read()
                    headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                    headers.append(("Content-Length", str(len(buffered))))
                    length = str(len(buffered))
                if kind == "list-extra" and resp.status == 200:
                    # A buggy or hostile server: a key the listing was not asked for.
                    extra = (f"<Contents><Key>{action[1]}</Key><Size>1</Size>"
                             f"<ETag>&quot;x&quot;</ETag></Contents>").encode()
                    buffered = buffered.replace(b"</ListBucketResult>", extra + b"</ListBucketResult>")
                    headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                    headers.append(("Content-Length", str(len(buffered))))
                    length = str(len(buffered))
                if req.kind == "initiate" and resp.status == 200:
                    m = re.search(rb"<UploadId>([^<]+)</UploadId>", buffered)
                    if m:
                        with proxy.lock:
                            proxy.created_uploads.append(m.group(1).decode())
                if proxy.swap and resp.status == 206 and proxy.swap.claim(req):
                    buffered = resp.read()  # the old bytes, read before the swap
                    put_direct(s3, proxy.swap.key, proxy.swap.new_bytes)

                total = int(length) if has_body and length is not None else 0
                cut = total
                if kind in ("reset", "truncate", "eof"):
                    cut = min(total - 1, int(total * action[1])) if total else 0

                self.send_response_only(resp.status, resp.reason)
                for k, v in headers:
                    if kind == "eof" and k.lower() == "content-length":
                        continue
                    if kind == "head-size" and k.lower() == "content-length":
                        v = str(action[1])  # a HEAD that lies about the object's size
                    self.send_header(k, v)
                if kind in ("truncate", "eof"):
                    self.send_header("Connection", "close")
                self.end_headers()

                sent = 0
                pos = 0
                while has_body and sent < cut:
                    n = min(CHUNK, cut - sent)
                    if buffered is not None:
                        data = buffered[pos:pos + n]
                        pos += len(data)
                    else:
                        data = resp.read(n)
                    if not data:
                        break
                    self.wfile.write(data)
                    if kind == "delay" and sent < total // 2 <= sent + len(data):
                        time.sleep(action[2])
                    sent += len(data)

                if kind == "reset":
                    self._reset()
                elif kind in ("truncate", "eof"):
                    self.close_connection = True  # FIN after the short body
            finally:
                up.close()

    return Handler


# --- rules ------------------------------------------------------------------------------------

def where(kind=None, key=None):
    def match(req):
        return (kind is None or req.kind == kind or (isinstance(kind, tuple) and req.kind in kind)) and \
               (key is None or req.key == key)
    return match


def first_n(n, action, match=lambda r: True):
    left = [n]

    def rule(req):
        if left[0] > 0 and match(req):
            left[0] -= 1
            return action
        return None
    return rule


def always(action, match):
    return lambda req: action if match(req) else None


def on_reused_connection(match):
    return lambda req: req.conn_index > 1 and match(req)


def on_fresh_connection(match):
    return lambda req: req.conn_index == 1 and match(req)


def range_from(offset):
    return lambda req: req.kind == "get" and (req.range or "").startswith(f"bytes={offset}-")


def random_503(probability, seed, max_in_a_row=3):
    """Fails about `probability` of requests with 503, decided by a hash of the request and how
    many times the same request was seen before: reproducible whatever the thread order, and
    never more than `max_in_a_row` times for one request (sluice tries each up to 5 times)."""
    seen = {}

    def rule(req):
        ident = (req.method, req.raw_path, req.range)
        n = seen.get(ident, 0)
        seen[ident] = n + 1
        if n >= max_in_a_row:
            return None
        h = hashlib.sha256(f"{seed}|{ident}|{n}".encode()).digest()
        if int.from_bytes(h[:8], "big") / 2.0 ** 64 < probability:
            return ("error", 503, "ServiceUnavailable" if h[8] & 1 else "SlowDown")
        return None
    return rule


# --- running sluice ---------------------------------------------------------------------------

class Ctx:
    def __init__(self, binary, s3, scratch):
        self.binary = binary
        self.s3 = s3
        self.scratch = scratch
        self.big = random.Random(20240611).randbytes(BIG)
        self.big_path = os.path.join(scratch, "big.bin")
        with open(self.big_path, "wb") as f:
            f.write(self.big)
        self.n = 0

    def fresh_dir(self, name):
        self.n += 1
        d = os.path.join(self.scratch, f"{self.n:02d}-{name}")
        os.makedirs(d)
        return d

    def seed_big(self, key):
        put_direct(self.s3, key, self.big)

    def cp(self, proxy, src, dst, *extra, timeout=60, env=None):
        t0 = time.monotonic()
        r = sluice(self.binary, "cp", src, dst, "--json", "--no-progress", "--part-size", PART, *extra,
                   endpoint=proxy.endpoint, timeout=timeout, env=env)
        r.elapsed = time.monotonic() - t0
        r.summary = None
        lines = r.stdout.strip().splitlines()
        if lines:
            with contextlib.suppress(ValueError):
                r.summary = json.loads(lines[-1])
        proxy.check_healthy()
        return r


def describe(r):
    return f"rc={r.returncode} stdout={r.stdout.strip()!r} stderr={r.stderr.strip()!r}"


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def retries(r):
    assert r.summary is not None, "no --json summary: " + describe(r)
    return r.summary["retries"]


def assert_download_ok(r, dest, expected):
    assert r.returncode == 0, "download failed: " + describe(r)
    with open(dest, "rb") as f:
        got = f.read()
    assert len(got) == len(expected), f"{dest}: {len(got)} bytes, expected {len(expected)}"
    assert got == expected, f"{dest}: bytes differ from the source"
    d = os.path.dirname(dest)
    assert os.listdir(d) == [os.path.basename(dest)], f"left behind in {d}: {os.listdir(d)}"


def assert_failed_cleanly(r, uri, dest_dir=None):
    assert r.returncode != 0, "expected a failure: " + describe(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}: {r.stderr!r}"
    # HTTP errors name s3://bucket/key; transport errors name the request URL, which holds
    # /bucket/key with a path-style endpoint.
    path = "/" + uri[len("s3://"):]
    assert uri in lines[0] or re.search(r"https?://[^/ ]+" + re.escape(path) + r"(\?|:| |$)", lines[0]), \
        f"error does not name {uri}: {lines[0]!r}"
    if dest_dir is not None:
        assert os.listdir(dest_dir) == [], f"left behind in {dest_dir}: {os.listdir(dest_dir)}"


def assert_no_object(ctx, proxy, key):
    status, _ = head_direct(ctx.s3, key)
    assert status == 404, f"s3://{BUCKET}/{key} exists after a failed upload (HEAD {status})"
    assert not os.path.exists(ctx.s3.object_path(BUCKET, key))
    left = [u for u in proxy.created_uploads if u in pending_uploads(ctx.s3)]
    assert not left, f"multipart uploads left behind: {left} (aborted: {proxy.aborted_uploads})"


def assert_object(ctx, key, expected):
    got = get_direct(ctx.s3, key)
    assert len(got) == len(expected), f"s3://{BUCKET}/{key}: {len(got)} bytes, expected {len(expected)}"
    assert got == expected, f"s3://{BUCKET}/{key}: bytes differ from the source"


# --- the tests --------------------------------------------------------------------------------

def download_case(ctx, key, rules, expect_retries=None, swap=None):
    """Downloads a 20 MiB object through a proxy with `rules`; it must succeed, byte-exact."""
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    dest = os.path.join(d, key)
    with FaultProxy(ctx.s3, rules, swap) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", dest)
        if r.returncode != 0:  # wrong, but it must at least have failed cleanly
            assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
            raise AssertionError("download failed (cleanly, nothing left behind): " + describe(r))
        assert_download_ok(r, dest, ctx.big)
        assert len(p.seen("get")) >= 4, f"expected several ranged GETs, saw {p.seen('get')}"
        n = len(p.faults())
        assert n >= 1 or not rules, f"no fault was injected: {p.log}"
        if expect_retries is None:
            expect_retries = n
        assert retries(r) in as_tuple(expect_retries), f"retries {retries(r)}, faults injected {n}: {p.faults()}"
        return r, p


def test_download_first_503s(ctx):
    # The HEAD and then the first GET get 503s; then everything passes.
    _, p = download_case(ctx, "dl-503.bin", [first_n(3, ("error", 503, "ServiceUnavailable"))])
    assert len(p.faults()) == 3


def test_download_slowdown_on_ranged_gets(ctx):
    _, p = download_case(ctx, "dl-slowdown.bin", [first_n(4, ("error", 503, "SlowDown"), where("get"))])
    assert len(p.faults("get")) == 4


def test_download_other_retryables(ctx):
    # 500 InternalError, 502, 504, 429 and 400 RequestTimeout (how S3 really sends it).
    # Spread over the four ranges, at most two per request (sluice tries each 5 times).
    P = 5 * MiB
    rules = [first_n(1, ("error", 500, "InternalError"), range_from(0)),
             first_n(1, ("error", 502, "BadGateway"), range_from(0)),
             first_n(1, ("error", 504, "GatewayTimeout"), range_from(P)),
             first_n(1, ("error", 429, "TooManyRequests"), range_from(2 * P)),
             first_n(1, ("error", 400, "RequestTimeout"), range_from(3 * P))]
    _, p = download_case(ctx, "dl-mixed.bin", rules)
    assert len(p.faults()) == 5


def test_download_reset_mid_body(ctx):
    _, p = download_case(ctx, "dl-reset.bin", [first_n(3, ("reset", 0.4), where("get"))])
    assert len(p.faults()) == 3


def test_download_truncated_body(ctx):
    _, p = download_case(ctx, "dl-trunc.bin", [first_n(3, ("truncate", 0.7), where("get"))])
    assert len(p.faults()) == 3


def test_download_close_delimited_short_body(ctx):
    # No Content-Length, body cut short by a close: sluice may retry (and succeed) or fail,
    # but must never keep a short range.
    key = "dl-eof.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    dest = os.path.join(d, key)
    with FaultProxy(ctx.s3, [first_n(1, ("eof", 0.5), lambda r: r.kind == "get" and r.range
                                         and not r.range.startswith("bytes=0-"))]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", dest)
    if r.returncode == 0:
        assert_download_ok(r, dest, ctx.big)
        print("     (short close-delimited body: retried, copy succeeded)")
    else:
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        print(f"     (short close-delimited body: copy failed cleanly: {r.stderr.strip()})")


def test_download_delays(ctx):
    # Every response waits 0.3 s, and the ranged GETs pause 1 s halfway through their bodies:
    # slow, but no retries.
    _, p = download_case(ctx, "dl-delay.bin", [always(("delay", 0.3, 1.0), where())], expect_retries=0)


def test_download_every_get_truncated(ctx):
    # Permanent: every GET is cut short. sluice gives up after its attempts, cleanly.
    key = "dl-always-trunc.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    with FaultProxy(ctx.s3, [always(("truncate", 0.5), where("get"))]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert retries(r) >= 1, "truncated bodies were not retried: " + describe(r)


def test_download_object_replaced_mid_read(ctx):
    key = "dl-swap.bin"
    ctx.seed_big(key)
    new = bytes(b ^ 0xFF for b in ctx.big[:MiB]) + ctx.big[MiB:]  # same size, other ETag
    d = ctx.fresh_dir(key)
    dest = os.path.join(d, key)
    swap = SwapAfterFirstRangedGet(key, new)
    with FaultProxy(ctx.s3, [], swap) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", dest)
        assert swap.done, "the object was never swapped"
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert "replaced" in r.stderr or "PreconditionFailed" in r.stderr, describe(r)
        assert retries(r) == 0, "412 must not be retried: " + describe(r)
    # Without faults the next copy gets the new object, whole.
    with FaultProxy(ctx.s3) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", dest)
        assert_download_ok(r, dest, new)


def test_download_replaced_mid_read_if_match_ignored(ctx):
    # Like s3rver (and some S3-compatible servers), the proxy answers 206 to a ranged GET
    # with a stale If-Match: sluice must see the new ETag on the response itself.
    key = "dl-swap-noifmatch.bin"
    ctx.seed_big(key)
    new = bytes(b ^ 0xFF for b in ctx.big[:MiB]) + ctx.big[MiB:]  # same size, other ETag
    d = ctx.fresh_dir(key)
    swap = SwapAfterFirstRangedGet(key, new)
    with FaultProxy(ctx.s3, [], swap, enforce_if_match=False) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
        assert swap.done, "the object was never swapped"
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert "ETag" in r.stderr and "conflict" in r.stderr, describe(r)
        assert retries(r) == 0, "a changed ETag must not be retried: " + describe(r)


def verify_cache(ctx, home):
    r = sluice(ctx.binary, "cache", "verify", "--json", env={"SLUICE_HOME": home})
    assert r.returncode == 0, describe(r)
    rep = json.loads(r.stdout)
    assert rep["corrupt"] == [], rep
    return rep


def test_download_through_the_cache_reset_mid_body(ctx):
    # cp --cache writes chunks to NVMe while their GET still streams: bodies cut off and
    # retried must leave only the right bytes cached, and a second copy reads no GET.
    key = "dl-cache-reset.bin"
    ctx.seed_big(key)
    home = ctx.fresh_dir("home-" + key)
    env = {"SLUICE_HOME": home}
    rules = [first_n(2, ("reset", 0.6), where("get")), first_n(1, ("truncate", 0.8), where("get"))]
    d, d2 = ctx.fresh_dir(key), ctx.fresh_dir(key + "-again")
    with FaultProxy(ctx.s3, rules) as p:  # one endpoint: the cache is keyed by it
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key), "--cache", env=env)
        assert_download_ok(r, os.path.join(d, key), ctx.big)
        assert len(p.faults()) == 3 and retries(r) >= 3, describe(r)
        assert verify_cache(ctx, home)["chunks"] == BIG // (4 * MiB)
        gets = len(p.seen("get"))
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d2, key), "--cache", env=env)
        assert_download_ok(r, os.path.join(d2, key), ctx.big)
        assert len(p.seen("get")) == gets, f"read again from the server: {p.seen('get')[gets:]}"


def test_download_through_the_cache_replaced_mid_read_if_match_ignored(ctx):
    # The object changes after the first GET, on a server that ignores If-Match: the copy
    # fails, no chunk of the new bytes is kept under the old version, and the next copy
    # gets the new object whole.
    key = "dl-cache-swap.bin"
    ctx.seed_big(key)
    new = bytes(b ^ 0xFF for b in ctx.big[:MiB]) + ctx.big[MiB:]
    home = ctx.fresh_dir("home-" + key)
    env = {"SLUICE_HOME": home}
    d = ctx.fresh_dir(key)
    swap = SwapAfterFirstRangedGet(key, new)
    with FaultProxy(ctx.s3, [], swap, enforce_if_match=False) as p:  # one endpoint, one cache key
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key), "--cache", env=env)
        assert swap.done, "the object was never swapped"
        assert r.returncode != 0 and "ETag" in r.stderr and "conflict" in r.stderr, describe(r)
        assert os.listdir(d) == [], f"left behind in {d}: {os.listdir(d)}"
        verify_cache(ctx, home)
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key), "--cache", "--revalidate-ms", "0",
                   env=env)
        assert_download_ok(r, os.path.join(d, key), new)
    verify_cache(ctx, home)


def test_download_head_size_disagrees_with_get(ctx):
    # The HEAD says fewer bytes than the object has: the first GET's Content-Range total
    # gives it away, and nothing short is written.
    key = "dl-headlies.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    with FaultProxy(ctx.s3, [always(("head-size", BIG - 1000), where("head"))],
                    enforce_if_match=False) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert "conflict" in r.stderr and str(BIG) in r.stderr, describe(r)


def test_download_stalled_server_abandoned(ctx):
    # The server accepts the GET and then says nothing: abandoned after --stall-timeout, not
    # after max_attempts times it.
    key = "dl-stall.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    with FaultProxy(ctx.s3, [always(("delay", 30, 0), where("get"))]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key), "--stall-timeout", "2")
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert "stall" in r.stderr and "timed_out" in r.stderr, describe(r)
        assert r.elapsed < 15, f"took {r.elapsed:.1f} s with a 2 s stall timeout"


def start_cp(ctx, proxy, src, dst, *extra):
    e = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return subprocess.Popen([ctx.binary, "cp", src, dst, "--json", "--no-progress", "--part-size", PART,
                             "--endpoint-url", proxy.endpoint, *extra],
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def test_download_interrupted_cleans_up(ctx):
    # SIGINT (and SIGTERM) mid-download: exit 130 (143), and nothing left: no file, no
    # temporary file, no .sluice-tmp directory.
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        key = f"dl-sig{int(sig)}.bin"
        ctx.seed_big(key)
        d = ctx.fresh_dir(key)
        with FaultProxy(ctx.s3, [always(("delay", 0, 1.5), where("get"))]) as p:
            proc = start_cp(ctx, p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
            wait_for(lambda: len(p.seen("get")) >= 2)
            time.sleep(0.3)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, f"rc {proc.returncode}, expected {code}: {out} {err}"
        assert json.loads(out.strip().splitlines()[-1])["cancelled"] is True, out
        assert os.listdir(d) == [], f"left behind in {d}: {os.listdir(d)}"


def test_upload_interrupted_aborts_multipart(ctx):
    # Twelve parts, each answered after 1 s, eight in flight: the signal comes while parts
    # are still being handed to the upload (a signal during the final commit lets it finish).
    key = "ul-sigterm.bin"
    d = ctx.fresh_dir(key)
    src = os.path.join(d, "src.bin")
    with open(src, "wb") as f:
        f.write(ctx.big * 3)
    with FaultProxy(ctx.s3, [always(("delay", 1.0, 0), where("put-part"))]) as p:
        proc = start_cp(ctx, p, src, f"s3://{BUCKET}/{key}")
        wait_for(lambda: len(p.seen("put-part")) >= 1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, f"rc {proc.returncode}: {out} {err}"
        assert p.created_uploads and p.aborted_uploads == p.created_uploads, \
            f"created {p.created_uploads}, aborted {p.aborted_uploads}"
        assert_no_object(ctx, p, key)
    assert os.listdir(d) == ["src.bin"]


def test_kill9_debris_is_ignored_then_reaped(ctx):
    # kill -9 mid-download leaves the temporary file; a recursive upload of that directory
    # must not upload it, and the next run that opens the directory removes it (its owner is
    # gone).
    key = "dl-kill9.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir("kill9")
    with FaultProxy(ctx.s3, [always(("delay", 0, 1.5), where("get"))]) as p:
        proc = start_cp(ctx, p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
        wait_for(lambda: len(p.seen("get")) >= 2)
        time.sleep(0.3)
        proc.kill()
        proc.communicate(timeout=30)
    tmp = os.path.join(d, ".sluice-tmp")
    assert os.path.isdir(tmp) and os.listdir(tmp), f"kill -9 left no temporary file: {os.listdir(d)}"
    with open(os.path.join(d, "real.txt"), "wb") as f:
        f.write(b"the only object")
    with FaultProxy(ctx.s3) as p:
        r = ctx.cp(p, d, f"s3://{BUCKET}/after-kill/", "--recursive")
        assert r.returncode == 0, describe(r)
        assert r.summary["objects"] == 1, describe(r)
    status, _ = head_direct(ctx.s3, "after-kill/real.txt")
    assert status == 200
    assert not os.path.exists(tmp), f"stale temporary files not removed: {os.listdir(tmp)}"


def test_listing_outside_the_prefix_is_refused(ctx):
    # Defect 5: a listing with a key outside the prefix asked for is an error naming the
    # key, not an abort and not a silent skip; nothing is downloaded. A key inside it that
    # would escape the destination fails that object alone (exit 1), naming it.
    put_direct(ctx.s3, "listed/a.bin", b"a")
    for evil, why, copied in (("elsewhere/evil.bin", "outside the prefix", []),
                              ("listed/../../escape", "no valid destination", ["a.bin"])):
        d = ctx.fresh_dir("listed")
        with FaultProxy(ctx.s3, [always(("list-extra", evil), where("list"))]) as p:
            r = ctx.cp(p, f"s3://{BUCKET}/listed/", d, "--recursive")
        assert r.returncode == 1, describe(r)
        assert evil in r.stderr and why in r.stderr, describe(r)
        assert sorted(os.listdir(d)) == copied, os.listdir(d)
        assert not os.path.exists(os.path.join(os.path.dirname(d), "escape"))


def test_download_403(ctx):
    key = "dl-403.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir(key)
    with FaultProxy(ctx.s3, [always(("error", 403, "AccessDenied"), where())]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/{key}", os.path.join(d, key))
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert len(p.seen()) == 1, f"403 was retried: {p.seen()}"
        assert retries(r) == 0
        assert r.elapsed < 10


def test_download_403_on_get(ctx):
    # A recursive copy knows sizes and ETags from the listing: the 403 comes on the GET, with
    # an AccessDenied body.
    key = "dl403/obj.bin"
    ctx.seed_big(key)
    d = ctx.fresh_dir("dl403")
    with FaultProxy(ctx.s3, [always(("error", 403, "AccessDenied"), where("get"))]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/dl403/", d, "--recursive")
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}", d)
        assert "AccessDenied" in r.stderr, describe(r)
        assert len(p.seen("get")) == 1, f"403 was retried: {p.seen('get')}"
        assert retries(r) == 0


def test_download_404(ctx):
    d = ctx.fresh_dir("missing")
    with FaultProxy(ctx.s3) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/no/such/key.bin", os.path.join(d, "key.bin"))
        assert_failed_cleanly(r, f"s3://{BUCKET}/no/such/key.bin", d)
        # Not retried; one HEAD of the bucket asks whether the key or the bucket is missing.
        assert [str(x) for x in p.seen()] == [f"HEAD /{BUCKET}/no/such/key.bin", f"HEAD /{BUCKET}"], \
            f"404 retried, or the bucket not asked about: {p.seen()}"
        assert retries(r) == 0
    with FaultProxy(ctx.s3) as p:
        r = ctx.cp(p, "s3://no-such-bucket/key.bin", os.path.join(d, "key.bin"))
        assert r.returncode == 1 and "no bucket 'no-such-bucket'" in r.stderr, r.stderr


def upload_case(ctx, key, rules, expect_retries=None):
    with FaultProxy(ctx.s3, rules) as p:
        r = ctx.cp(p, ctx.big_path, f"s3://{BUCKET}/{key}")
        if r.returncode != 0:  # wrong, but it must at least have failed cleanly
            assert_failed_cleanly(r, f"s3://{BUCKET}/{key}")
            assert_no_object(ctx, p, key)
            raise AssertionError("upload failed (cleanly, nothing left behind): " + describe(r))
        assert_object(ctx, key, ctx.big)
        assert len(p.seen("put-part")) >= 4, f"expected a multipart upload, saw {p.seen()}"
        assert not [u for u in p.created_uploads if u in pending_uploads(ctx.s3)], "uploads left behind"
        n = len(p.faults())
        assert n >= 1 or not rules, f"no fault was injected: {p.log}"
        assert retries(r) in as_tuple(n if expect_retries is None else expect_retries), \
            f"retries {retries(r)}, faults injected {n}: {p.faults()}"
        return r, p


def test_upload_first_503s(ctx):
    # The initiate, then the first part, get 503s.
    upload_case(ctx, "ul-503.bin", [first_n(3, ("error", 503, "ServiceUnavailable"))])


def test_upload_slowdown_and_request_timeout_on_parts(ctx):
    upload_case(ctx, "ul-slowdown.bin", [first_n(2, ("error", 503, "SlowDown"), where("put-part")),
                                         first_n(2, ("error", 400, "RequestTimeout"), where("put-part"))])


def test_upload_complete_503(ctx):
    upload_case(ctx, "ul-complete.bin", [first_n(2, ("error", 503, "SlowDown"), where("complete"))])


def test_upload_part_answers_lost_fresh_connection(ctx):
    # Parts reach s3rver but the answer is reset away: the retried part replaces the first.
    upload_case(ctx, "ul-lost.bin", [first_n(2, ("lost",), on_fresh_connection(where("put-part")))])


def test_upload_part_answers_lost_reused_connection(ctx):
    # The same on a keep-alive connection that carried an earlier request. libcurl then takes
    # the connection for stale and resends on a fresh one itself, which needs the upload body
    # rewound: sluice must let it (or retry itself).
    upload_case(ctx, "ul-lost-reused.bin", [first_n(1, ("lost",), on_reused_connection(where("put-part")))],
                expect_retries=(0, 1))


def test_upload_part_on_dropped_keepalive(ctx):
    # The server closes a keep-alive connection just as a part is sent on it (S3 drops idle
    # connections): nothing reached the store, the part must go again.
    upload_case(ctx, "ul-drop.bin", [first_n(1, ("drop",), on_reused_connection(where("put-part")))],
                expect_retries=(0, 1))


def test_upload_single_put_on_dropped_keepalive(ctx):
    # The same for small files' single PUTs: one at a time, so the second PUT goes on the
    # connection the first one used, and is dropped.
    src = ctx.fresh_dir("ul-drop-small")
    files = {f"f{i}.dat": ctx.big[i * 1000:(i + 1) * 1000 + i] for i in range(4)}
    for name, data in files.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    with FaultProxy(ctx.s3, [first_n(1, ("drop",), on_reused_connection(where("put")))]) as p:
        r = ctx.cp(p, src, f"s3://{BUCKET}/ul-drop-small/", "--recursive", "--jobs", "1")
        assert len(p.faults()) == 1, f"no PUT on a reused connection: {p.log}"
        assert r.returncode == 0, "upload failed: " + describe(r)
        for name, data in files.items():
            assert_object(ctx, "ul-drop-small/" + name, data)


def test_download_dropped_keepalive(ctx):
    # GETs on reused connections dropped without an answer: libcurl may resend them itself
    # (no body to rewind), so sluice counts at most one retry each.
    download_case(ctx, "dl-drop.bin", [first_n(2, ("drop",), on_reused_connection(where(("get", "head"))))],
                  expect_retries=(0, 1, 2))


def test_upload_delays(ctx):
    upload_case(ctx, "ul-delay.bin", [always(("delay", 0.3, 0), where())], expect_retries=0)


def test_upload_every_part_500(ctx):
    key = "ul-fail.bin"
    with FaultProxy(ctx.s3, [always(("error", 500, "InternalError"), where("put-part"))]) as p:
        r = ctx.cp(p, ctx.big_path, f"s3://{BUCKET}/{key}")
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}")
        assert_no_object(ctx, p, key)
        assert len(p.created_uploads) == 1, p.created_uploads
        assert p.aborted_uploads == p.created_uploads, \
            f"created {p.created_uploads}, aborted {p.aborted_uploads}"
        assert not p.seen("complete"), "completed an upload whose parts all failed"
        parts = p.seen("put-part")
        per_part = {}
        for q in parts:
            per_part[q.query["partNumber"]] = per_part.get(q.query["partNumber"], 0) + 1
        assert min(per_part.values()) > 1, f"parts not retried: {per_part}"
        assert retries(r) == len(parts) - len(per_part), f"retries {retries(r)}, part PUTs {per_part}"


def test_upload_single_put_500(ctx):
    # A small file goes up in one PUT; a permanent 500 fails it, leaving nothing.
    key = "ul-small-fail.bin"
    src = os.path.join(ctx.fresh_dir(key), "small.bin")
    with open(src, "wb") as f:
        f.write(ctx.big[:100_000])
    with FaultProxy(ctx.s3, [always(("error", 500, "InternalError"), where("put"))]) as p:
        r = ctx.cp(p, src, f"s3://{BUCKET}/{key}")
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}")
        assert_no_object(ctx, p, key)
        assert retries(r) == len(p.seen("put")) - 1 >= 1, f"retries {retries(r)}, PUTs {p.seen('put')}"


def test_upload_403(ctx):
    for key, kind, size in (("ul-403-small.bin", "put", 100_000), ("ul-403-big.bin", "initiate", BIG)):
        src = ctx.big_path
        if size != BIG:
            src = os.path.join(ctx.fresh_dir(key), "small.bin")
            with open(src, "wb") as f:
                f.write(ctx.big[:size])
        with FaultProxy(ctx.s3, [always(("error", 403, "AccessDenied"), where())]) as p:
            r = ctx.cp(p, src, f"s3://{BUCKET}/{key}")
            assert_failed_cleanly(r, f"s3://{BUCKET}/{key}")
            assert "AccessDenied" in r.stderr, describe(r)
            assert [q.kind for q in p.seen()] == [kind], f"403 was retried: {p.seen()}"
            assert retries(r) == 0
            assert_no_object(ctx, p, key)


def test_upload_403_on_parts(ctx):
    # Denied after the upload started: no retries, and the upload is aborted.
    key = "ul-403-parts.bin"
    with FaultProxy(ctx.s3, [always(("error", 403, "AccessDenied"), where("put-part"))]) as p:
        r = ctx.cp(p, ctx.big_path, f"s3://{BUCKET}/{key}")
        assert_failed_cleanly(r, f"s3://{BUCKET}/{key}")
        assert "AccessDenied" in r.stderr, describe(r)
        assert retries(r) == 0
        numbers = [q.query["partNumber"] for q in p.seen("put-part")]
        assert len(numbers) == len(set(numbers)), f"403 parts were retried: {numbers}"
        assert_no_object(ctx, p, key)
        assert p.aborted_uploads == p.created_uploads


def test_recursive_download_random_503(ctx):
    rng = random.Random(7)
    objects = {}
    for i in range(50):
        key = f"many/{'sub/' if i % 5 == 0 else ''}obj-{i:02d}.dat"
        objects[key] = rng.randbytes(rng.choice([0, 1, 1000, rng.randrange(1, 300_000)]))
        put_direct(ctx.s3, key, objects[key])
    d = ctx.fresh_dir("many")
    with FaultProxy(ctx.s3, [random_503(0.2, seed=11)]) as p:
        r = ctx.cp(p, f"s3://{BUCKET}/many/", d, "--recursive")
        assert r.returncode == 0, "recursive download failed: " + describe(r)
        assert r.summary["objects"] == 50, describe(r)
        found = {}
        for root, _, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                found["many/" + os.path.relpath(path, d)] = path
        assert sorted(found) == sorted(objects), f"extra or missing: {set(found) ^ set(objects)}"
        for key, data in objects.items():
            with open(found[key], "rb") as f:
                assert f.read() == data, f"{key}: bytes differ"
        n = len(p.faults())
        assert n >= 5, f"only {n} faults injected"
        assert retries(r) == n, f"retries {retries(r)}, 503s injected {n}"


def test_recursive_upload_random_503(ctx):
    rng = random.Random(8)
    src = ctx.fresh_dir("up-many")
    files = {}
    for i in range(30):
        rel = f"{'d/' if i % 4 == 0 else ''}f-{i:02d}.dat"
        files[rel] = rng.randbytes(rng.randrange(0, 200_000))
        os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
        with open(os.path.join(src, rel), "wb") as f:
            f.write(files[rel])
    with FaultProxy(ctx.s3, [random_503(0.2, seed=12)]) as p:
        r = ctx.cp(p, src, f"s3://{BUCKET}/up-many/", "--recursive")
        assert r.returncode == 0, "recursive upload failed: " + describe(r)
        for rel, data in files.items():
            assert_object(ctx, "up-many/" + rel, data)
        n = len(p.faults())
        assert n >= 3, f"only {n} faults injected"
        assert retries(r) == n, f"retries {retries(r)}, 503s injected {n}"


TESTS = [
    test_download_first_503s,
    test_download_slowdown_on_ranged_gets,
    test_download_other_retryables,
    test_download_reset_mid_body,
    test_download_truncated_body,
    test_download_close_delimited_short_body,
    test_download_delays,
    test_download_every_get_truncated,
    test_download_dropped_keepalive,
    test_download_object_replaced_mid_read,
    test_download_replaced_mid_read_if_match_ignored,
    test_download_through_the_cache_reset_mid_body,
    test_download_through_the_cache_replaced_mid_read_if_match_ignored,
    test_download_head_size_disagrees_with_get,
    test_download_stalled_server_abandoned,
    test_download_interrupted_cleans_up,
    test_upload_interrupted_aborts_multipart,
    test_kill9_debris_is_ignored_then_reaped,
    test_listing_outside_the_prefix_is_refused,
    test_download_403,
    test_download_403_on_get,
    test_download_404,
    test_upload_first_503s,
    test_upload_slowdown_and_request_timeout_on_parts,
    test_upload_complete_503,
    test_upload_part_answers_lost_fresh_connection,
    test_upload_part_answers_lost_reused_connection,
    test_upload_part_on_dropped_keepalive,
    test_upload_single_put_on_dropped_keepalive,
    test_upload_delays,
    test_upload_every_part_500,
    test_upload_single_put_500,
    test_upload_403,
    test_upload_403_on_parts,
    test_recursive_download_random_503,
    test_recursive_upload_random_503,
]


def main():
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} PATH/TO/sluice", file=sys.stderr)
        sys.exit(2)
    binary = os.path.abspath(sys.argv[1])
    if not find_s3rver():
        print("SKIP: s3rver not installed")
        sys.exit(77)  # ctest's SKIP_RETURN_CODE
    t0 = time.monotonic()
    s3 = S3rver()
    scratch = tempfile.mkdtemp(prefix="sluice-s3faults-")
    runner = Runner()
    try:
        ctx = Ctx(binary, s3, scratch)
        for test in TESTS:
            t = time.monotonic()
            runner.run(test.__name__, test, ctx)
            print(f"     ({time.monotonic() - t:.1f} s)", flush=True)

        def no_uploads_left():
            left = pending_uploads(s3)
            assert not left, f"multipart uploads left in s3rver: {left}"
        runner.run("no multipart uploads left behind", no_uploads_left)
    finally:
        s3.close()
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"total {time.monotonic() - t0:.1f} s")
    runner.finish()


if __name__ == "__main__":
    main()
