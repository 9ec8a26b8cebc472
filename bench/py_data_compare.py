#!/usr/bin/env python3
"""sluice.data and sluice.read_into from S3 against the Python libraries PyTorch users pick
today, on the same samples, each tool in its own format written by its own writer, from a
real S3 server (s3rver on loopback), interleaved, several rounds, median ratios. Run with
the project's .venv after a build, with the anchors installed
(`scripts/install-python.sh --bench`):

    .venv/bin/python bench/py_data_compare.py                    # every case, 5 rounds
    .venv/bin/python bench/py_data_compare.py --cases epoch --samples 10000 --rounds 5
    .venv/bin/python bench/py_data_compare.py --markdown         # a table for docs/performance.md

Cases:
  epoch   100 KiB samples (--samples), shuffled, DataLoader with --workers workers, batch 32:
          epoch 1 from S3 into each tool's local cache (cold), then epoch 2 from it (warm).
          sluice.data.StreamingDataset through a fresh sluiced (its cache on this disk;
          started, its RAM tier allocated, before the run, as a node's daemon is before a
          job) against
          MosaicML Streaming (MDSWriter, local cache dir), LitData (optimize, cache_dir) and
          webdataset (TarWriter shards, its URL pipeline `pipe:curl`, cache_dir).
  small   the same with 1 KiB samples (--small-samples): warm samples per second.
  read    one object (--object, 1 GiB) into a preallocated buffer: sluice.read_into against
          s3torchconnector (S3Client.get_object().readinto, AWS CRT) and boto3
          (download_fileobj, its threaded transfer, into the same kind of buffer).
Every measurement runs in a fresh process, with a fresh cache directory; rounds alternate
which tool goes first. Anchors not installed are skipped, with the reason.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from benchlib import parse_size, print_table  # noqa: E402
import sluiced_harness  # noqa: E402

BUILD = os.environ.get("SLUICE_BUILD", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))
BUCKET = "bench"
SHARD = 64 << 20  # every tool's shard, chunk or part target
BATCH = 32
failures: dict = {}  # tool: runs that failed (each was run again once)

# The samples every tool writes: sample i is `size` bytes of one random block starting at a
# place that depends on i, and its class i % 10.
_BLOCK = random.Random(7).randbytes(4 << 20)


def sample_bytes(i, size):
    at = (i * 4099) % (len(_BLOCK) - size)
    return _BLOCK[at:at + size]


def _lit_sample(args):  # litdata.optimize's function (top level: its workers are spawned)
    i, size = args
    return {"bin": sample_bytes(i, size), "cls": i % 10}


# ---- the children: one measurement each --------------------------------------------------

CHILD = r"""
import json, os, sys, time
import torch
tool, prefix, n, workers, cache, endpoint, batch = sys.argv[1:8]
n, workers, batch = int(n), int(workers), int(batch)
# Every tool alike: tensors reach the main process by shared-memory file name, not by a
# descriptor each (LitData's workers ran out of descriptors with 20,000 allowed)
torch.multiprocessing.set_sharing_strategy("file_system")
out = {}
# The anchors' batches are lists of samples, pickled from the workers (no collation:
# LitData's bytes fields are memoryviews, which torch's default_collate would collate byte
# by byte and which cannot be pickled from a worker: they become bytes here, in the worker,
# as a user's collate would). sluice runs both ways: "sluice" with its default collation
# (each batch handed over in shared memory), "sluice-list" with this collate, as the anchors.
def as_list(batch):
    for s in batch:
        for k, v in s.items():
            if isinstance(v, memoryview):
                s[k] = bytes(v)
    return batch
if tool in ("sluice", "sluice-list"):
    import sluice.data
    ds = sluice.data.StreamingDataset(f"s3://bench/{prefix}", seed=1, session_options={
        "daemon": os.environ["BENCH_SOCKET"], "endpoint_url": endpoint,
        "home": os.path.join(cache, "home")})
    loader = sluice.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                    collate_fn=as_list if tool == "sluice-list" else None)
elif tool == "mosaic":
    import streaming
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()  # what an earlier run left in /dev/shm (its docs ask for it)
    ds = streaming.StreamingDataset(remote=f"s3://bench/{prefix}", local=cache, shuffle=True,
                                    shuffle_seed=1, batch_size=batch)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         collate_fn=as_list)
elif tool == "litdata":
    import litdata, litdata.streaming.downloader as ldd
    # litdata's fast path (obstore) refuses http:// endpoints unless told to allow them
    ldd._OBSTORE_CLIENT_OPTIONS = {**ldd._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    ds = litdata.StreamingDataset(f"s3://bench/{prefix}", cache_dir=cache, shuffle=True, seed=1,
                                  storage_options={"endpoint_url": endpoint,
                                                   "aws_access_key_id": "S3RVER",
                                                   "aws_secret_access_key": "S3RVER"})
    loader = litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers,
                                         collate_fn=as_list)
elif tool == "webdataset":
    import webdataset as wds
    shards = json.loads(os.environ["BENCH_SHARDS"])
    urls = [f"pipe:curl -sf {endpoint}/bench/{k}" for k in shards]
    ds = wds.WebDataset(urls, shardshuffle=100, seed=1, cache_dir=cache,
                        nodesplitter=wds.split_by_node, empty_check=False).shuffle(1000)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         collate_fn=as_list)
for epoch in (1, 2):
    got = 0
    t0 = time.monotonic()
    for batch in loader:
        got += len(batch["__key__"]) if isinstance(batch, dict) else len(batch)
    out[f"epoch{epoch}"] = time.monotonic() - t0
    if got != n:
        sys.exit(f"{tool}: epoch {epoch} gave {got} samples, not {n}")
print(json.dumps(out))
"""

READ_CHILD = r"""
import json, os, sys, time
import numpy as np
tool, key, size, endpoint = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
buf = np.empty(size, dtype=np.uint8)
t0 = time.monotonic()
if tool == "sluice":
    import sluice
    s = sluice.connect(daemon="none", endpoint_url=endpoint, home=os.environ["BENCH_HOME"])
    got = s.read_into(f"s3://bench/{key}", buf)
elif tool == "s3torchconnector":
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    c = S3Client("us-east-1", endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    got = c.get_object("bench", key).readinto(memoryview(buf))
elif tool == "boto3":
    import boto3
    class Into:  # a seekable file over the buffer, for s3transfer's ranged writes
        def __init__(self, mv): self.mv, self.pos = mv, 0
        def seek(self, pos, whence=0): self.pos = pos if whence == 0 else self.pos + pos; return self.pos
        def tell(self): return self.pos
        def write(self, b): self.mv[self.pos:self.pos + len(b)] = b; self.pos += len(b); return len(b)
    boto3.client("s3", endpoint_url=endpoint).download_fileobj("bench", key, Into(memoryview(buf)))
    got = size
seconds = time.monotonic() - t0
if got != size:
    sys.exit(f"{tool}: read {got} bytes of {size}")
print(json.dumps({"seconds": seconds, "check": int(buf[::1 << 20].astype(np.uint64).sum())}))
"""


def _die_with_parent():
    """In a child: SIGKILL when the bench dies (a stopped bench left children running)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_child(script, args, env, timeout=1800):
    p = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=env, preexec_fn=_die_with_parent)
    if p.returncode != 0:
        raise RuntimeError(f"{args[0]} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def start_sluiced(workdir, endpoint, env):
    """A fresh sluiced over its own cache directory, with its defaults (1 GiB RAM tier),
    ready: as a node's daemon is when a job starts, its RAM tier allocated (its start,
    1-3 s on these VMs, is not a job's)."""
    d = sluiced_harness.Sluiced(os.path.join(BUILD, "bin", "sluiced"),
                                os.path.join(workdir, "sluiced.sock"),
                                os.path.join(workdir, "cache"), ["--endpoint-url", endpoint],
                                env=env)
    d.wait_for("RAM tier ready")
    return d


# ---- writing each tool's format -----------------------------------------------------------

def upload_dir(s3, local, prefix):
    keys = []
    for name in sorted(os.listdir(local)):
        s3.upload_file(os.path.join(local, name), BUCKET, f"{prefix}/{name}")
        keys.append(f"{prefix}/{name}")
    return keys


def write_formats(tools, work, s3, endpoint, env, n, size, tag):
    """Each tool's own writer, from the same samples; returns what the readers need."""
    shards = {}
    stage = os.path.join(work, "stage")
    for tool in tools:
        if tool == "sluice-list":
            continue  # reads what "sluice" wrote
        shutil.rmtree(stage, ignore_errors=True)
        os.makedirs(stage)
        t0 = time.monotonic()
        prefix = f"{tool}-{tag}"
        if tool == "sluice":
            files = os.path.join(work, "files")
            os.makedirs(files)
            for i in range(n):
                with open(os.path.join(files, f"s{i:08d}.bin"), "wb") as f:
                    f.write(sample_bytes(i, size))
                with open(os.path.join(files, f"s{i:08d}.cls"), "wb") as f:
                    f.write(str(i % 10).encode())
            p = subprocess.run([os.path.join(BUILD, "bin", "sluice"), "dataset", "pack", files,
                                f"s3://{BUCKET}/{prefix}", "--shard-size", str(SHARD),
                                "--endpoint-url", endpoint, "--no-progress"],
                               capture_output=True, text=True, env=env)
            shutil.rmtree(files)
            if p.returncode != 0:
                raise RuntimeError(f"sluice dataset pack failed: {p.stderr}")
        elif tool == "mosaic":
            from streaming import MDSWriter
            with MDSWriter(out=(stage, f"s3://{BUCKET}/{prefix}"),
                           columns={"bin": "bytes", "cls": "int"}, size_limit=SHARD) as w:
                for i in range(n):
                    w.write({"bin": sample_bytes(i, size), "cls": i % 10})
        elif tool == "litdata":
            import litdata
            litdata.optimize(fn=_lit_sample, inputs=[(i, size) for i in range(n)],
                             output_dir=stage, chunk_bytes=SHARD, num_workers=1,
                             mode="overwrite")
            upload_dir(s3, stage, prefix)
        elif tool == "webdataset":
            import webdataset as wds
            with wds.ShardWriter(os.path.join(stage, "shard-%06d.tar"), maxsize=SHARD,
                                 maxcount=10**9, verbose=0) as sink:
                for i in range(n):
                    sink.write({"__key__": f"s{i:08d}", "bin": sample_bytes(i, size),
                                "cls": str(i % 10).encode()})
            shards[tool] = upload_dir(s3, stage, prefix)
        print(f"  {tool}: wrote {n} samples of {size} B in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
    shutil.rmtree(stage, ignore_errors=True)
    return shards


def available(tools):
    mods = {"sluice": "sluice", "sluice-list": "sluice", "mosaic": "streaming", "litdata": "litdata",
            "webdataset": "webdataset", "s3torchconnector": "s3torchconnector", "boto3": "boto3"}
    have = []
    for t in tools:
        if importlib.util.find_spec(mods[t]) is None:
            print(f"SKIP {t}: {mods[t]} is not installed (scripts/install-python.sh --bench)",
                  file=sys.stderr)
        else:
            have.append(t)
    return have


def versions():
    from importlib.metadata import version, PackageNotFoundError
    out = []
    for dist in ("torch", "mosaicml-streaming", "litdata", "webdataset", "s3torchconnector",
                 "boto3", "numpy"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def epochs(tools, work, endpoint, env, n, workers, rounds, shards, tag):
    """Per tool: epoch 1 and epoch 2 seconds per round (order alternating). A run that
    fails is tried again, up to 3 times, each failure counted in `failures`; a round where
    all 3 fail has None for that tool (MosaicML Streaming 0.13 fails about half its runs here
    after the first, reading a sample with an empty field, with fresh caches each time)."""
    times = {t: {"epoch1": [], "epoch2": []} for t in tools}
    for r in range(rounds):
        order = tools if r % 2 == 0 else list(reversed(tools))
        for tool in order:
            cache = os.path.join(work, f"cache-{tool}")
            shutil.rmtree(cache, ignore_errors=True)
            os.makedirs(cache)
            cenv = dict(env, BENCH_SHARDS=json.dumps(shards.get(tool, [])))
            fmt = "sluice" if tool.startswith("sluice") else tool
            got = None
            for attempt in (1, 2, 3):
                daemon = start_sluiced(cache, endpoint, env) if fmt == "sluice" else None
                try:
                    if daemon:
                        cenv["BENCH_SOCKET"] = daemon.socket
                    got = run_child(CHILD, [tool, f"{fmt}-{tag}", n, workers, cache, endpoint,
                                            BATCH], cenv)
                    break
                except RuntimeError as e:
                    failures[tool] = failures.get(tool, 0) + 1
                    print(f"  round {r + 1} {tool} failed (attempt {attempt}): "
                          f"{str(e).strip().splitlines()[-1]}", file=sys.stderr)
                    shutil.rmtree(cache, ignore_errors=True)
                    os.makedirs(cache)
                finally:
                    if daemon:
                        daemon.stop()
            shutil.rmtree(cache, ignore_errors=True)
            for k in ("epoch1", "epoch2"):
                times[tool][k].append(got[k] if got else None)
            if got:
                print(f"  round {r + 1} {tool}: epoch 1 {got['epoch1']:.2f} s, epoch 2 "
                      f"{got['epoch2']:.2f} s", file=sys.stderr)
    return times


def ratio_rows(case, times, key, n, unit_per_s):
    """Rows of each way of running sluice against each anchor: medians and the median of
    the per-round ratios."""
    rows = []
    for mine in (t for t in times if t.startswith("sluice")):
        ours = times[mine][key]
        for tool, t in times.items():
            if tool.startswith("sluice"):
                continue
            # rounds where both ran (a run failed 3 times has None)
            pairs = [(a, b) for a, b in zip(t[key], ours) if a is not None and b is not None]
            if not pairs:
                rows.append([case, mine, tool, "-", "-", "no round ran both"])
                continue
            rs = [a / b for a, b in pairs]
            rows.append([case, mine, tool,
                         f"{n / statistics.median(b for _, b in pairs):,.0f} {unit_per_s}",
                         f"{n / statistics.median(a for a, _ in pairs):,.0f} {unit_per_s}",
                         f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f}, "
                         f"{len(rs)} rounds)"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="epoch,small,read")
    ap.add_argument("--tools", default="sluice,sluice-list,mosaic,litdata,webdataset",
                    help="epoch and small: the dataset tools (sluice: default collation, "
                    "batches in shared memory; sluice-list: the anchors' list collation)")
    ap.add_argument("--samples", type=int, default=10000, help="epoch: samples of 100 KiB")
    ap.add_argument("--small-samples", type=int, default=200000, help="small: samples of 1 KiB")
    ap.add_argument("--object", default="1G", help="read: the object's size")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    import s3_harness
    if not s3_harness.find_s3rver():
        sys.exit("SKIP: s3rver is not installed (scripts/install-test-tools.sh)")
    if not os.path.exists(os.path.join(BUILD, "bin", "sluiced")):
        sys.exit(f"py_data_compare: no sluiced in {BUILD}/bin: build first")
    cases = a.cases.split(",")
    work = tempfile.mkdtemp(prefix="sluice-pydata-", dir=a.dir)
    server = s3_harness.S3rver(buckets=(BUCKET,))
    env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
               AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1",
               S3_ENDPOINT_URL=server.endpoint, SLUICE_HOME=os.path.join(work, "home"),
               BENCH_HOME=os.path.join(work, "home"), PYTHONPATH=os.path.join(BUILD, "python"))
    os.environ.update(env)  # the writers run here
    rows = []
    try:
        try:
            import boto3
        except ImportError:
            sys.exit("SKIP: boto3 is not installed (scripts/install-python.sh --bench)")
        s3 = boto3.client("s3", endpoint_url=server.endpoint)
        tools = available(a.tools.split(","))
        if "sluice" not in tools:
            sys.exit("py_data_compare: sluice is not importable (build with SLUICE_PYTHON)")
        if "epoch" in cases:
            print(f"epoch: {a.samples} samples of 100 KiB", file=sys.stderr)
            shards = write_formats(tools, work, s3, server.endpoint, env, a.samples, 100 << 10,
                                   "100k")
            t = epochs(tools, work, server.endpoint, env, a.samples, a.workers, a.rounds,
                       shards, "100k")
            rows += ratio_rows("epoch 1 (cold, from S3)", {k: {"e": v["epoch1"]} for k, v in t.items()},
                               "e", a.samples, "samples/s")
            rows += ratio_rows("epoch 2 (warm)", {k: {"e": v["epoch2"]} for k, v in t.items()},
                               "e", a.samples, "samples/s")
        if "small" in cases:
            print(f"small: {a.small_samples} samples of 1 KiB", file=sys.stderr)
            shards = write_formats(tools, work, s3, server.endpoint, env, a.small_samples, 1024,
                                   "1k")
            t = epochs(tools, work, server.endpoint, env, a.small_samples, a.workers, a.rounds,
                       shards, "1k")
            rows += ratio_rows("1 KiB samples, warm", {k: {"e": v["epoch2"]} for k, v in t.items()},
                               "e", a.small_samples, "samples/s")
        if "read" in cases:
            size = parse_size(a.object)
            print(f"read: one object of {size >> 20} MiB", file=sys.stderr)
            path = os.path.join(work, "object.bin")
            with open(path, "wb") as f:
                for _ in range(size // len(_BLOCK)):
                    f.write(_BLOCK)
                f.write(_BLOCK[:size % len(_BLOCK)])
            s3.upload_file(path, BUCKET, "object.bin")
            os.unlink(path)
            readers = available(["sluice", "s3torchconnector", "boto3"])
            times = {t: [] for t in readers}
            for r in range(a.rounds):
                check = set()
                for tool in readers if r % 2 == 0 else list(reversed(readers)):
                    got = run_child(READ_CHILD, [tool, "object.bin", size, server.endpoint], env)
                    times[tool].append(got["seconds"])
                    check.add(got["check"])
                    print(f"  round {r + 1} {tool}: {size / got['seconds'] / (1 << 30):.2f} GiB/s",
                          file=sys.stderr)
                if len(check) != 1:
                    sys.exit("py_data_compare: the readers disagree on the object's bytes")
            gib = size / (1 << 30)
            for tool in readers[1:]:
                rs = [x / y for x, y in zip(times[tool], times["sluice"])]
                rows.append([f"read_into {a.object} from S3", "sluice", tool,
                             f"{gib / statistics.median(times['sluice']):.2f} GiB/s",
                             f"{gib / statistics.median(times[tool]):.2f} GiB/s",
                             f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"])
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print_table(["case", "sluice", "anchor", "sluice's", "anchor's", "ratio (min-max)"], rows,
                a.markdown)
    print(f"ratio: sluice's speed / the anchor's, per round (>1: sluice faster); {a.rounds} "
          f"rounds, {a.workers} DataLoader workers, batch {BATCH}; {versions()}")
    if failures:
        print("runs that failed and were run again: " +
              ", ".join(f"{t} {n}" for t, n in sorted(failures.items())))


if __name__ == "__main__":
    main()
