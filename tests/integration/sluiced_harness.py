"""A real sluiced for tests and benchmarks: started on its own socket, waited for until it
answers, stopped with a signal. Standard library only."""

import os
import signal
import socket
import subprocess
import time


class Sluiced:
    """`binary` --socket SOCKET --cache-dir CACHE_DIR plus `args`, its output appended to
    LOG; ready when a connection to the socket succeeds (20 s at most)."""

    def __init__(self, binary, socket_path, cache_dir, args=(), env=None, log=None):
        self.socket = socket_path
        self.log = open(log or os.path.join(os.path.dirname(socket_path), "sluiced.log"), "ab")
        self.log_start = self.log.tell()  # where this daemon's lines begin
        self.proc = subprocess.Popen(
            [binary, "--socket", socket_path, "--cache-dir", cache_dir, *args],
            env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError("sluiced exited: " + open(self.log.name).read())
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(socket_path)
                    return
            except OSError:
                time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise RuntimeError("sluiced did not start")

    def wait_for(self, text, timeout=60):
        """Waits until this daemon has logged a line containing `text` (such as "RAM tier
        ready")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log.name, "rb") as f:
                f.seek(self.log_start)
                if text.encode() in f.read():
                    return
            if self.proc.poll() is not None:
                raise RuntimeError("sluiced exited: " + open(self.log.name).read())
            time.sleep(0.05)
        raise RuntimeError(f"sluiced did not say '{text}' in {timeout} s")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals it, waits for it (`timeout` s at most) and returns its exit status."""
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.log.close()
        return rc
