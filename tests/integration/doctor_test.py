#!/usr/bin/python3
"""sluice doctor on real degraded setups, each with a known cause, checking that the top-ranked
cause names it: a RAM-backed loop device with ext4 on it (a steady "fast NVMe"), and readers
that read one 4 KiB block at a time, read buffered from a cold cache, spin between reads on one
core, read a file of thousands of extents, are throttled by their cgroup, share the device with
a noisy neighbour, or run at the ceiling (then nothing is to be fixed). The sweep never writes
what it did not create (hashes before and after), and bad input is a clear error.

Needs root and loop devices; without them every case SKIPs with the reason.

    /usr/bin/python3 tests/integration/doctor_test.py build/bin/sluice
"""
import ctypes
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import Runner, S3rver, Skip, find_s3rver  # noqa: E402
from s3_faults_test import FaultProxy  # noqa: E402

SLUICE = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="sluice-doctor-")
MIB = 1 << 20
WATCH = "3"  # seconds each job is watched

# A reader whose behaviour is set by flags: O_DIRECT or buffered, the request size, CPU spun
# between reads, the page cache dropped after every pass (a cold cache each time).
READER = r"""
import mmap, os, sys, time
path, bs, direct, spin_ms, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]), sys.argv[5] == "1"
fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
size = os.lseek(fd, 0, os.SEEK_END) // bs * bs
buf = mmap.mmap(-1, bs)
off = 0
while True:
    if off >= size:
        off = 0
        if cold:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.preadv(fd, [buf], off)
    off += bs
    if spin_ms:
        end = time.perf_counter() + spin_ms / 1000
        while time.perf_counter() < end:
            pass
"""


class Setup:
    """A RAM-backed loop device with ext4, a data file and a fragmented file on it."""

    def __init__(self):
        self.image = os.path.join("/dev/shm", os.path.basename(WORK) + ".img")
        self.loop = None
        self.mnt = os.path.join(WORK, "mnt")
        self.mounted = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        with open(self.image, "wb") as f:
            f.truncate(768 * MIB)
        self.loop = sh("losetup", "-f", "--show", self.image).strip()
        # The kernel's classic readahead (128 KiB): some kernels give a loop device far more
        # (2.5 MiB was seen), which makes cold buffered reads nearly as fast as O_DIRECT and
        # the buffered case no longer a degraded one.
        with open(f"/sys/block/{os.path.basename(self.loop)}/queue/read_ahead_kb", "w") as f:
            f.write("128")
        sh("mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop)
        os.makedirs(self.mnt)
        sh("mount", self.loop, self.mnt)
        self.mounted = True
        self.data = os.path.join(self.mnt, "data")
        with open(self.data, "wb") as f:
            for _ in range(256):
                f.write(os.urandom(MIB))
        self.frag = os.path.join(self.mnt, "frag")
        make_fragmented(self.frag, 64 * MIB)
        os.sync()
        # Read-only from here: nothing but the doctor could change the device's bytes.
        sh("mount", "-o", "remount,ro", self.mnt)
        self.reader = os.path.join(WORK, "reader.py")
        with open(self.reader, "w") as f:
            f.write(READER)

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.mnt])
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop])
        if os.path.exists(self.image):
            os.unlink(self.image)


def sh(*args):
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def make_fragmented(path, size):
    """Every other 4 KiB block punched out: one extent per remaining block."""
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        punch = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        for off in range(4096, size, 8192):
            if libc.fallocate(f.fileno(), punch, off, 4096) != 0:
                raise OSError(ctypes.get_errno(), "fallocate punch hole")


def sluice(*args, check=True, timeout=180):
    p = subprocess.run([SLUICE, *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


class Job:
    def __init__(self, argv, preexec=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  preexec_fn=preexec)
        time.sleep(0.7)  # past its start-up
        assert self.p.poll() is None, f"{argv} exited at once"

    def stop(self):
        self.p.kill()
        self.p.wait()


def diagnose(job, ceiling, *extra):
    try:
        out = sluice("doctor", "--pid", str(job.p.pid), "--seconds", WATCH, "--ceiling", ceiling,
                     "--json", *extra).stdout
    finally:
        job.stop()
    return json.loads(out)


def causes(report):
    return [c["id"] for c in report["causes"]]


def expect_top(report, *ids):
    got = causes(report)
    if got:
        print(f"#    {got[0]}: {report['causes'][0]['evidence']}", flush=True)
    assert got and got[0] in ids, f"top cause {got} is not {ids}:\n{json.dumps(report, indent=1)}"


def python_reader(s, path, bs, direct, spin_ms=0, cold=False, cpu=None):
    def pin():
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return Job(["/usr/bin/python3", s.reader, path, str(bs), "1" if direct else "0", str(spin_ms),
                "1" if cold else "0"], preexec=pin)


def sha(path, size):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left:
            b = f.read(min(left, 4 * MIB))
            if not b:
                break
            h.update(b)
            left -= len(b)
    return h.hexdigest()


# --- the cases ------------------------------------------------------------------------------


def test_sweep_reads_only_and_agrees_with_itself(s):
    before = sha(s.loop, 768 * MIB), sha(s.data, 256 * MIB)
    out = sluice("doctor", "--path", s.loop, "--seconds", "8", "--json").stdout
    with open(os.path.join(WORK, "ceiling.json"), "w") as f:
        f.write(out)
    c = json.loads(out)["ceiling"]
    assert c["device"] == os.path.basename(s.loop), c
    engines = {p["engine"] for p in c["points"]}
    # The device holds a mounted file system, whose pages the cache may keep: then the
    # buffered point is labelled a memory-copy figure.
    assert engines in ({"uring", "direct", "buffered"}, {"uring", "direct", "buffered-cached"}), engines
    assert {p["qd"] for p in c["points"] if p["engine"] == "uring"} == {1, 4, 16, 64}
    best = c["best"]["bytes_s"]
    qd1_4k = [p for p in c["points"] if p["engine"] == "uring" and p["bs"] == 4096 and p["qd"] == 1][0]
    assert best > 4 * qd1_4k["bytes_s"], c  # small serial reads are far from the ceiling
    # A regular file too, read-only; and the text report names the knee.
    text = sluice("doctor", "--path", s.data, "--seconds", "3").stdout
    assert "reaches" in text and "QD" in text and "gpu:" in text, text
    assert (sha(s.loop, 768 * MIB), sha(s.data, 256 * MIB)) == before, "the sweep wrote"


def test_sweep_of_a_directory_leaves_nothing(s):
    d = os.path.join(WORK, "dir")
    os.makedirs(d)
    with open(os.path.join(d, "keep"), "wb") as f:
        f.write(b"k" * 4096)
    # A stale scratch file of a doctor killed earlier (no such process) is removed.
    with open(os.path.join(d, ".sluice-doctor-999999999"), "wb") as f:
        f.write(b"x")
    out = json.loads(sluice("doctor", "--path", d, "--seconds", "3", "--scratch-size", "64M",
                            "--json").stdout)
    assert out["ceiling"]["best"]["bytes_s"] > 0
    assert sorted(os.listdir(d)) == ["keep"], os.listdir(d)
    # Ctrl-C mid-sweep: exit 130, and the scratch file is gone.
    p = subprocess.Popen([SLUICE, "doctor", "--path", d, "--seconds", "20", "--scratch-size", "64M"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    assert p.returncode == 130, p.returncode
    assert sorted(os.listdir(d)) == ["keep"], os.listdir(d)
    # SIGTERM while the scratch file is being laid out: the layout stops, exit 143, and the
    # scratch file is gone.
    p = subprocess.Popen([SLUICE, "doctor", "--path", d, "--seconds", "20", "--scratch-size", "512M"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    scratch = os.path.join(d, f".sluice-doctor-{p.pid}")
    deadline = time.monotonic() + 30
    while (not os.path.exists(scratch) or os.path.getsize(scratch) == 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, (p.returncode, err)
    assert b"interrupted" in err, err
    assert sorted(os.listdir(d)) == ["keep"], os.listdir(d)


def test_a_short_budget_measures_the_most_telling_points(s):
    c = json.loads(sluice("doctor", "--path", s.data, "--seconds", "0.5", "--json").stdout)["ceiling"]
    got = sorted((p["engine"], p["bs"], p["qd"]) for p in c["points"])
    assert got == [("uring", MIB, 1), ("uring", MIB, 16)], got


def test_a_job_that_exits_during_the_watch_is_reported(s):
    # A reader that keeps reading until it is killed (a dd over the test's file could end by
    # itself before the first sample on a fast or a loaded day).
    job = subprocess.Popen([SLUICE, "bench", "--file", s.loop, "--mode", "direct", "--bs", "4K",
                            "--qd", "1", "--runtime", "60"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Reaped the moment it dies, as a job's own parent would (a zombie still has a /proc entry).
    reaper = threading.Thread(target=job.wait)
    reaper.start()
    # Killed 2 s into the watch, counted from the doctor's own "watching" line: on a slow
    # day its start-up alone may take longer than any fixed delay.
    doctor = subprocess.Popen([SLUICE, "doctor", "--pid", str(job.pid), "--seconds", "6",
                               "--no-sweep", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = doctor.stderr.readline()
        assert "watching process" in first, first
        time.sleep(2)
        job.kill()
        out, err = doctor.communicate(timeout=120)
        assert doctor.returncode == 0, err
        r = json.loads(out)
    finally:
        job.kill()
        doctor.kill()
        reaper.join()
    assert any("exited during the watch" in n for n in r["notes"]), r["notes"]
    assert 0.5 < r["job"]["seconds"] < 5.5, r["job"]
    assert r["job"]["read_bytes_s"] > 0, r["job"]


def test_a_launcher_is_told_its_children_read(s):
    # A shell that starts the reader: the doctor watching the shell says the I/O is in its
    # child, and names it, instead of blaming the shell's own (idle) descriptors.
    # (A reader that keeps running: a child's counters join its parent's once it is reaped.)
    reader = f"{SLUICE} bench --file {s.loop} --mode direct --bs 4K --qd 1 --runtime 60"
    job = subprocess.Popen(["sh", "-c", reader + "; sleep 30"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.5)
        r = json.loads(sluice("doctor", "--pid", str(job.pid), "--seconds", "2", "--no-sweep",
                              "--json").stdout)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert any("child process" in n and "watch the one that reads" in n for n in r["notes"]), \
        r["notes"]


def test_one_small_read_at_a_time(s):
    job = Job(["dd", f"if={s.loop}", "of=/dev/null", "bs=4k", "iflag=direct"])
    r = diagnose(job, s.ceiling)
    expect_top(r, "queue-depth", "request-size")
    assert "queue-depth" in causes(r) and "request-size" in causes(r), causes(r)
    assert r["device"]["avg_read_bytes"] < 8192 and r["device"]["in_flight"] < 1.5, r["device"]


def test_buffered_reads_from_a_cold_cache(s):
    # 64 KiB read calls: the page cache fetches them in readahead windows (128 KiB, a request
    # or two in flight), far from what O_DIRECT with depth gets. (1 MiB calls would be read
    # ahead in 1 MiB requests, which a RAM-backed device serves nearly as fast as O_DIRECT.)
    r = diagnose(python_reader(s, s.data, 64 << 10, direct=False, cold=True), s.ceiling)
    expect_top(r, "buffered")
    assert r["device"]["avg_read_bytes"] <= 256 << 10, r["device"]


def test_a_thread_spinning_between_reads(s):
    r = diagnose(python_reader(s, s.data, MIB, direct=True, spin_ms=5, cpu=0), s.ceiling)
    expect_top(r, "cpu-bound")


def test_a_file_of_thousands_of_extents(s):
    r = diagnose(python_reader(s, s.frag, MIB, direct=True), s.ceiling)
    expect_top(r, "fragmented")
    frag = [f for f in r["files"] if f["path"] == s.frag][0]
    assert frag["extents"] >= 4000, frag


def cgroup_throttle(s, bps):
    """A cgroup limiting reads of the loop device: v1 blkio or v2 io.max; None if neither."""
    rdev = os.stat(s.loop).st_rdev
    dev = f"{os.major(rdev)}:{os.minor(rdev)}"
    v1 = "/sys/fs/cgroup/blkio"
    if os.path.exists(os.path.join(v1, "blkio.throttle.read_bps_device")):
        cg = os.path.join(v1, os.path.basename(WORK))
        os.makedirs(cg, exist_ok=True)
        with open(os.path.join(cg, "blkio.throttle.read_bps_device"), "w") as f:
            f.write(f"{dev} {bps}")
        return cg
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.subtree_control")) as f:
            if "io" not in f.read().split():
                return None
    except OSError:
        return None
    cg = os.path.join(v2, os.path.basename(WORK))
    os.makedirs(cg, exist_ok=True)
    with open(os.path.join(cg, "io.max"), "w") as f:
        f.write(f"{dev} rbps={bps}")
    return cg


def test_throttled_by_its_cgroup(s):
    cg = cgroup_throttle(s, 20 * MIB)
    if cg is None:
        raise Skip("neither cgroup v1 blkio throttling nor cgroup v2 io.max is available here")
    try:
        def enter():
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        job = Job(["dd", f"if={s.loop}", "of=/dev/null", "bs=1M", "iflag=direct"], preexec=enter)
        r = diagnose(job, s.ceiling)
        expect_top(r, "throttled")
        assert r["limit"]["bytes_per_s"] == 20 * MIB, r["limit"]
        assert r["job"]["read_bytes_s"] < 30 * MIB, r["job"]
    finally:
        time.sleep(0.2)
        os.rmdir(cg)


def test_a_noisy_neighbour_on_the_device(s):
    noisy = Job([SLUICE, "bench", "--file", s.loop, "--mode", "uring", "--bs", "1M", "--qd", "32",
                 "--runtime", "60"])
    try:
        # The watched reader runs until it is stopped (dd over the loop device could end
        # before a slow day's doctor took its first look).
        r = diagnose(Job([SLUICE, "bench", "--file", s.loop, "--mode", "direct", "--bs", "1M",
                          "--qd", "1", "--runtime", "60"]), s.ceiling)
    finally:
        noisy.stop()
    expect_top(r, "shared-device")


def test_a_reader_at_the_ceiling_has_nothing_to_fix(s):
    with open(s.ceiling) as f:
        best = json.load(f)["ceiling"]["best"]
    # The job runs the ceiling's own best point; measured against a fresh ceiling (the sweep
    # runs while the job does, so it competes with it: the job cannot be far below it).
    job = Job([SLUICE, "bench", "--file", s.loop, "--mode", best["engine"], "--bs", str(best["bs"]),
               "--qd", str(best["qd"]), "--runtime", "60"])
    try:
        out = sluice("doctor", "--pid", str(job.p.pid), "--seconds", WATCH, "--sweep-seconds", "4",
                     "--json").stdout
    finally:
        job.stop()
    r = json.loads(out)
    assert causes(r) == ["healthy"], json.dumps(r, indent=1)


def test_bad_input_is_a_clear_error(s):
    fifo = os.path.join(WORK, "fifo")
    os.mkfifo(fifo)
    for args, words in [
        (["--path", "/no/such/place"], "/no/such/place"),
        (["--path", fifo], "not a directory"),
        (["--pid", "999999999"], "999999999"),
        (["--pid", "0"], "not a process id"),
        (["--pid", "1", "--ceiling", "/no/such/ceiling.json"], "ceiling"),
        ([], "--path"),
    ]:
        p = sluice("doctor", *args, check=False, timeout=30)
        assert p.returncode in (1, 2) and words in p.stderr, (args, p.returncode, p.stderr)
    # A planted symlink where the scratch file goes is never followed (the victim is kept).
    shared = os.path.join(WORK, "shared")
    os.makedirs(shared)
    victim = os.path.join(WORK, "victim")
    with open(victim, "wb") as f:
        f.write(b"precious")
    p = subprocess.run(["bash", "-c", f'ln -s {victim} {shared}/.sluice-doctor-$$; exec {SLUICE} doctor '
                        f'--path {shared} --seconds 1 --scratch-size 32M'], capture_output=True, text=True)
    assert p.returncode == 1 and "left alone" in p.stderr, (p.returncode, p.stderr)
    assert open(victim, "rb").read() == b"precious"
    # Names that are not UTF-8 still give valid JSON; files under 64 KiB are measured.
    odd = os.path.join(WORK.encode(), b"odd\xff\ndir")
    os.makedirs(odd)
    small = os.path.join(odd, b"f5000")
    with open(small, "wb") as f:
        f.write(os.urandom(5000))
    p = subprocess.run([SLUICE, "doctor", "--path", small, "--seconds", "1", "--json"], capture_output=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ceiling"]["best"]["bs"] == 4096
    for args, words in ((["--path", WORK, "--seconds", "nan"], "seconds"),
                        (["--pid", "1", "--ceiling", "/dev/zero"], "not a regular file")):
        p = sluice("doctor", *args, check=False, timeout=30)
        assert p.returncode in (1, 2) and words in p.stderr, (args, p.returncode, p.stderr)
    bad = os.path.join(WORK, "bad.json")
    with open(bad, "w") as f:
        f.write('{"points": [{"engine": "uring", "bs": 0, "qd": 1, "bytes_s": 5}]}')
    p = sluice("doctor", "--pid", str(os.getpid()), "--ceiling", bad, check=False)
    assert p.returncode in (1, 2) and "bs 0" in p.stderr, p.stderr
    p = sluice("doctor", "--path", WORK, "--pid", "1", check=False)
    assert p.returncode == 2, p.returncode
    # A process that reads nothing is "idle", not a crash.
    sleeper = Job(["sleep", "30"])
    r = diagnose(sleeper, s.ceiling)
    assert causes(r) == ["idle"], causes(r)


def s3_doctor(endpoint, *args):
    env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
    p = subprocess.run([SLUICE, "doctor", "--url", "s3://test/ds", "--endpoint-url", endpoint,
                        "--seconds", "4", *args], capture_output=True, text=True, env=env, timeout=120)
    return p


def s3_cases(r):
    """--url against s3rver: the latency/concurrency curve, and SlowDown answers counted."""
    srv = S3rver(buckets=("test", "empty"))
    try:
        src = os.path.join(WORK, "s3src")
        os.makedirs(src)
        for i in range(16):
            with open(os.path.join(src, f"s{i:02d}"), "wb") as f:
                f.write(os.urandom(4096))
        with open(os.path.join(src, "big"), "wb") as f:
            f.write(os.urandom(24 * MIB))
        env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
        subprocess.run([SLUICE, "cp", "-r", src, "s3://test/ds", "--endpoint-url", srv.endpoint],
                       check=True, capture_output=True, env=env)

        def curve():
            p = s3_doctor(srv.endpoint, "--json", "--target-rate", "100G")
            assert p.returncode == 0, p.stderr
            j = json.loads(p.stdout)
            assert [lv["concurrency"] for lv in j["levels"]] == [1, 4, 16, 32], j
            assert j["small_bytes"] == 4096 and j["big_bytes"] == 24 * MIB, j
            assert 0 < j["latency_ms"]["p50"] <= j["latency_ms"]["p90"], j
            assert j["throttled"] == 0 and j["errors"] == 0, j
            ids = [c["id"] for c in j["causes"]]
            # s3rver serves more at 4+ in flight than at 1: one at a time is latency-bound.
            assert "latency-bound" in ids or "queue-depth" in ids, ids
            target = [c for c in j["causes"] if c["id"] == "target"][0]
            assert "beyond" in target["advice"], target  # 100 GiB/s is beyond s3rver
        r.run("s3_latency_against_concurrency", curve)

        def slowdown():
            def rule(req):
                if req.kind == "get" and "/test/ds/s0" in req.raw_path:
                    return ("error", 503, "SlowDown")
                return None
            with FaultProxy(srv, rules=[rule]) as proxy:
                p = s3_doctor(proxy.endpoint, "--json")
            assert p.returncode == 0, p.stderr
            j = json.loads(p.stdout)
            assert j["throttled"] > 0, j
            assert j["causes"][0]["id"] == "throttled", j["causes"]
        r.run("s3_slowdown_answers_are_counted_and_ranked_first", slowdown)

        def bad():
            env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
            p = subprocess.run([SLUICE, "doctor", "--url", "s3://empty/none", "--endpoint-url",
                                srv.endpoint, "--seconds", "2"], capture_output=True, text=True, env=env)
            assert p.returncode != 0 and "s3://empty/none" in p.stderr, (p.returncode, p.stderr)
            p = subprocess.run([SLUICE, "doctor", "--url", "s3://test/ds", "--endpoint-url",
                                "http://127.0.0.1:9", "--seconds", "2"], capture_output=True,
                               text=True, env=env, timeout=120)
            assert p.returncode == 1 and "port 9" in p.stderr and "s3://test/ds" in p.stderr, (
                p.returncode, p.stderr)
        r.run("s3_empty_prefix_and_dead_endpoint", bad)
    finally:
        srv.close()


def main():
    r = Runner()
    # DOCTOR_TEST_ONLY=a,b: only the cases whose names hold one of these (and the sweep).
    only = [w for w in os.environ.get("DOCTOR_TEST_ONLY", "").split(",") if w]
    cases = sorted((k, v) for k, v in globals().items() if k.startswith("test_") and
                   (not only or k == "test_sweep_reads_only_and_agrees_with_itself" or
                    any(w in k for w in only)))
    why = None
    if os.geteuid() != 0:
        why = "needs root (loop devices, mount, cgroups)"
    elif not shutil.which("losetup") or not shutil.which("mkfs.ext4"):
        why = "losetup or mkfs.ext4 missing"
    s = None
    if why is None:
        try:
            s = Setup()
        except Exception as e:  # no loop device, no mount: every case skips with the reason
            why = f"no RAM-backed loop device with ext4 could be set up: {e}"
    if find_s3rver():
        s3_cases(r)
    else:
        print("SKIP - s3 cases: s3rver not installed (make test-tools installs it)")
    if why:
        for name, _ in cases:
            print(f"SKIP - {name[5:]}: {why}")
        shutil.rmtree(WORK, ignore_errors=True)
        if r.passed == 0 and r.failed == 0:
            sys.exit(77)
        r.finish()
    s.ceiling = os.path.join(WORK, "ceiling.json")
    try:
        for name, fn in cases:
            if name != "test_sweep_reads_only_and_agrees_with_itself":
                continue
            r.run(name[5:], fn, s)
        for name, fn in cases:
            if name == "test_sweep_reads_only_and_agrees_with_itself":
                continue
            if not os.path.exists(s.ceiling):
                print(f"SKIP - {name[5:]}: the sweep failed, so there is no ceiling to compare with")
                continue
            try:
                fn(s)
                r.passed += 1
                print(f"ok   - {name[5:]}", flush=True)
            except Skip as e:
                print(f"SKIP - {name[5:]}: {e}", flush=True)
            except Exception:
                import traceback
                r.failed += 1
                print(f"FAIL - {name[5:]}\n{traceback.format_exc()}", flush=True)
    finally:
        s.close()
        shutil.rmtree(WORK, ignore_errors=True)
    r.finish()


main()
