#!/usr/bin/python3
"""The tiered cache from the command line (embedded mode: a cache directory, no daemon):
sluice cat and cp through the cache from s3rver and from local files, cache stat / ls /
warm / pin / evict / verify, staleness, corruption on disk, kill -9 during a warm, and bad
input. s3rver missing: its cases SKIP; the local ones still run.

    /usr/bin/python3 tests/integration/cache_cli_test.py build/bin/sluice
"""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from s3_harness import Runner, S3rver, find_s3rver  # noqa: E402

SLUICE = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="sluice-cache-cli-")
HOME = os.path.join(WORK, "home")
MIB = 1 << 20


def env():
    e = dict(os.environ, SLUICE_HOME=HOME, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    return e


def run(*args, check=True, timeout=120):
    p = subprocess.run([SLUICE, *args], capture_output=True, env=env(), timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {p.returncode}: {p.stderr.decode()}")
    return p


def js(*args):
    return json.loads(run(*args, "--json").stdout)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def fresh_cache():
    shutil.rmtree(HOME, ignore_errors=True)


def local_data():
    d = os.path.join(WORK, "data")
    shutil.rmtree(d, ignore_errors=True)
    objs = {f"{d}/big.bin": random.randbytes(9 * MIB + 17), f"{d}/sub/small.bin": random.randbytes(1000)}
    for p, b in objs.items():
        write(p, b)
    return d, objs


def test_cat_and_ranges_through_the_cache():
    fresh_cache()
    d, objs = local_data()
    big = objs[f"{d}/big.bin"]
    p = run("cat", "--cache", f"{d}/big.bin")
    assert p.stdout == big
    assert b"note" not in p.stderr, p.stderr  # no daemon on the node: the default, not news
    assert run("cat", f"cache+file://{d}/big.bin").stdout == big  # now from the cache
    for rng, want in (("0-0", big[:1]), ("4194303-4194305", big[4194303:4194306]),
                      (f"{len(big) - 5}-", big[-5:]), ("-7", big[-7:]), ("0-100000000", big),
                      ("100-", big[100:]), ("5000-8000000", big[5000:8000001])):
        got = run("cat", "--cache", f"{d}/big.bin", "--range", rng).stdout
        assert got == want, rng
    # A range that starts past the end is refused, as HTTP's 416; a prefix is not an object.
    for rng in (f"{len(big)}-", f"{len(big) + 10}-{len(big) + 20}"):
        p = run("cat", "--cache", f"{d}/big.bin", "--range", rng, check=False)
        assert p.returncode == 2 and b"past the end" in p.stderr, (rng, p.stderr)
    p = run("cat", f"{d}/", check=False)
    assert p.returncode == 2 and b"names a prefix" in p.stderr, p.stderr
    s = js("cache", "stat")
    assert s["nvme"]["chunks"] == 3, s  # 9 MiB in 4 MiB chunks
    assert s["stores"][0]["store"] == "file:///", s


def test_a_directory_keeps_its_chunk_size_and_stat_its_capacity():
    # Made with --chunk-size 64K: every later command uses that size without the flag;
    # another size is refused by name. cache stat shows the configured capacity.
    fresh_cache()
    d, objs = local_data()
    big = objs[f"{d}/big.bin"]
    assert run("cat", "--cache", f"{d}/big.bin", "--chunk-size", "64K").stdout == big
    s = js("cache", "stat", "--cache-size", "3G")
    assert s["nvme"]["chunks"] == (len(big) + (64 << 10) - 1) // (64 << 10), s
    assert s["nvme"]["capacity"] == 3 << 30, s
    assert run("cat", "--cache", f"{d}/big.bin", "--range", "0-9").stdout == big[:10]
    assert len(js("cache", "ls", f"{d}/big.bin")) == s["nvme"]["chunks"]
    p = run("cat", "--cache", f"{d}/big.bin", "--chunk-size", "1M", check=False)
    assert p.returncode == 2 and b"65536" in p.stderr, p.stderr


def test_cp_through_the_cache_counts_where_bytes_came_from():
    fresh_cache()
    d, objs = local_data()
    out = os.path.join(WORK, "out.bin")
    first = js("cp", "--cache", f"{d}/big.bin", out)
    assert first["cache"]["hit_bytes"] == 0 and first["cache"]["miss_bytes"] == len(objs[f"{d}/big.bin"])
    assert first["cache"]["chunks_not_kept"] == 0, first
    os.remove(out)
    second = js("cp", "--cache", f"{d}/big.bin", out)
    assert second["cache"]["hit_bytes"] == len(objs[f"{d}/big.bin"]) and second["cache"]["miss_bytes"] == 0
    assert open(out, "rb").read() == objs[f"{d}/big.bin"]


def test_cp_through_a_cache_that_keeps_little_fetches_each_byte_once():
    # 72 MiB: cp's part size would be 9 MiB, so parts would share the 4 MiB chunks at their
    # edges, and a cache too small to keep them would fetch those twice.
    fresh_cache()
    src = os.path.join(WORK, "parts", "obj.bin")
    data = random.randbytes(72 * MIB + 5)
    write(src, data)
    out = os.path.join(WORK, "parts-out.bin")
    rep = js("cp", "--cache", src, out, "--cache-size", "8M")
    assert rep["cache"]["miss_bytes"] == len(data), rep["cache"]
    assert open(out, "rb").read() == data
    shutil.rmtree(os.path.dirname(src))
    os.remove(out)
    # A warm into a cache that cannot keep it says how much it could not keep and exits 1.
    write(src, data[:20 * MIB])
    p = run("cache", "warm", src, "--cache-size", "8M", "--json", "--no-progress", check=False)
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and rep["failed"] == 0 and rep["not_kept_bytes"] > 0, (p.returncode, rep)
    assert b"could not be kept" in p.stderr, p.stderr
    shutil.rmtree(os.path.dirname(src))


def test_warm_pin_evict_ls():
    fresh_cache()
    d, objs = local_data()
    w = js("cache", "warm", f"{d}/")
    assert w["objects"] == 2 and w["fetched_bytes"] == sum(len(b) for b in objs.values()), w
    again = js("cache", "warm", f"{d}/")
    assert again["fetched_bytes"] == 0 and again["already_cached_bytes"] > 0, again
    listing = js("cache", "ls", f"{d}/sub/")
    assert [c["key"] for c in listing] == [f"{d}/sub/small.bin"[1:]], listing
    assert js("cache", "pin", f"{d}/sub/")["chunks"] == 1
    assert all(c["pinned"] for c in js("cache", "ls", f"{d}/sub/"))
    assert js("cache", "evict", f"{d}/")["chunks"] == 4
    assert js("cache", "ls") == []
    lst = os.path.join(WORK, "list.txt")
    with open(lst, "w") as f:
        f.write(f"# one per line\n{d}/sub/small.bin\n")
    assert js("cache", "warm", "--list", lst)["objects"] == 1
    assert all(c["pinned"] for c in js("cache", "ls"))  # the pin outlived the eviction


def test_a_changed_file_is_never_served_stale():
    fresh_cache()
    d, _ = local_data()
    p = f"{d}/sub/small.bin"
    old = open(p, "rb").read()
    assert run("cat", "--cache", p).stdout == old
    time.sleep(0.01)
    write(p, b"new bytes")
    assert run("cat", "--cache", p, "--revalidate-ms", "0").stdout == b"new bytes"
    assert run("cat", "--cache", p, "--offline").stdout == b"new bytes"


def test_verify_finds_and_drops_corrupt_chunks():
    fresh_cache()
    d, objs = local_data()
    run("cache", "warm", f"{d}/")
    # Segments hold one object's chunks each (big.bin's in one or more, small.bin in its own).
    files = sorted(glob.glob(os.path.join(HOME, "cache", "chunks", "*", "*.seg")), key=os.path.getsize)
    assert 2 <= len(files) <= 4 and os.path.getsize(files[-1]) >= 4 * MIB, files
    with open(files[-1], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    p = run("cache", "verify", check=False)
    assert p.returncode == 1 and b"checksum mismatch" in p.stderr, p
    assert js("cache", "verify")["corrupt"] == []
    # What was dropped is fetched again, correctly.
    assert run("cat", "--cache", f"{d}/big.bin").stdout == objs[f"{d}/big.bin"]


def test_kill_nine_during_warm_leaves_a_consistent_cache():
    fresh_cache()
    d = os.path.join(WORK, "many")
    shutil.rmtree(d, ignore_errors=True)
    objs = {f"{d}/o{i:03d}": random.randbytes(random.randrange(1, 3 * MIB)) for i in range(60)}
    for p, b in objs.items():
        write(p, b)
    for delay in (0.05, 0.15, 0.3):
        proc = subprocess.Popen([SLUICE, "cache", "warm", f"{d}/", "--cache-size", "64M", "--no-progress"],
                                env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert js("cache", "verify")["corrupt"] == []
        for p, b in random.sample(sorted(objs.items()), 5):
            assert run("cat", "--cache", p, "--cache-size", "64M").stdout == b, p


def test_bad_input_is_a_clear_error():
    fresh_cache()
    d, _ = local_data()
    cases = [
        (["cat", "--cache", f"{d}/missing"], 1, b"missing"),
        (["cat", "--cache", f"{d}/big.bin", "--policy", "arc"], 2, b"arc"),
        (["cat", "--cache", f"{d}/big.bin", "--chunk-size", "1K"], 2, b"64 KiB"),
        (["cat", f"{d}/big.bin", "--range", "9-3"], 2, b"before the start"),
        (["cat", f"{d}/big.bin", "--range", "x"], 2, b"--range"),
        (["cache", "warm"], 2, b"--list"),
        (["cache", "evict"], 2, b"PREFIX"),
    ]
    # A list whose second line the file system refuses (a name over NAME_MAX): an error
    # naming the line, not an exception.
    bad_list = os.path.join(d, "bad-list.txt")
    with open(bad_list, "w") as f:
        f.write(f"{d}/big.bin\n{d}/{'b' * 300}/{'c' * 5000}\n")
    cases.append((["cache", "warm", "--list", bad_list], 2, b"line 2"))
    for args, rc, want in cases:
        p = run(*args, check=False)
        assert p.returncode == rc and want in p.stderr, (args, p.returncode, p.stderr)
    # An index that is not one is named, and the directory is left alone.
    os.makedirs(os.path.join(HOME, "cache"), exist_ok=True)
    with open(os.path.join(HOME, "cache", "index.log"), "wb") as f:
        f.write(b"not an index")
    p = run("cache", "stat", check=False)
    assert p.returncode == 1 and b"index.log" in p.stderr, p


def test_s3(srv):
    fresh_cache()
    big, small = random.randbytes(6 * MIB + 3), random.randbytes(500)
    for key, data in (("ds/big", big), ("ds/small", small)):
        path = os.path.join(WORK, "up.bin")
        write(path, data)
        run("cp", path, f"s3://test/{key}", "--endpoint-url", srv.endpoint)
    ep = ["--endpoint-url", srv.endpoint]
    assert run("cat", "cache+s3://test/ds/big", *ep).stdout == big
    w = js("cache", "warm", "s3://test/ds/", *ep)
    assert w["objects"] == 2 and w["fetched_bytes"] == len(small), w
    # The cache serves what it holds without the server: stop it, read offline.
    listing = js("cache", "ls", "s3://test/ds/", *ep)
    assert {c["key"] for c in listing} == {"ds/big", "ds/small"}, listing
    srv.close()
    assert run("cat", "cache+s3://test/ds/big", "--offline", *ep).stdout == big
    p = run("cat", "cache+s3://test/ds/big", "--revalidate-ms", "0", *ep, check=False)
    assert p.returncode != 0 and b"ds/big" in p.stderr, p  # must check, and cannot


def main():
    r = Runner()
    for name, fn in sorted((k, v) for k, v in globals().items() if k.startswith("test_") and k != "test_s3"):
        r.run(name[5:], fn)
    if find_s3rver():
        srv = S3rver(buckets=("test",))
        try:
            r.run("s3", test_s3, srv)
        finally:
            srv.close()
    else:
        print("SKIP - s3: s3rver not installed (make test-tools installs it)")
    shutil.rmtree(WORK, ignore_errors=True)
    r.finish()


main()
