#!/usr/bin/env python3
"""A small training job on sluice: streams a WebDataset-style dataset with DataLoader
workers, checkpoints model, optimizer and loader state asynchronously every few steps, and
resumes from the newest intact checkpoint when started again, after a crash too.

    python examples/pytorch/train.py --data /data/shards --ckpt /nvme/ckpt --epochs 1

Each sample is a "cls" (a class number) and a "txt"; the model learns the class from a few
features of the text. --log appends "step key" for every sample trained on, so a test can
check that, counting only the steps a checkpoint kept, every sample was trained on exactly
once (tests/python/test_example.py kills it with SIGKILL mid-run and checks that).
"""

import argparse
import os
import signal
import sys

import torch

import sluice
import sluice.checkpoint
import sluice.data


def features(batch):
    txt = batch["txt"]
    x = torch.tensor([[len(t) / 100.0, t.count(b"1") / 10.0, t.count(b"5") / 10.0, 1.0]
                      for t in txt])
    y = torch.tensor([int(c) for c in batch["cls"]])
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the dataset (a directory, s3://bucket/prefix/)")
    ap.add_argument("--ckpt", required=True, help="checkpoint tier (a directory, s3://...)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=3, help="steps between checkpoints")
    ap.add_argument("--log", help="append 'step key' per sample trained on")
    ap.add_argument("--crash-after", type=int, default=0,
                    help="kill this process (SIGKILL) right after starting the save of this step")
    a = ap.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = sluice.data.StreamingDataset(a.data, shuffle=True, seed=1234)
    loader = sluice.data.DataLoader(dataset, batch_size=a.batch_size, num_workers=a.workers)
    ckpt = sluice.checkpoint.Checkpointer("train-example", tiers=[a.ckpt], keep_last=3)

    step = 0
    if ckpt.steps():
        state = ckpt.load("latest", into={"model": model.state_dict(), "optim": opt.state_dict()})
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step} (epoch {state['loader']['epoch']}, "
              f"position {state['loader']['position']})", flush=True)
    log = open(a.log, "a") if a.log else None

    pending, loss = None, None
    while dataset.epoch < a.epochs:
        for batch in loader:
            x, y = features(batch)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if log:
                log.write("".join(f"{step} {k}\n" for k in batch["__key__"]))
                log.flush()
                os.fsync(log.fileno())
            if step % a.save_every == 0:
                if pending is not None:
                    pending.wait()  # one save in flight at a time
                pending = ckpt.async_save(step, {"model": model.state_dict(),
                                                 "optim": opt.state_dict(),
                                                 "loader": loader.state_dict(), "step": step})
                pending.staged.result()  # the model may change from here on
                if step == a.crash_after:
                    os.kill(os.getpid(), signal.SIGKILL)
        done = f", loss {loss.item():.3f}" if loss is not None else ""
        print(f"epoch {dataset.epoch - 1} done at step {step}{done}", flush=True)
    if pending is not None:
        pending.wait()
    if step % a.save_every:  # the last steps, saved too
        ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                         "loader": loader.state_dict(), "step": step})
    ckpt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
