"""sluice.checkpoint: a model and optimizer saved and restored bit-exact, from Python and the
CLI; async save with changing tensors; kill -9 during async_save; bad input."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import sluice
import sluice.checkpoint
from conftest import binary

torch.manual_seed(0)


def model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                        b.view(-1).view(torch.uint8) if b.numel() else b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b and type(a) is type(b)


def test_model_and_optimizer_round_trip_bit_exact(tmp_path):
    model, opt = model_and_optimizer()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 7,
             "rng": torch.get_rng_state(), "note": "hello", "lr": 1e-3, "none": None,
             "np": np.arange(10, dtype=np.float64), "bf16": torch.randn(5, 3).bfloat16(),
             "empty": torch.empty(0), "pair": (1, "two")}
    tiers = [str(tmp_path / "nvme"), str(tmp_path / "far")]
    with sluice.checkpoint.Checkpointer("run", tiers=tiers) as ck:
        ck.save(7, state)
        assert [s["step"] for s in ck.steps()] == [7]
        assert ck.latest() == 7
        assert ck.verify(7)["bad_chunks"] == 0
        fresh = ck.load()
    assert same(state, fresh)
    # Into a new model and optimizer, in place.
    model2, opt2 = model_and_optimizer()
    with sluice.checkpoint.Checkpointer("run", tiers=tiers) as ck:
        target = {"model": model2.state_dict(), "optim": opt2.state_dict()}
        ptrs = [t.data_ptr() for t in target["model"].values()]
        loaded = ck.load(7, into=dict(target, step=None))
    assert [t.data_ptr() for t in target["model"].values()] == ptrs
    assert same(model.state_dict(), model2.state_dict())
    assert loaded["step"] == 7
    opt2.load_state_dict(loaded["optim"])
    assert same(opt.state_dict(), opt2.state_dict())


def test_the_cli_lists_verifies_and_restores_a_python_save(tmp_path):
    t = torch.arange(1 << 20, dtype=torch.float32)
    with sluice.checkpoint.Checkpointer("cli", tiers=[str(tmp_path / "t")]) as ck:
        ck.save(3, {"w": t})
    env = dict(os.environ)
    ls = subprocess.run([binary("sluice"), "ckpt", "ls", "--series", "cli", "--from",
                         str(tmp_path / "t")], capture_output=True, text=True, env=env)
    assert ls.returncode == 0 and "3" in ls.stdout, ls.stderr
    v = subprocess.run([binary("sluice"), "ckpt", "verify", "--series", "cli", "--step", "3",
                        "--from", str(tmp_path / "t"), "--no-progress"], capture_output=True,
                       text=True, env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    out = tmp_path / "restored"
    r = subprocess.run([binary("sluice"), "ckpt", "restore", "--series", "cli", "--step", "3",
                        "--from", str(tmp_path / "t"), "--to", str(out), "--no-progress"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    files = {p.name: p for p in out.rglob("*") if p.is_file()}
    assert "w" in files, files
    assert files["w"].read_bytes() == t.numpy().tobytes()


def test_async_save_keeps_the_values_at_save_time(tmp_path):
    w = torch.zeros(4 << 20)  # 16 MiB
    with sluice.checkpoint.Checkpointer("async", tiers=[str(tmp_path / "t")],
                                        staging="64M") as ck:
        h = ck.async_save(1, {"w": w})
        assert h.staged.result(timeout=60) == 1
        w.fill_(5.0)  # training goes on
        h.wait(timeout=120)
        assert h.progress()["finished"]
        back = ck.load(1)
    assert torch.count_nonzero(back["w"]) == 0


def test_kill_during_async_save_leaves_latest_intact(tmp_path):
    tier = str(tmp_path / "t")
    script = textwrap.dedent(f"""
        import os, sys, torch, sluice.checkpoint
        ck = sluice.checkpoint.Checkpointer("k", tiers=[{tier!r}], staging="32M")
        ck.save(1, {{"w": torch.full((1 << 20,), 1.0)}})
        h = ck.async_save(2, {{"w": torch.full((64 << 20,), 2.0)}})  # 256 MiB
        h.staged.result()
        print("staged", flush=True)
        h.wait()
        print("done", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    line = p.stdout.readline()
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert line.strip() in ("staged", ""), line
    with sluice.checkpoint.Checkpointer("k", tiers=[tier]) as ck:
        latest = ck.latest()
        back = ck.load()
        assert latest in (1, 2)
        want = 1.0 if latest == 1 else 2.0
        assert torch.all(back["w"] == want)
        assert ck.verify(latest)["bad_chunks"] == 0


def test_bad_input_raises_and_writes_nothing(tmp_path):
    tier = tmp_path / "t"
    with sluice.checkpoint.Checkpointer("bad", tiers=[str(tier)]) as ck:
        with pytest.raises(sluice.InvalidArgument, match="object"):
            ck.save(1, {"x": object()})
        with pytest.raises(sluice.InvalidArgument, match="key of type"):
            ck.save(1, {(1, 2): torch.zeros(1)})
        assert ck.steps() == []
        ck.save(2, {"w": torch.zeros(4, 4), "v": np.zeros(3, dtype=np.int32)})
        with pytest.raises(sluice.InvalidArgument, match="saved as float32"):
            ck.load(2, into={"w": torch.zeros(4, 4, dtype=torch.float64)})
        with pytest.raises(sluice.InvalidArgument, match="float32\\[4, 4\\]"):
            ck.load(2, into={"w": torch.zeros(4, 5)})
        keep = torch.full((4, 4), 9.0)
        with pytest.raises(sluice.InvalidArgument):  # the second leaf is wrong: nothing read
            ck.load(2, into={"w": keep, "v": np.zeros(4, dtype=np.int32)})
        assert torch.all(keep == 9.0)
        with pytest.raises(sluice.InvalidArgument, match="not contiguous"):
            ck.load(2, into={"w": torch.zeros(4, 4).t()})
        # A mismatch found late changes nothing of `into`, plain values included.
        ck.save(3, {"a": 1, "w": torch.zeros(4, 4)})
        target = {"a": 99, "w": torch.zeros(5)}
        with pytest.raises(sluice.InvalidArgument):
            ck.load(3, into=target)
        assert target["a"] == 99
        with pytest.raises(sluice.NotFound):
            ck.load(99)
        with pytest.raises(sluice.InvalidArgument):
            ck.load("newest")
        with pytest.raises(sluice.AlreadyExists):
            ck.save(2, {"w": torch.zeros(1)})
    with pytest.raises(sluice.InvalidArgument, match="closed"):
        ck.latest()
