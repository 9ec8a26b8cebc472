#!/usr/bin/python3
"""Self-check of rgw_harness: a real RGW starts, checks SigV4 signatures, answers
conditional requests, and stops without leaving a process behind, both in-process and
through the `serve` CLI the C++ tests use.

    /usr/bin/python3 tests/integration/rgw_smoke.py

Prints "ok - ..." lines and exits 0; "FAIL - ..." and exits 1; "SKIP: reason" and exits 77
(automake's skip status, which ctest can map with SKIP_RETURN_CODE) without Ceph.
"""
import json
import os
import signal
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rgw_harness import Rgw, RgwUnavailable, find_rgw, s3_request  # noqa: E402

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rgw_harness.py")
failed = 0


def check(name, fn, *args):
    global failed
    try:
        fn(*args)
        print(f"ok - {name}", flush=True)
    except Exception:  # a check's failure, reported with its traceback
        failed += 1
        print(f"FAIL - {name}\n{traceback.format_exc()}", flush=True)


def expect(status, want, body=b""):
    assert status == want, f"got {status}, want {want}: {body[:300]!r}"


def alive(pid):
    """True while `pid` runs (a zombie counts as gone: it has stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid):
    """The PIDs of every process below `pid`, from /proc's parent links."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def wait_gone(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    assert not left, f"processes still running: {left}"


# --- in-process: the S3 behaviours the sluice tests rely on ------------------------------

def put_get(rgw):
    body = os.urandom(100_000)
    status, h, b = rgw.request("PUT", "/test/dir/obj one", body)
    expect(status, 200, b)
    status, h, got = rgw.request("GET", "/test/dir/obj one")
    expect(status, 200, got)
    assert got == body, "GET returned other bytes than PUT wrote"


def wrong_secret(rgw):
    status, _, b = rgw.request("GET", "/test/dir/obj one", secret="not-the-secret")
    expect(status, 403, b)
    assert b"SignatureDoesNotMatch" in b, b[:300]


def if_match(rgw):
    status, h, b = rgw.request("HEAD", "/test/dir/obj one")
    expect(status, 200, b)
    etag = h["etag"]
    # The right ETag passes (so the 412 below is the condition, not something else).
    status, _, b = rgw.request("GET", "/test/dir/obj one", headers={"If-Match": etag})
    expect(status, 200, b)
    status, _, b = rgw.request("GET", "/test/dir/obj one", headers={"If-Match": '"0123456789abcdef"'})
    expect(status, 412, b)


def if_none_match_star(rgw):
    rgw.request("PUT", "/test/excl", b"first")
    status, _, b = rgw.request("PUT", "/test/excl", b"second", headers={"If-None-Match": "*"})
    expect(status, 412, b)
    status, _, b = rgw.request("GET", "/test/excl")
    expect(status, 200, b)
    assert b == b"first", f"the refused PUT replaced the object: {b!r}"
    status, _, b = rgw.request("PUT", "/test/excl-new", b"x", headers={"If-None-Match": "*"})
    expect(status, 200, b)


def closed(pids, directory):
    wait_gone(pids, 0)
    assert not os.path.exists(directory), f"{directory} still exists"


# --- the `serve` CLI ------------------------------------------------------------------

def serve_round(stop):
    """serve --bucket unit: one JSON line, a working endpoint, and after `stop` (stdin EOF
    or SIGTERM) an exit 0 with every process it started gone."""
    p = subprocess.Popen([sys.executable, HARNESS, "serve", "--bucket", "unit"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        info = json.loads(line)
        assert set(info) == {"endpoint", "access_key", "secret_key"}, line
        status, _, b = s3_request(info["endpoint"], "PUT", "/unit/k", b"v",
                                  access_key=info["access_key"], secret_key=info["secret_key"])
        expect(status, 200, b)
        pids = descendants(p.pid)
        assert len(pids) >= 3, f"expected mon, osd and radosgw below serve, found {pids}"
        if stop == "eof":
            p.stdin.close()
        else:
            p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0, f"serve exited {p.returncode}"
        assert p.stdout.read() == "", "serve printed more than one line"
        wait_gone(pids)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def main():
    reason = find_rgw()
    if reason:
        print(f"SKIP: {reason}")
        return 77
    t = time.monotonic()
    try:
        rgw = Rgw(buckets=("test",))
    except RgwUnavailable as e:
        print(f"SKIP: {e.reason}")
        return 77
    print(f"# RGW up in {time.monotonic() - t:.2f} s at {rgw.endpoint} ({rgw.timings})", flush=True)
    pids = [p.pid for _, p in rgw.procs]
    directory = rgw.dir
    with rgw:
        check("PUT then GET returns the same bytes", put_get, rgw)
        check("a wrong secret gets 403 SignatureDoesNotMatch", wrong_secret, rgw)
        check("GET with a wrong If-Match gets 412", if_match, rgw)
        check("PUT with If-None-Match: * on an existing key gets 412", if_none_match_star, rgw)
    rgw.close()  # a second close is a no-op
    check("close() stopped mon, osd and radosgw and removed the directory", closed, pids, directory)
    check("serve: JSON line, then stdin EOF stops everything", serve_round, "eof")
    check("serve: SIGTERM stops everything", serve_round, "sigterm")
    print(f"{'FAILED' if failed else 'all passed'} ({failed} failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
