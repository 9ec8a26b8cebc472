#!/usr/bin/python3
"""`sluice dataset` end to end: pack and read a local dataset, exactly once across ranks and
epochs, exact resume (twice, and on another world size), shards written by GNU tar in its
gnu, posix (PAX) and ustar formats, truncated and corrupt shards, bad input, Ctrl-C, and a
real S3 server (s3rver) that answers SlowDown.

Usage: dataset_test.py PATH/TO/sluice. The S3 parts say SKIP when s3rver is missing.
"""
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3_harness import Runner, S3rver, Skip, find_s3rver, sluice  # noqa: E402
from s3_faults_test import FaultProxy  # noqa: E402

BIN = None


class Ctx:
    def __init__(self, scratch, s3):
        self.scratch = scratch
        self.s3 = s3
        self.n = 0
        self.home = os.path.join(scratch, "home")

    def dir(self, name):
        self.n += 1
        return os.path.join(self.scratch, f"{self.n:02d}-{name}")


def run(*args, endpoint=None, timeout=300):
    env = {"SLUICE_HOME": ctx.home}
    return sluice(BIN, "dataset", *args, endpoint=endpoint, env=env, timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r


def make_source(d, n, seed=1, max_size=5000):
    """n samples of two files each (.bin, .cls), in two folders."""
    rng = random.Random(seed)
    keys = []
    for i in range(n):
        folder = "train" if i % 2 else "extra"
        os.makedirs(os.path.join(d, folder), exist_ok=True)
        key = f"{folder}/{i:05d}"
        with open(os.path.join(d, key + ".bin"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(max_size)))
        with open(os.path.join(d, key + ".cls"), "w") as f:
            f.write(str(i % 10))
        keys.append(key)
    return sorted(keys)


def read_keys(uri, *args, endpoint=None):
    r = ok(run("read", uri, "--keys", "--daemon", "none", *args, endpoint=endpoint))
    return r.stdout.splitlines()


def test_pack_read_exactly_once(ctx):
    src, dst = ctx.dir("src"), ctx.dir("ds")
    keys = make_source(src, 500)
    r = ok(run("pack", src, dst, "--shard-size", "128K", "--json"))
    summary = json.loads(r.stdout)
    assert summary["samples"] == 500 and summary["shards"] > 5, summary
    st = json.loads(ok(run("stat", dst, "--json")).stdout)
    assert st["format"] == "tar" and st["samples"] == 500 and st["indexed_shards"] == st["shards"], st
    # One rank, two epochs: each epoch once, epochs in different orders.
    both = read_keys(dst, "--seed", "7", "--epochs", "2", "--shuffle-window", "64")
    assert sorted(both[:500]) == keys and sorted(both[500:]) == keys
    assert both[:500] != both[500:], "two epochs in one order"
    assert both[:500] == read_keys(dst, "--seed", "7", "--shuffle-window", "64"), "not deterministic"
    # Ranks x workers: every sample once per epoch across the job.
    for world, workers in ((3, 1), (2, 3)):
        seen = collections.Counter()
        for rank in range(world):
            for worker in range(workers):
                seen.update(read_keys(dst, "--seed", "7", "--world", str(world), "--rank", str(rank),
                                      "--workers", str(workers), "--worker", str(worker)))
        assert sorted(seen) == keys and set(seen.values()) == {1}, (world, workers)
    # Two epochs through a fresh cache: every byte read is counted in a tier or the source
    # (a chunk prefetched, then read from a tier, counts in both), and the process reports
    # its CPU.
    two = json.loads(ok(run("read", dst, "--daemon", "none", "--epochs", "2", "--no-progress", "--json",
                            "--cache-dir", os.path.join(ctx.scratch, "two-epochs"))).stdout)
    tiers = two["cache"]
    assert tiers["ram_hit_bytes"] + tiers["nvme_hit_bytes"] + tiers["miss_bytes"] >= two["read_bytes"], two
    assert tiers["miss_bytes"] < two["read_bytes"], two  # the second epoch came from the cache
    assert two["cpu_user_s"] + two["cpu_system_s"] > 0, two
    # The loader's, cache's and store's metrics, as a Prometheus text file.
    prom = os.path.join(ctx.scratch, "read.prom")
    summary = json.loads(ok(run("read", dst, "--daemon", "none", "--metrics-file", prom,
                                "--metrics-interval", "0.2", "--no-progress", "--json")).stdout)
    # Metrics on must not hide the cache from the loader (a telemetry wrapper around it once
    # did: no declarations, no chunk-aligned reads, no tier figures in the summary).
    assert "cache" in summary, summary
    metrics = {}
    for line in open(prom):
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        metrics[name] = float(value)
    assert metrics["sluice_stream_samples_total"] == 500, metrics
    assert metrics["sluice_stream_first_batch_milliseconds"] >= 0, metrics
    assert any(k.startswith("sluice_cache_hit_bytes_total") for k in metrics), sorted(metrics)
    assert [f for f in os.listdir(ctx.scratch) if f.startswith("read.prom.tmp")] == []
    r = run("read", dst, "--metrics-file", os.path.join(ctx.scratch, "no", "such", "dir", "m.prom"))
    assert r.returncode == 1 and "metrics file" in r.stderr, r.stderr
    r = run("read", dst, "--metrics-interval", "nan")
    assert r.returncode == 2 and "seconds" in r.stderr, r.stderr


def test_resume_exact_and_elastic(ctx):
    src, dst = ctx.dir("src"), ctx.dir("ds")
    make_source(src, 300, seed=2)
    ok(run("pack", src, dst, "--shard-size", "64K"))
    common = ("--seed", "3", "--epochs", "2", "--shuffle-window", "50")
    full = read_keys(dst, *common)
    # Stop, resume, stop again, resume: the same keys in the same order.
    first = read_keys(dst, *common, "--limit", "123")
    token = first.pop()
    assert token.startswith("v3.0.123.") and ".50." in token, token
    second = read_keys(dst, *common, "--resume", token, "--limit", "250")
    token2 = second.pop()
    assert token2.startswith("v3.1."), token2
    # A token cut short (here its last characters) is refused, never resumed from.
    r = run("read", dst, "--daemon", "none", *common, "--resume", token[:-2], "--limit", "5")
    assert r.returncode != 0 and "resume token" in r.stderr, (r.returncode, r.stderr)
    rest = read_keys(dst, *common, "--resume", token2)
    assert first + second + rest == full
    # Two ranks stop in lockstep; three ranks finish the epoch: nothing twice, nothing missed.
    seen = collections.Counter()
    tokens = set()
    for rank in range(2):
        got = read_keys(dst, "--seed", "3", "--world", "2", "--rank", str(rank), "--limit", "40")
        tokens.add(got.pop())
        seen.update(got)
    assert len(tokens) == 1, tokens
    token = tokens.pop()
    for rank in range(3):
        seen.update(read_keys(dst, "--seed", "3", "--world", "3", "--rank", str(rank), "--resume", token))
    assert len(seen) == 300 and set(seen.values()) == {1}
    # A --limit past this rank's share still ends with a token (a script's next step needs
    # it), and says the share ended first; resuming from it reads nothing more.
    r = ok(run("read", dst, "--keys", "--daemon", "none", "--seed", "3", "--world", "8",
               "--rank", "1", "--limit", "1000"))
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("v3."), lines[-3:]
    assert "ended after" in r.stderr and "--limit 1000" in r.stderr, r.stderr
    assert read_keys(dst, "--seed", "3", "--world", "8", "--rank", "1", "--resume", lines[-1]) == []


def gnu_tar(folder, out, fmt, names):
    subprocess.run(["tar", f"--format={fmt}", "-cf", out, "-C", folder, *names], check=True)


def test_repacked_dataset_is_listed_again(ctx):
    """A dataset packed again in place, within the catalog's lifetime, is read anew."""
    a, b, dst = ctx.dir("a"), ctx.dir("b"), ctx.dir("ds")
    keys_a = make_source(a, 30, seed=11)
    ok(run("pack", a, dst))
    assert sorted(read_keys(dst)) == keys_a
    shutil.rmtree(dst)
    keys_b = [k.replace("extra", "other").replace("train", "more") for k in make_source(b, 40, seed=12)]
    for d in ("extra", "train"):
        os.rename(os.path.join(b, d), os.path.join(b, d.replace("extra", "other").replace("train", "more")))
    ok(run("pack", b, dst))
    assert sorted(read_keys(dst)) == sorted(keys_b)
    # The second read of an unchanged dataset comes from the catalog, and says so.
    r = ok(run("read", dst, "--keys", "--daemon", "none"))
    assert "node's catalog" in r.stderr and "--refresh" in r.stderr, r.stderr
    r = ok(run("read", dst, "--keys", "--daemon", "none", "--refresh"))
    assert "catalog" not in r.stderr, r.stderr


def test_system_tar_formats(ctx):
    d = ctx.dir("tars")
    src = os.path.join(d, "src")
    long_dir = "d" * 120
    os.makedirs(os.path.join(src, long_dir))
    names = []
    for i in range(5):
        for ext, data in (("txt", f"sample {i}".encode()), ("empty", b"")):
            rel = f"{long_dir}/s{i}.{ext}"
            with open(os.path.join(src, rel), "wb") as f:
                f.write(data)
            names.append(rel)
    out = os.path.join(d, "ds")
    os.makedirs(out)
    for fmt in ("gnu", "posix", "ustar"):
        gnu_tar(src, os.path.join(out, f"{fmt}.tar"), fmt, names)
    ls = json.loads(ok(run("ls", out, "--json")).stdout)
    assert [(x["key"], x["samples"], x["table"]) for x in ls] == \
        [(f"{f}.tar", 5, "scanned") for f in ("gnu", "posix", "ustar")], ls
    keys = read_keys(out, "--no-shuffle")
    assert keys == [f"{long_dir}/s{i}" for i in range(5)] * 3, keys[:3]


def test_corrupt_and_truncated_shards(ctx):
    src, dst = ctx.dir("src"), ctx.dir("ds")
    make_source(src, 60, seed=4, max_size=2000)
    ok(run("pack", src, dst, "--shard-size", "32K"))
    shards = sorted(f for f in os.listdir(dst) if f.endswith(".tar"))
    # A bit flipped in a header of an indexed shard: read names the shard and the offset.
    victim = os.path.join(dst, shards[1])
    with open(victim, "r+b") as f:
        f.seek(20)  # the first header's name
        b = f.read(1)
        f.seek(20)
        f.write(bytes([b[0] ^ 0xFF]))
    r = run("read", dst, "--daemon", "none", "--no-cache")
    assert r.returncode == 1 and shards[1] in r.stderr and "offset" in r.stderr, r.stderr
    r = ok(run("read", dst, "--no-cache", "--skip-corrupt", "--json"))
    j = json.loads(r.stdout)
    assert j["skipped_samples"] >= 1 and j["samples"] + j["skipped_samples"] == 60, j
    # A truncated shard without an index fails open, naming it; --skip-corrupt skips it.
    trunc = os.path.join(dst, shards[2])
    os.remove(trunc + ".idx")
    with open(trunc, "r+b") as f:
        f.truncate(os.path.getsize(trunc) - 1500)
    r = run("stat", dst)
    assert r.returncode == 1 and shards[2] in r.stderr and "offset" in r.stderr, r.stderr
    st = json.loads(ok(run("stat", dst, "--skip-corrupt", "--json")).stdout)
    assert st["skipped_shards"] == 1, st


def test_a_zeroed_page_is_corruption(ctx):
    """Issue 47, item 4: a 4 KiB page zeroed in the middle of a shard (a torn write) read as
    the shard's end: 24 of 40 samples and exit 0. Now the read fails naming the shard and
    where the data resumes; --skip-corrupt skips the shard and counts it."""
    d = ctx.dir("torn")
    src, out = os.path.join(d, "src"), os.path.join(d, "ds")
    os.makedirs(src)
    os.makedirs(out)
    names = []
    for i in range(20):
        name = f"s{i:03d}.bin"
        with open(os.path.join(src, name), "wb") as f:
            f.write(bytes([i]) * 1500)  # a header and 3 blocks: 2 KiB a sample
        names.append(name)
    for shard in ("a.tar", "b.tar"):
        gnu_tar(src, os.path.join(out, shard), "ustar", names)
    with open(os.path.join(out, "b.tar"), "r+b") as f:
        f.seek(5 * 4096)  # samples 10 and 11
        f.write(bytes(4096))
    r = run("read", out, "--keys", "--daemon", "none", "--no-cache")
    assert r.returncode == 1, (r.returncode, r.stdout.count("\n"), r.stderr)
    assert "b.tar" in r.stderr and "followed by data at offset" in r.stderr, r.stderr
    r = ok(run("read", out, "--daemon", "none", "--no-cache", "--skip-corrupt", "--json"))
    j = json.loads(r.stdout)
    assert j["samples"] == 20, j


def test_a_link_out_of_the_folder_is_skipped(ctx):
    """Issue 47, item 9: one symlink out of a dataset's folder failed its open for everyone.
    It is left out, and the command names it."""
    src, dst = ctx.dir("src"), ctx.dir("ds")
    keys = make_source(src, 10, seed=6)
    ok(run("pack", src, dst))
    secret = os.path.join(ctx.scratch, "secret.tar")
    with open(secret, "wb") as f:
        f.write(b"not part of it")
    os.symlink(secret, os.path.join(dst, "zz-evil.tar"))
    r = ok(run("read", dst, "--keys", "--daemon", "none", "--no-cache"))
    assert sorted(r.stdout.splitlines()) == keys
    assert "skipped" in r.stderr and "zz-evil.tar" in r.stderr, r.stderr


def test_bad_input(ctx):
    src, dst = ctx.dir("src"), ctx.dir("ds")
    make_source(src, 10, seed=5)
    ok(run("pack", src, dst))
    for args, code, words in (
            (("read", dst, "--resume", "garbage"), 2, "malformed"),
            (("read", dst, "--rank", "2", "--world", "2"), 2, "rank 2"),
            (("read", dst, "--seed", "1", "--resume", "v1.0.5.10.0000000000000000.1.0"), 2,
             "another dataset"),
            (("read", os.path.join(ctx.scratch, "nothing-here")), 1, "does not exist"),
            (("stat", os.path.join(ctx.scratch, "nothing-here")), 1, "does not exist"),
            (("pack", src, dst), 1, "already holds objects"),
            (("pack", os.path.join(ctx.scratch, "missing"), ctx.dir("x")), 1, "not a directory"),
            (("pack", src, ctx.dir("y"), "--shard-size", "1"), 2, "shard-size"),
            (("pack", src, ctx.dir("y"), "--shard-size", "16E"), 2, "unit"),
            (("read", dst, "--epochs", "-1"), 2, "whole number"),
            (("read", dst, "--seed", "99999999999999999999"), 2, "whole number"),
            (("read", dst, "--limit", "-1"), 2, "whole number"),
            (("read", dst, "--limit", "0"), 2, "at least 1"),
            (("read", dst, "--world", "0"), 2, "from 1 to"),
            (("read", dst, "--epoch", "18446744073709551615", "--epochs", "2"), 2, "overflow")):
        r = run(*args, "--daemon", "none") if args[0] == "read" else run(*args)
        assert r.returncode == code and words in r.stderr, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and "terminate" not in r.stderr
    assert not os.path.exists(os.path.join(ctx.scratch, "nothing-here")), "a reader created the path"
    empty = ctx.dir("empty")
    os.makedirs(empty)
    r = run("stat", empty)
    assert r.returncode == 1 and "no objects" in r.stderr, r.stderr


def test_interrupt_prints_token(ctx):
    src, dst = ctx.dir("src"), ctx.dir("ds")
    make_source(src, 2000, seed=6, max_size=200)
    ok(run("pack", src, dst, "--shard-size", "64K"))
    env = dict(os.environ, SLUICE_HOME=ctx.home)
    p = subprocess.Popen([BIN, "dataset", "read", dst, "--keys", "--epochs", "0", "--daemon", "none"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, (p.returncode, err)
    lines = out.splitlines()
    assert lines and lines[-1].startswith("v3."), lines[-3:]


def test_killed_pack_is_cleaned_up_by_the_next(ctx):
    """kill -9 mid-pack leaves a temporary shard; the next pack (once the process is gone)
    removes it and packs the folder whole."""
    src, dst = ctx.dir("src"), ctx.dir("dst")
    os.makedirs(src)
    for i in range(64):
        with open(os.path.join(src, f"{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(4 << 20))
    p = subprocess.Popen([BIN, "dataset", "pack", src, dst, "--shard-size", "1G", "--no-progress"],
                         env=dict(os.environ, SLUICE_HOME=ctx.home),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = os.path.join(dst, ".sluice-tmp")
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline and not (os.path.isdir(tmp) and os.listdir(tmp)):
        time.sleep(0.005)
    p.kill()
    p.wait()  # reaped: its PID is gone, as after a crash
    if not os.path.isdir(tmp) or not os.listdir(tmp):
        raise Skip("pack finished before the kill: there was nothing to clean up")
    ok(run("pack", src, dst, "--shard-size", "1G"))
    assert not os.path.exists(tmp) or not os.listdir(tmp), os.listdir(tmp)
    assert len(read_keys(dst)) == 64


def test_killed_pack_is_not_a_dataset(ctx):
    """Defect 8 of the hostile test: kill -9 once some shards are published; the shards are
    whole, but `stat` and `read` refuse the dataset (no completion record), never read part."""
    src, dst = ctx.dir("src"), ctx.dir("dst")
    os.makedirs(src)
    for i in range(400):
        with open(os.path.join(src, f"{i:04d}.bin"), "wb") as f:
            f.write(os.urandom(256 << 10))
    p = subprocess.Popen([BIN, "dataset", "pack", src, dst, "--shard-size", "1M", "--no-progress"],
                         env=dict(os.environ, SLUICE_HOME=ctx.home),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline and not (
            os.path.isdir(dst) and sum(n.endswith(".tar") for n in os.listdir(dst)) >= 3):
        time.sleep(0.005)
    p.kill()
    p.wait()
    if p.returncode == 0:
        raise Skip("pack finished before the kill")
    for args in (("stat", dst), ("read", dst, "--daemon", "none")):
        r = run(*args)
        assert r.returncode == 1 and "not complete" in r.stderr, (args, r.returncode, r.stderr)


def test_s3_pack_read_slowdown(ctx):
    src = ctx.dir("src")
    keys = make_source(src, 200, seed=8)
    ok(run("pack", src, "s3://test/ds", "--shard-size", "64K", endpoint=ctx.s3.endpoint))
    local = ctx.dir("local")
    ok(run("pack", src, local, "--shard-size", "64K"))
    via_s3 = read_keys("s3://test/ds", "--seed", "5", "--no-cache", endpoint=ctx.s3.endpoint)
    assert sorted(via_s3) == keys
    assert via_s3 == read_keys(local, "--seed", "5"), "order differs between stores"
    assert via_s3 == read_keys("s3://test/ds", "--seed", "5", "--cache-dir", ctx.dir("cache"),
                               endpoint=ctx.s3.endpoint)
    # Plain objects, one sample per key.
    objs = ctx.dir("objs")
    os.makedirs(objs)
    for i in range(50):
        with open(os.path.join(objs, f"{i:03d}.json"), "w") as f:
            f.write("{}")
    for i in range(50):
        r = sluice(BIN, "cp", os.path.join(objs, f"{i:03d}.json"), f"s3://test/objs/{i:03d}.json",
                   endpoint=ctx.s3.endpoint)
        assert r.returncode == 0, r.stderr
    got = read_keys("s3://test/objs", "--no-cache", endpoint=ctx.s3.endpoint)
    assert sorted(got) == [f"{i:03d}" for i in range(50)], got[:5]
    # A server that answers SlowDown more often than the S3 client retries: the loader backs
    # off and finishes, with every sample once.
    fails = collections.Counter()

    def slowdown(req):
        if req.kind == "get" and "/test/ds/" in req.raw_path and fails[req.raw_path] < 7:
            fails[req.raw_path] += 1
            return ("error", 503, "SlowDown")
        return None

    with FaultProxy(ctx.s3, rules=[slowdown]) as proxy:
        r = ok(run("read", "s3://test/ds", "--no-cache", "--json", "--seed", "5", "--daemon", "none",
                   endpoint=proxy.endpoint))
        j = json.loads(r.stdout)
        assert j["samples"] == 200 and j["throttled"] >= 1, j
        assert proxy.faults(), "no SlowDown was sent"


def test_a_shard_larger_than_a_slice(ctx):
    """A shard over a quarter of --memory is read in parts: every sample still once, the
    parts counted, and the report says how much memory reads each chunk once."""
    src, dst = ctx.dir("src"), ctx.dir("ds")
    keys = make_source(src, 300, seed=3, max_size=200_000)
    ok(run("pack", src, dst, "--shard-size", "1G"))
    # The embedded cache without a RAM tier (the default) takes each chunk once a part.
    cache = os.path.join(ctx.scratch, "parts-cache")
    args = ("--daemon", "none", "--memory", "32M", "--cache-dir", cache, "--no-progress")
    assert sorted(read_keys(dst, *args[2:])) == keys
    j = json.loads(ok(run("read", dst, *args, "--json")).stdout)
    assert j["samples"] == 300 and j["window_parts"] >= 2, j
    # The chunks were read once a part, not once a sample: 300 requests would be one a sample.
    assert j["requests"] < 150, j
    text = ok(run("read", dst, *args)).stdout
    assert "parts of shuffle windows larger than a quarter of --memory (32M)" in text, text
    shard = max(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst) if f.endswith(".tar"))
    assert f"--memory {(4 * shard + (1 << 20) - 1) >> 20}M" in text, text
    # With that much, no parts and no note.
    big = f"{(4 * shard + (1 << 20) - 1) >> 20}M"
    j = json.loads(ok(run("read", dst, "--daemon", "none", "--memory", big, "--cache-dir", cache,
                          "--no-progress", "--json")).stdout)
    assert j["samples"] == 300 and j["window_parts"] == 0, j


def main():
    global BIN, ctx
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} PATH/TO/sluice", file=sys.stderr)
        sys.exit(2)
    BIN = os.path.abspath(sys.argv[1])
    scratch = tempfile.mkdtemp(prefix="sluice-dataset-")
    runner = Runner()
    s3 = None
    try:
        have_s3 = bool(find_s3rver())
        if have_s3:
            s3 = S3rver()
        ctx = Ctx(scratch, s3)
        tests = [test_pack_read_exactly_once, test_resume_exact_and_elastic,
                 test_repacked_dataset_is_listed_again, test_system_tar_formats,
                 test_corrupt_and_truncated_shards, test_a_zeroed_page_is_corruption,
                 test_a_link_out_of_the_folder_is_skipped,
                 test_bad_input, test_interrupt_prints_token,
                 test_killed_pack_is_cleaned_up_by_the_next, test_killed_pack_is_not_a_dataset,
                 test_a_shard_larger_than_a_slice]
        if have_s3:
            tests.append(test_s3_pack_read_slowdown)
        else:
            print("SKIP - S3 dataset tests: s3rver not installed")
        for t in tests:
            t0 = time.monotonic()
            runner.run(t.__name__, t, ctx)
            print(f"     ({time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        if s3:
            s3.close()
        shutil.rmtree(scratch, ignore_errors=True)
    runner.finish()


ctx = None

if __name__ == "__main__":
    main()
