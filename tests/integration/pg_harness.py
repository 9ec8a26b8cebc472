#!/usr/bin/python3
"""A real, private PostgreSQL server on loopback for the ledger tests and benchmarks.

    with Postgres() as pg:
        ... pg.uri  (postgresql://postgres@127.0.0.1:PORT/postgres) ...

or, for tests written in another language (C++):

    /usr/bin/python3 tests/integration/pg_harness.py serve [--durable]

which prints one JSON line {"uri": ...} (or {"skip": reason}) and keeps the server up until
stdin reaches EOF or it gets SIGTERM/SIGINT.

The server is Debian's `postgresql` package (scripts/install-test-tools.sh installs it):
`initdb` on a temporary directory and `postgres` on a free 127.0.0.1 port, with trust
authentication (nobody else can reach loopback here) and the Unix socket in the same
temporary directory. PostgreSQL refuses to run as root, so as root the server runs as the
`postgres` user the package creates. Without --durable, fsync is off: a test server's data
need not survive a power cut, and tests run faster; benchmarks pass --durable.
Standard library only.
"""
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


class PostgresUnavailable(Exception):
    """PostgreSQL cannot run here (not installed, or it did not start): tests SKIP."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def find_bindir():
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and postgres."""
    found = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "postgres"), os.X_OK):
            with contextlib.suppress(ValueError):
                found.append((int(os.path.basename(os.path.dirname(d))), d))
    return max(found)[1] if found else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    def __init__(self, durable=False):
        bindir = find_bindir()
        if not bindir:
            raise PostgresUnavailable("PostgreSQL server not installed (Debian package postgresql; "
                                      "scripts/install-test-tools.sh installs it)")
        self.dir = tempfile.mkdtemp(prefix="sluice-pg-")
        self.proc = None
        try:
            self._start(bindir, durable)
        except BaseException:
            self.close()
            raise

    def _start(self, bindir, durable):
        demote = None
        if os.getuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no 'postgres' user to run the server as")
            os.chmod(self.dir, 0o700)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

            def demote():
                os.setgid(pw.pw_gid)
                os.setgroups([])
                os.setuid(pw.pw_uid)
        data = os.path.join(self.dir, "data")
        log = os.path.join(self.dir, "initdb.log")
        with open(log, "wb") as f:
            r = subprocess.run([os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
                                "-E", "UTF8", "--no-sync", "--no-instructions"],
                               stdout=f, stderr=subprocess.STDOUT, preexec_fn=demote, cwd=self.dir)
        if r.returncode != 0:
            with open(log, "rb") as f:
                raise PostgresUnavailable("initdb failed: " + f.read().decode(errors="replace")[-500:])
        self.port = free_port()
        args = [os.path.join(bindir, "postgres"), "-D", data, "-p", str(self.port), "-k", self.dir,
                "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
                "-c", "logging_collector=off"]
        if not durable:
            args += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        self.log_path = os.path.join(self.dir, "server.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=demote,
                                     cwd=self.dir, start_new_session=True)
        self.uri = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresUnavailable("postgres exited: " + self._log_tail())
            # The port answers before the server accepts connections; pg_isready knows.
            r = subprocess.run([os.path.join(bindir, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)])
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise PostgresUnavailable("postgres did not accept connections within 30 s: " + self._log_tail())

    def _log_tail(self):
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-500:]
        return ""

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(AttributeError):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="pg_harness.py serve",
                                 description="Start PostgreSQL, print one JSON line, stay up until stdin EOF.")
    ap.add_argument("--durable", action="store_true", help="keep fsync on (benchmarks)")
    args = ap.parse_args(argv)

    class Stop(BaseException):
        pass

    def on_signal(signum, frame):
        raise Stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pg = None
    try:
        try:
            pg = Postgres(durable=args.durable)
        except PostgresUnavailable as e:
            print(json.dumps({"skip": e.reason}), flush=True)
            return 0
        print(json.dumps({"uri": pg.uri}), flush=True)
        while sys.stdin.buffer.read1(65536):
            pass
    except Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if pg:
            pg.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        sys.exit(_serve(sys.argv[2:]))
    print("usage: pg_harness.py serve [--durable]\n"
          "Starts PostgreSQL on loopback and prints one JSON line {\"uri\": ...} (or skip);\n"
          "stays up until stdin reaches EOF or SIGTERM/SIGINT.", file=sys.stderr)
    sys.exit(2)
