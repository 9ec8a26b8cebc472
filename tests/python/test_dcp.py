"""torch.distributed.checkpoint through sluice: save, async_save and load round trips, in one
process and with 4 gloo ranks; the CLI sees the steps."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import binary
from s3_harness import free_port
from sluice.dcp import Reader, Writer


def state():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"step": 5}}


def zeroed(s):
    return {"model": {k: torch.zeros_like(v) for k, v in s["model"].items()},
            "optim": s["optim"], "extra": {"step": 0}}


def test_save_and_load_in_one_process(tmp_path):
    tiers = [str(tmp_path / "near"), str(tmp_path / "far")]
    s = state()
    dcp.save(s, storage_writer=Writer("dcp1", step=3, tiers=tiers))
    target = zeroed(s)
    dcp.load(target, storage_reader=Reader("dcp1", tiers=tiers))
    for k, v in s["model"].items():
        assert torch.equal(v, target["model"][k])
    assert target["extra"]["step"] == 5
    # The CLI lists and verifies the step.
    v = subprocess.run([binary("sluice"), "ckpt", "verify", "--series", "dcp1", "--step", "3",
                        "--from", tiers[0], "--no-progress"], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_async_save_and_a_damaged_near_copy(tmp_path):
    tiers = [str(tmp_path / "near"), str(tmp_path / "far")]
    s = state()
    fut = dcp.async_save(s, storage_writer=Writer("dcp2", step=1, tiers=tiers))
    fut.result()
    # Damage every shard on the near tier: the load reads the far copy, checked.
    damaged = 0
    for root, _, files in os.walk(tiers[0]):
        for f in files:
            if f.endswith(".shard"):
                p = os.path.join(root, f)
                size = os.path.getsize(p)
                with open(p, "r+b") as fh:
                    fh.write(b"\xff" * size)
                damaged += 1
    assert damaged == 1
    target = zeroed(s)
    dcp.load(target, storage_reader=Reader("dcp2", step=1, tiers=tiers))
    for k, v in s["model"].items():
        assert torch.equal(v, target["model"][k])


def test_a_step_not_saved_through_dcp_is_refused(tmp_path):
    import sluice.checkpoint
    with sluice.checkpoint.Checkpointer("plain", tiers=[str(tmp_path / "t")]) as ck:
        ck.save(1, {"w": torch.zeros(3)})
    with pytest.raises(BaseException) as e:  # DCP's CheckpointException is a BaseException
        dcp.load({"w": torch.zeros(3)}, storage_reader=Reader("plain", tiers=[str(tmp_path / "t")]))
    # DCP wraps the reader's error in its CheckpointException, per rank.
    text = str(e.value) + repr(getattr(e.value, "failures", ""))
    assert "not saved through torch.distributed.checkpoint" in text


RANK_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from sluice.dcp import Writer, Reader
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tier = sys.argv[1]
    torch.manual_seed(rank)
    mine = {"w%d" % rank: torch.randn(1000 + rank), "shared": torch.arange(10.0)}
    dcp.save(mine, storage_writer=Writer("gloo", step=7, tiers=[tier]))
    fut = dcp.async_save({"w%d" % rank: mine["w%d" % rank] * 2, "shared": torch.arange(10.0)},
                         storage_writer=Writer("gloo", step=8, tiers=[tier]))
    fut.result()
    for step, factor in ((7, 1), (8, 2)):
        back = {"w%d" % rank: torch.zeros(1000 + rank), "shared": torch.zeros(10)}
        dcp.load(back, storage_reader=Reader("gloo", step=step, tiers=[tier]))
        assert torch.equal(back["w%d" % rank], mine["w%d" % rank] * factor), (rank, step)
        assert torch.equal(back["shared"], torch.arange(10.0))
    dist.barrier()
    dist.destroy_process_group()
    print("ok", rank, flush=True)
""")


def test_four_gloo_ranks_save_async_save_and_load(tmp_path):
    tier = str(tmp_path / "tier")
    port = free_port()
    procs = []
    for rank in range(4):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="4", LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, tier], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank}:\n{out}"
        assert f"ok {rank}" in out
    ls = subprocess.run([binary("sluice"), "ckpt", "ls", "--series", "gloo", "--from", tier],
                        capture_output=True, text=True)
    assert ls.returncode == 0 and "7" in ls.stdout and "8" in ls.stdout, ls.stdout + ls.stderr
