"""Shared pieces of the S3 integration tests: a real s3rver on a free loopback port,
running sluice, and a tiny test runner that prints "N passed, M failed".

Standard library only (Debian's /usr/bin/python3). s3rver comes from the npm registry;
.ci/run installs it into .cache/npm, and $SLUICE_S3RVER can point at another copy.
"""
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def find_s3rver():
    for cand in (os.environ.get("SLUICE_S3RVER"),
                 os.path.join(REPO, ".cache", "npm", "node_modules", ".bin", "s3rver"),
                 "/opt/sluice-test-tools/node_modules/.bin/s3rver",
                 shutil.which("s3rver")):
        if cand and os.path.exists(cand):
            return cand
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3rver:
    """s3rver on 127.0.0.1:<free port> over a temporary directory, with the given buckets."""

    def __init__(self, buckets=("test",)):
        exe = find_s3rver()
        if not exe:
            raise FileNotFoundError("s3rver not found (npm install s3rver, or set SLUICE_S3RVER)")
        self.dir = tempfile.mkdtemp(prefix="sluice-s3rver-")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [exe, "--directory", self.dir, "--port", str(self.port), "--address", "127.0.0.1", "--silent"]
        for b in buckets:
            args += ["--configure-bucket", b]
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("s3rver exited: " + self.proc.stderr.read().decode())
            time.sleep(0.1)
        raise RuntimeError("s3rver did not start listening")

    def object_path(self, bucket, key):
        """Where s3rver keeps an object's bytes (s3rver 3.x layout)."""
        return os.path.join(self.dir, bucket, key + "._S3rver_object")

    def close(self):
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def sluice(binary, *args, endpoint=None, env=None, timeout=300):
    e = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    e.update(env or {})
    cmd = [binary, *args]
    if endpoint:
        cmd += ["--endpoint-url", endpoint]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


class Skip(Exception):
    """Raised by a test that cannot show what it is for this time; the reason is printed."""


class Runner:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn, *args):
        try:
            fn(*args)
            self.passed += 1
            print(f"ok   - {name}", flush=True)
        except Skip as e:
            print(f"SKIP - {name}: {e}", flush=True)
        except Exception:  # a test body's failure, reported with its traceback
            self.failed += 1
            print(f"FAIL - {name}\n{traceback.format_exc()}", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
