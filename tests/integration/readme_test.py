#!/usr/bin/python3
"""Every command block of README.md, run as a new user would: one bash session, in a fresh
directory, with sluice and sluiced on the PATH, against an s3rver on loopback with the
buckets the README's set-up block makes. Each line must exit 0 (`set -e -o pipefail`).

    readme_test.py BUILD_BIN_DIR

A block preceded by `<!-- readme_test: skip REASON -->` is not run (the set-up itself, and
make targets); the test says SKIP for it with the reason. The only substitution is the
endpoint: the README's http://127.0.0.1:4568 and port 7470 become free ports here.
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import S3rver, find_s3rver, free_port  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README_ENDPOINT = "http://127.0.0.1:4568"
README_PEER_PORTS = ("7470", "7471")


def blocks(text):
    """(heading, skip reason or None, body) for every ```sh block."""
    out, heading, skip = [], "", None
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("# ").strip()
        m = re.match(r"<!-- readme_test: skip (.*) -->", line)
        if m:
            skip = m.group(1)
        if line.strip() == "```sh":
            body = []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            out.append((heading, skip, "\n".join(body)))
            skip = None
        i += 1
    return out


def main():
    bin_dir = os.path.abspath(sys.argv[1])
    if not find_s3rver():
        print("SKIP: s3rver not installed (make test-tools)")
        sys.exit(77)
    with open(os.path.join(REPO, "README.md")) as f:
        found = blocks(f.read())
    srv = S3rver(buckets=("datasets", "archive", "ckpt"))
    work = tempfile.mkdtemp(prefix="sluice-readme-")
    ports = {p: str(free_port()) for p in README_PEER_PORTS}
    script = ["set -e -o pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    ran = 0
    for heading, skip, body in found:
        if skip:
            print(f"SKIP - {heading}: {skip}")
            continue
        body = body.replace(README_ENDPOINT, srv.endpoint)
        for readme_port, port in ports.items():
            body = body.replace(":" + readme_port, ":" + port)
        script.append(f"echo '### {heading}' >&2")
        # Each line echoed first, so a failure names the line that failed.
        for line in body.split("\n"):
            # (Not a line inside a loop or a continuation: it would echo on every turn.)
            if line.strip() and not line.startswith(" ") and not line.rstrip().endswith("\\"):
                script.append(f"echo {shlex_quote('+ ' + line)} >&2")
            script.append(line)
        ran += 1
    env = dict(os.environ,
               PATH=bin_dir + os.pathsep + os.environ["PATH"],
               HOME=work, SLUICE_HOME=os.path.join(work, ".sluice"),
               AWS_ENDPOINT_URL=srv.endpoint, AWS_ACCESS_KEY_ID="S3RVER",
               AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
    for k in ("SLUICE_LEDGER", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(k, None)
    # Its own process group: on a timeout every daemon a block started goes with it.
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=500)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        srv.close()
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.splitlines()[-25:])
        print(f"FAIL - a README line exited {p.returncode}:\n{tail}\nstdout tail:\n"
              + "\n".join(p.stdout.splitlines()[-10:]))
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(1)
    lines = [l for l in p.stderr.splitlines() if l.startswith("+ ")]
    print(p.stderr if os.environ.get("README_TEST_VERBOSE") else "")
    print(f"ok   - {ran} README blocks, {len(lines)} commands, ran as written")
    shutil.rmtree(work, ignore_errors=True)


def shlex_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
