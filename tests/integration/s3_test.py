#!/usr/bin/python3
"""sluice cp against real S3 servers on loopback: s3rver (directly, and through a proxy that
verifies every request's SigV4 signature before forwarding it) and Ceph RGW (which checks
signatures and conditional requests itself). Each server the machine lacks is a SKIP with
its reason; with neither, the script exits 77 (SKIP to ctest).

    /usr/bin/python3 tests/integration/s3_test.py build/bin/sluice
"""
import hashlib
import hmac
import http.client
import http.server
import json
import os
import random
import sys
import tempfile
import threading
import urllib.parse



class _Server(http.server.ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: sluice opens 16 connections at once, and the
    # overflow was reset, which showed up as retries no fault had caused. Real servers
    # listen with far more.
    request_queue_size = 128

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import Runner, S3rver, find_s3rver  # noqa: E402
from s3_harness import sluice as run_sluice  # noqa: E402
from rgw_harness import Rgw, RgwUnavailable, find_rgw  # noqa: E402

SLUICE = os.path.abspath(sys.argv[1])
SECRET = "S3RVER"


class Server:
    """What the tests need of a server: its endpoint and keys, and a way to read what it
    holds without sluice."""

    def __init__(self, name, endpoint, access_key, secret_key, get, close, port=None):
        self.name, self.endpoint, self.port = name, endpoint, port
        self.access_key, self.secret_key = access_key, secret_key
        self.get, self.close = get, close

    def holds(self, bucket, key):
        return self.get(bucket, key) is not None


def s3rver_server():
    s3 = S3rver(buckets=("test",))

    def get(bucket, key):
        path = s3.object_path(bucket, key)
        return read(path) if os.path.exists(path) else None
    return Server("s3rver", s3.endpoint, "S3RVER", "S3RVER", get, s3.close, port=s3.port)


def rgw_server():
    rgw = Rgw(buckets=("test",))

    def get(bucket, key):
        status, _, body = rgw.request("GET", "/" + bucket + "/" + urllib.parse.quote(key))
        return body if status == 200 else None
    return Server("rgw", rgw.endpoint, rgw.access_key, rgw.secret_key, get, rgw.close)


CURRENT = None  # the server the tests run against now


def sluice(binary, *args, env=None, **kw):
    e = {"AWS_ACCESS_KEY_ID": CURRENT.access_key, "AWS_SECRET_ACCESS_KEY": CURRENT.secret_key}
    e.update(env or {})
    return run_sluice(binary, *args, env=e, **kw)


def write_random(path, size, seed):
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.write(rnd.randbytes(size))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def leftovers(directory):
    return [n for n in os.listdir(directory) if ".sluice-" in n]


# --- SigV4 verification, written from the AWS specification, independent of sluice ------

def _uri_encode(s, keep_slash):
    safe = "-_.~" + ("/" if keep_slash else "")
    return urllib.parse.quote(s, safe=safe)


def expected_authorization(method, raw_path, raw_query, headers, secret):
    auth = headers.get("authorization", "")
    fields = dict(part.strip().split("=", 1) for part in auth[len("AWS4-HMAC-SHA256 "):].split(","))
    access_key, date, region, service, _ = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    pairs = urllib.parse.parse_qsl(raw_query, keep_blank_values=True)
    canonical_query = "&".join(sorted(f"{_uri_encode(k, False)}={_uri_encode(v, False)}" for k, v in pairs))
    canonical_headers = "".join(f"{h}:{' '.join(headers.get(h, '').split())}\n" for h in signed)
    canonical = "\n".join([method, raw_path, canonical_query, canonical_headers, ";".join(signed),
                           headers.get("x-amz-content-sha256", "")])
    amz_date = headers.get("x-amz-date", "")
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(signed)}, "
            f"Signature={sig}"), signed


class VerifyingProxy:
    """Forwards to s3rver only requests whose SigV4 signature is right; 403 otherwise."""

    def __init__(self, upstream_port):
        proxy = self
        self.checked = 0
        self.rejected = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                raw_path, _, raw_query = self.path.partition("?")
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                want, signed = expected_authorization(self.command, raw_path, raw_query, hdrs, SECRET)
                payload = hdrs.get("x-amz-content-sha256", "")
                ok = hmac.compare_digest(want, hdrs.get("authorization", "")) and "host" in signed
                if ok and payload != "UNSIGNED-PAYLOAD":
                    ok = payload == hashlib.sha256(body).hexdigest()
                proxy.checked += 1
                if not ok:
                    proxy.rejected.append(f"{self.command} {self.path}")
                    msg = b"<Error><Code>SignatureDoesNotMatch</Code><Message>bad signature</Message></Error>"
                    self.send_response(403)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body if body else None, headers=fwd)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else resp.getheader("Content-Length", "0")))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# --- tests -------------------------------------------------------------------------------

def test_round_trips(s3, work):
    for name, size in (("empty", 0), ("small", 1000), ("multipart", 13 * 1024 * 1024 + 17)):
        src = os.path.join(work, name)
        write_random(src, size, size)
        up = sluice(SLUICE, "cp", src, f"s3://test/rt/{name}", "--part-size", "5M", endpoint=s3.endpoint)
        assert up.returncode == 0, up.stderr
        assert s3.get("test", f"rt/{name}") == read(src), f"{name}: server holds other bytes"
        back = os.path.join(work, name + ".back")
        down = sluice(SLUICE, "cp", f"s3://test/rt/{name}", back, "--part-size", "5M", endpoint=s3.endpoint)
        assert down.returncode == 0, down.stderr
        assert read(back) == read(src), f"{name}: downloaded bytes differ"
    assert not leftovers(work), leftovers(work)


def test_into_directory_keeps_the_name(s3, work):
    src = os.path.join(work, "named.bin")
    write_random(src, 5000, 1)
    assert sluice(SLUICE, "cp", src, "s3://test/dir/", endpoint=s3.endpoint).returncode == 0
    assert s3.holds("test", "dir/named.bin")
    out = os.path.join(work, "out")
    os.mkdir(out)
    assert sluice(SLUICE, "cp", "s3://test/dir/named.bin", out, endpoint=s3.endpoint).returncode == 0
    assert read(os.path.join(out, "named.bin")) == read(src)


def test_recursive_tree(s3, work):
    tree = os.path.join(work, "tree")
    names = ["a.bin", "sub/b c.bin", "sub/deeper/ünï.bin", "sub/x+y=z&w.bin", "z~tilde.bin"]
    names += [f"many/part-{i:04d}" for i in range(120)]
    for i, n in enumerate(names):
        os.makedirs(os.path.dirname(os.path.join(tree, n)), exist_ok=True)
        write_random(os.path.join(tree, n), (i * 7919) % 70000, i)
    up = sluice(SLUICE, "cp", "--recursive", tree, "s3://test/tree", "--json", endpoint=s3.endpoint)
    assert up.returncode == 0, up.stderr
    summary = json.loads(up.stdout)
    assert summary["objects"] == len(names) and summary["failed"] == 0, summary
    for k in ("bytes", "seconds", "throughput_mib_s", "retries"):
        assert k in summary, k
    out = os.path.join(work, "tree-back")
    down = sluice(SLUICE, "cp", "-r", "s3://test/tree/", out, "--json", endpoint=s3.endpoint)
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["objects"] == len(names)
    for n in names:
        assert read(os.path.join(out, n)) == read(os.path.join(tree, n)), n


def test_clear_failures(s3, work):
    cases = [
        (["cp", "s3://test/no/such/key", os.path.join(work, "x")], "no/such/key"),
        (["cp", "s3://nosuchbucket/key", os.path.join(work, "x")], "nosuchbucket"),
        (["cp", os.path.join(work, "missing-file"), "s3://test/k"], "missing-file"),
        (["cp", work, "s3://test/k"], "--recursive"),
        (["cp", "s3://test/prefix/", work], "--recursive"),
        (["cp", os.path.join(work, "a"), os.path.join(work, "b")], "stat " + os.path.join(work, "a")),
        (["cp", "s3://UPPER/k", work], "bucket"),
    ]
    for args, want in cases:
        r = sluice(SLUICE, *args, endpoint=s3.endpoint)
        assert r.returncode != 0, args
        assert want in r.stderr, (args, r.stderr)
    assert not os.path.exists(os.path.join(work, "x"))
    assert not leftovers(work)


def test_unreachable_endpoint_fails_after_retries(s3, work):
    r = sluice(SLUICE, "cp", "s3://test/k", os.path.join(work, "y"), "--json",
               endpoint="http://127.0.0.1:9", timeout=60)
    assert r.returncode != 0
    assert "s3://test/k" in r.stderr and "port 9" in r.stderr and "attempts" in r.stderr, r.stderr
    assert json.loads(r.stdout)["retries"] >= 1


def test_credentials_from_profile_files(s3, work):
    aws = os.path.join(work, "aws")
    os.mkdir(aws)
    with open(os.path.join(aws, "credentials"), "w") as f:
        f.write(f"[ci]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n")
    with open(os.path.join(aws, "config"), "w") as f:
        f.write(f"[profile ci]\nregion = eu-west-1\nendpoint_url = {s3.endpoint}\n")
    src = os.path.join(work, "p.bin")
    write_random(src, 3000, 3)
    env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws, "credentials"),
           "AWS_CONFIG_FILE": os.path.join(aws, "config")}
    r = sluice(SLUICE, "cp", src, "s3://test/profile/p.bin", "--profile", "ci", env=env)
    assert r.returncode == 0, r.stderr
    assert s3.get("test", "profile/p.bin") == read(src)
    bad = sluice(SLUICE, "cp", src, "s3://test/profile/q.bin", "--profile", "nope", env=env)
    assert bad.returncode != 0 and "nope" in bad.stderr, bad.stderr


def test_signatures_verified_by_proxy(s3, work):
    if s3.name != "s3rver":
        print("     (SKIP on rgw: RGW verifies every signature itself, see test_wrong_secret_refused)")
        return
    proxy = VerifyingProxy(s3.port)
    try:
        tree = os.path.join(work, "signed")
        for i, n in enumerate(["plain", "with space", "ütf-8", "a+b=c&d", "deep/er/key~x", "big"]):
            os.makedirs(os.path.dirname(os.path.join(tree, n)), exist_ok=True)
            write_random(os.path.join(tree, n), 11 * 1024 * 1024 if n == "big" else 100 + i, i)
        up = sluice(SLUICE, "cp", "-r", tree, "s3://test/signed", "--part-size", "5M", endpoint=proxy.endpoint)
        assert up.returncode == 0, up.stderr
        down = sluice(SLUICE, "cp", "-r", "s3://test/signed", os.path.join(work, "signed-back"),
                      "--part-size", "5M", endpoint=proxy.endpoint)
        assert down.returncode == 0, down.stderr
        assert proxy.checked >= 12 and not proxy.rejected, proxy.rejected
        for n in ["plain", "with space", "ütf-8", "a+b=c&d", "deep/er/key~x", "big"]:
            assert read(os.path.join(work, "signed-back", n)) == read(os.path.join(tree, n)), n
        # A wrong secret is refused by the proxy: a clear 403, and no retries.
        wrong = sluice(SLUICE, "cp", os.path.join(tree, "plain"), "s3://test/signed/w", "--json",
                       endpoint=proxy.endpoint, env={"AWS_SECRET_ACCESS_KEY": "wrong"})
        assert wrong.returncode != 0
        assert "SignatureDoesNotMatch" in wrong.stderr and "permission_denied" in wrong.stderr, wrong.stderr
        assert json.loads(wrong.stdout)["retries"] == 0
        assert not s3.holds("test", "signed/w")
    finally:
        proxy.close()


def test_wrong_secret_refused(s3, work):
    if s3.name != "rgw":
        print("     (SKIP on s3rver: it accepts any signature; the verifying proxy checks there)")
        return
    src = os.path.join(work, "w.bin")
    write_random(src, 1000, 9)
    r = sluice(SLUICE, "cp", src, "s3://test/wrong/w.bin", "--json", endpoint=s3.endpoint,
               env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert r.returncode != 0
    assert "SignatureDoesNotMatch" in r.stderr and "permission_denied" in r.stderr, r.stderr
    assert json.loads(r.stdout)["retries"] == 0
    assert not s3.holds("test", "wrong/w.bin")


def test_long_names_and_control_characters(s3, work):
    # Defect 7: a 240-255-byte file name downloads (the temporary name must fit NAME_MAX).
    # Defect 9: a key with a newline prints a one-line error.
    # s3rver keeps an object as files named KEY._S3rver_object and KEY._S3rver_metadata.json,
    # so it cannot hold a last key component above about 234 bytes; RGW can, so it gets the
    # longest legal file name.
    name = "n" * (230 if s3.name == "s3rver" else 255)
    src = os.path.join(work, "short")
    write_random(src, 2000, 5)
    assert sluice(SLUICE, "cp", src, f"s3://test/long/{name}", endpoint=s3.endpoint).returncode == 0
    out = os.path.join(work, "out")
    r = sluice(SLUICE, "cp", "-r", "s3://test/long/", out, endpoint=s3.endpoint)
    assert r.returncode == 0, r.stderr
    assert read(os.path.join(out, name)) == read(src)
    assert os.listdir(out) == [name], os.listdir(out)
    r = sluice(SLUICE, "cp", "s3://test/a\nsluice: error: forged", os.path.join(work, "x"),
               endpoint=s3.endpoint)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1, repr(r.stderr)
    assert "a\\nsluice" in r.stderr, r.stderr


def test_s3_to_s3_and_back_to_memory(s3, work):
    # cp works between any two stores: s3 -> s3 (one object and a prefix).
    src = os.path.join(work, "s.bin")
    write_random(src, 6 * 1024 * 1024 + 5, 11)
    assert sluice(SLUICE, "cp", src, "s3://test/s2s/a/s.bin", "--part-size", "5M",
                  endpoint=s3.endpoint).returncode == 0
    r = sluice(SLUICE, "cp", "s3://test/s2s/a/s.bin", "s3://test/s2s/b/s.bin", "--part-size", "5M",
               endpoint=s3.endpoint)
    assert r.returncode == 0, r.stderr
    assert s3.get("test", "s2s/b/s.bin") == read(src)
    r = sluice(SLUICE, "cp", "-r", "s3://test/s2s/a/", "s3://test/s2s/c/", "--json", endpoint=s3.endpoint)
    assert r.returncode == 0 and json.loads(r.stdout)["objects"] == 1, r.stdout + r.stderr
    assert s3.get("test", "s2s/c/s.bin") == read(src)
    r = sluice(SLUICE, "cp", "s3://test/s2s/a/s.bin", "s3://test/s2s/a/s.bin", endpoint=s3.endpoint)
    assert r.returncode == 2 and "same" in r.stderr, r.stderr


def test_recursive_download_into_uncreatable_directory(s3, work):
    # Defect 8: the real cause is reported (here a file where a directory must go; the
    # EACCES case, which needs a second user, is in cli_test.sh).
    src = os.path.join(work, "f")
    write_random(src, 10, 1)
    assert sluice(SLUICE, "cp", src, "s3://test/uncreatable/f", endpoint=s3.endpoint).returncode == 0
    blocker = os.path.join(work, "blocker")
    with open(blocker, "w") as f:
        f.write("a file, not a directory")
    r = sluice(SLUICE, "cp", "-r", "s3://test/uncreatable/", os.path.join(blocker, "sub"), endpoint=s3.endpoint)
    assert r.returncode != 0
    assert "Not a directory" in r.stderr and "blocker" in r.stderr, r.stderr


def servers():
    """(name, factory or None, why not)."""
    out = []
    out.append(("s3rver", s3rver_server, None) if find_s3rver() else
               ("s3rver", None, "s3rver not installed (make test installs it into .cache/npm)"))
    why = find_rgw()
    out.append(("rgw", rgw_server, None) if not why else ("rgw", None, why))
    return out


def main():
    global CURRENT
    runner = Runner()
    ran = 0
    for name, factory, why in servers():
        if factory:
            try:
                CURRENT = factory()
            except RgwUnavailable as e:
                CURRENT, why = None, e.reason
        if not CURRENT:
            print(f"SKIP: {name}: {why}")
            continue
        ran += 1
        print(f"# against {name} at {CURRENT.endpoint}", flush=True)
        try:
            for tname, fn in [(n, f) for n, f in globals().items() if n.startswith("test_")]:
                with tempfile.TemporaryDirectory(prefix="sluice-s3-") as work:
                    runner.run(f"{name}: {tname}", fn, CURRENT, work)
        finally:
            CURRENT.close()
            CURRENT = None
    if not ran:
        print("SKIP: no S3 server available")
        sys.exit(77)
    runner.finish()


if __name__ == "__main__":
    main()
