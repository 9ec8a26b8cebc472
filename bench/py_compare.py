#!/usr/bin/env python3
"""The Python package against what PyTorch users pick today, on the same data, interleaved,
several rounds; prints the median of the per-round ratios. Run with the project's .venv
(scripts/install-python.sh) after a build:

    .venv/bin/python bench/py_compare.py                      # every case, 5 rounds
    .venv/bin/python bench/py_compare.py --cases save,restore --state 2G --rounds 5
    .venv/bin/python bench/py_compare.py --markdown           # a table for docs/performance.md

Each measurement runs in a fresh process (no warm allocator or page of the other side's).
Cases:
  save      Checkpointer.save until committed (durable)  vs  torch.save + fsync;
                                                              dcp.save (FileSystemWriter, fsync)
  stall     async_save until `staged`                    vs  dcp.async_save returning (its staging)
  restore   Checkpointer.load(into=) from a cold cache   vs  torch.load; dcp.load (pages dropped)
  epoch     StreamingDataset + DataLoader, warm           vs  webdataset's pipeline, same shards,
            (100 KiB samples, --workers, default 4)            same DataLoader
Rounds alternate which side goes first. Anchors not installed are skipped, with the reason.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from benchlib import parse_size, print_table  # noqa: E402

CHILD = r"""
import json, os, sys, time
import torch
mode, work, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
ntensors = 64
per = nbytes // ntensors // 4

def state():
    return {f"layer.{i}.weight": torch.full((per,), float(i)) for i in range(ntensors)}

def drop(paths):
    for root in paths:
        for d, _, files in os.walk(root):
            for f in files:
                fd = os.open(os.path.join(d, f), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)

out = {}
if mode == "sluice-save":
    import sluice, sluice.checkpoint
    __import__("shutil").rmtree(os.path.join(work, "sluice"), ignore_errors=True)
    sd = state()
    ck = sluice.checkpoint.Checkpointer("bench", tiers=[os.path.join(work, "sluice")],
                                        staging="1G", session=sluice.connect(daemon="none"))
    t0 = time.monotonic(); ck.save(1, sd); out["seconds"] = time.monotonic() - t0
    ck.close()
elif mode == "sluice-stall":
    import sluice, sluice.checkpoint
    __import__("shutil").rmtree(os.path.join(work, "sluice-stall"), ignore_errors=True)
    sd = state()
    ck = sluice.checkpoint.Checkpointer("stall", tiers=[os.path.join(work, "sluice-stall")],
                                        staging="1G", session=sluice.connect(daemon="none"))
    t0 = time.monotonic(); h = ck.async_save(1, sd); h.staged.result()
    out["seconds"] = time.monotonic() - t0
    h.wait(); ck.close()
elif mode == "sluice-restore":
    import sluice, sluice.checkpoint
    drop([os.path.join(work, "sluice")])
    into = {f"layer.{i}.weight": torch.empty(per) for i in range(ntensors)}
    ck = sluice.checkpoint.Checkpointer("bench", tiers=[os.path.join(work, "sluice")],
                                        session=sluice.connect(daemon="none"))
    t0 = time.monotonic(); ck.load(1, into=into); out["seconds"] = time.monotonic() - t0
    assert float(into["layer.3.weight"][0]) == 3.0
    ck.close()
elif mode == "torch-save":
    sd = state()
    path = os.path.join(work, "torch.pt")
    t0 = time.monotonic()
    with open(path, "wb") as f:
        torch.save(sd, f); f.flush(); os.fsync(f.fileno())
    out["seconds"] = time.monotonic() - t0
elif mode == "torch-restore":
    path = os.path.join(work, "torch.pt")
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    t0 = time.monotonic(); sd = torch.load(path); out["seconds"] = time.monotonic() - t0
elif mode == "dcp-save":
    import torch.distributed.checkpoint as dcp
    sd = state()
    path = os.path.join(work, "dcp")
    __import__("shutil").rmtree(path, ignore_errors=True)
    t0 = time.monotonic(); dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
    out["seconds"] = time.monotonic() - t0
elif mode == "dcp-stall":
    import torch.distributed.checkpoint as dcp
    sd = state()
    path = os.path.join(work, "dcp-stall")
    __import__("shutil").rmtree(path, ignore_errors=True)
    t0 = time.monotonic(); fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(path))
    out["seconds"] = time.monotonic() - t0
    fut.result()
elif mode == "dcp-restore":
    import torch.distributed.checkpoint as dcp
    path = os.path.join(work, "dcp")
    drop([path])
    into = {f"layer.{i}.weight": torch.empty(per) for i in range(ntensors)}
    t0 = time.monotonic(); dcp.load(into, storage_reader=dcp.FileSystemReader(path))
    out["seconds"] = time.monotonic() - t0
elif mode in ("sluice-epoch", "wds-epoch"):
    shards = os.path.join(work, "shards")
    workers = int(os.environ["BENCH_WORKERS"])
    n = 0
    t0 = time.monotonic()
    if mode == "sluice-epoch":
        import sluice, sluice.data
        ds = sluice.data.StreamingDataset(shards, seed=1, cache=False)
        loader = sluice.data.DataLoader(ds, batch_size=32, num_workers=workers)
    else:
        import glob, webdataset as wds
        urls = sorted(glob.glob(os.path.join(shards, "*.tar")))
        ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
                             empty_check=False).shuffle(1000)
        loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers,
                                             collate_fn=lambda b: b)
    for batch in loader:
        n += len(batch["__key__"]) if isinstance(batch, dict) else len(batch)
    out["seconds"] = time.monotonic() - t0
    out["samples"] = n
print(json.dumps(out))
"""


def child(python, mode, work, nbytes, workers=4):
    env = dict(os.environ, SLUICE_HOME=os.path.join(work, "home"), BENCH_WORKERS=str(workers))
    p = subprocess.run([python, "-c", CHILD, mode, work, str(nbytes)], capture_output=True,
                       text=True, timeout=1800, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_shards(root, samples, size):
    import webdataset as wds
    os.makedirs(root, exist_ok=True)
    payload = os.urandom(size)
    per = 200
    for s in range((samples + per - 1) // per):
        with wds.TarWriter(os.path.join(root, f"shard-{s:05d}.tar")) as sink:
            for i in range(s * per, min(samples, (s + 1) * per)):
                sink.write({"__key__": f"s{i:08d}", "bin": payload, "cls": str(i % 10).encode()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="save,stall,restore,epoch")
    ap.add_argument("--state", default="2G", help="checkpoint state size")
    ap.add_argument("--samples", type=int, default=20000, help="epoch: samples of 100 KiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4, help="epoch: DataLoader workers (0: none)")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    python = sys.executable
    nbytes = parse_size(a.state)
    work = tempfile.mkdtemp(prefix="sluice-pybench-", dir=a.dir)
    cases = a.cases.split(",")
    rows = []
    try:
        if "epoch" in cases:
            write_shards(os.path.join(work, "shards"), a.samples, 100 << 10)
        plan = []
        if "save" in cases:
            plan.append(("save", "sluice-save", ["torch-save", "dcp-save"], "higher"))
        if "stall" in cases:
            plan.append(("stall", "sluice-stall", ["dcp-stall"], "lower"))
        if "restore" in cases:
            if "save" not in cases:  # something to restore: one save of each
                for mode in ("sluice-save", "torch-save", "dcp-save"):
                    child(python, mode, work, nbytes)
            plan.append(("restore", "sluice-restore", ["torch-restore", "dcp-restore"], "higher"))
        if "epoch" in cases:
            plan.append(("epoch", "sluice-epoch", ["wds-epoch"], "higher"))
        for case, ours, anchors, better in plan:
            ratios = {x: [] for x in anchors}
            times = {x: [] for x in [ours] + anchors}
            for r in range(a.rounds):
                order = [ours] + anchors if r % 2 == 0 else anchors + [ours]
                got = {}
                for mode in order:
                    got[mode] = child(python, mode, work, nbytes, a.workers)["seconds"]
                    times[mode].append(got[mode])
                for x in anchors:
                    # speed ratio: the anchor's time over ours (>1: sluice faster); for the
                    # stall, ours over the anchor's (<1: sluice stalls less)
                    ratios[x].append(got[x] / got[ours] if better == "higher" else got[ours] / got[x])
            for x in anchors:
                rs = ratios[x]
                rows.append([case, x.split("-")[0], f"{statistics.median(times[ours]):.3f}",
                             f"{statistics.median(times[x]):.3f}",
                             f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    note = "ratio: anchor time / sluice time (>1 sluice faster); stall: sluice / anchor (<1 better)"
    print_table(["case", "anchor", "sluice s", "anchor s", "ratio (min-max)"], rows, a.markdown)
    print(note)


if __name__ == "__main__":
    main()
