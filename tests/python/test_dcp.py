"""torch.distributed.checkpoint through sluice: save, async_save and load round trips, in one
process and with 4 gloo ranks; the CLI sees the steps."""

import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

import sluice
import sluice.checkpoint
from conftest import binary
from s3_harness import free_port
from sluice.dcp import METADATA, Reader, Writer


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
    assert "not saved through torch.distributed.checkpoint" in failure_text(e)


def failure_text(e):
    """DCP wraps a reader's error in its CheckpointException, per rank."""
    return str(e.value) + repr(getattr(e.value, "failures", ""))


class RunsACommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_crafted_metadata_runs_no_code_and_is_corruption(tmp_path):
    tier = str(tmp_path / "t")
    marker = tmp_path / "ran"
    s = state()
    dcp.save(s, storage_writer=Writer("shared", step=1, tiers=[tier]))
    # Someone who can write to the tier commits a newer step whose metadata is a pickle that
    # runs a command when loaded, or sets attributes on DCP's classes (BUILD on a class).
    crafted = {
        2: pickle.dumps(RunsACommand(f"touch {marker}")),
        3: pickle.dumps({"x": RunsACommand(f"touch {marker}")}),
        4: (b"ctorch.distributed.checkpoint.metadata\nMetadata\n"
            b"N}(V__eq__\nI1\nVplanted\nI1\nu\x86b."),
        5: b"ctorch\nload\n.",
        6: pickle.dumps({"not": "metadata"}),
        # BUILD on an enum member every process shares (the hostile test's): it would have
        # made this process's later saves unloadable.
        7: (b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n(I0\ntR}"
            b"(V_value_\nI7\nub."),
        # A Metadata whose fields are not what DCP reads.
        8: b"ctorch.distributed.checkpoint.metadata\nMetadata\n(I5\nN}tR.",
    }
    enc = torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING
    values = {m: m.value for m in enc}
    eq = Metadata.__eq__
    with sluice.checkpoint.Checkpointer("shared", tiers=[tier]) as ck:
        for step, doc in crafted.items():
            ck._cp.save(step, [(METADATA, "uint8", [len(doc)], doc)]).wait()
    for step in crafted:
        with pytest.raises(sluice.Corruption, match=f"step {step} of series shared on {tier}"):
            Reader("shared", step=step, tiers=[tier]).read_metadata()
    assert not marker.exists()
    assert Metadata.__eq__ is eq and not hasattr(Metadata, "planted")
    assert {m: m.value for m in enc} == values
    # dcp.load of the newest step (the crafted one) fails with the reason, and runs nothing.
    with pytest.raises(BaseException) as e:
        dcp.load(zeroed(s), storage_reader=Reader("shared", tiers=[tier]))
    assert "step 8 of series shared" in failure_text(e)
    assert "refused its DCP metadata" in failure_text(e)
    assert not marker.exists()
    # The genuine step still loads.
    target = zeroed(s)
    dcp.load(target, storage_reader=Reader("shared", step=1, tiers=[tier]))
    for k, v in s["model"].items():
        assert torch.equal(v, target["model"][k])


def test_a_crafted_saved_value_runs_no_code_and_is_corruption(tmp_path):
    # DCP's planner torch.loads the values it saved as bytes (BYTE_IO) with
    # weights_only=False: a step with genuine metadata and one crafted value must not run it.
    tier = str(tmp_path / "t")
    marker = tmp_path / "ran"
    s = state()
    dcp.save(s, storage_writer=Writer("values", step=1, tiers=[tier]))
    evil = io.BytesIO()
    torch.save(RunsACommand(f"touch {marker}"), evil)
    with sluice.checkpoint.Checkpointer("values", tiers=[tier]) as ck:
        entries = [(e, bytearray(e["bytes"])) for e in ck._cp.manifest(1)]
        ck._cp.restore(1, [(e["name"], e["rank"], b) for e, b in entries])
        crafted = []
        for e, b in entries:
            if e["name"].startswith("extra.step|"):
                b = bytearray(evil.getvalue())
            crafted.append((e["name"], e["dtype"], [len(b)] if e["dtype"] == "uint8" else
                            e["shape"], b))
        assert any(n.startswith("extra.step|") for n, *_ in crafted)
        ck._cp.save(2, crafted).wait()
    with pytest.raises(BaseException) as e:
        dcp.load(zeroed(s), storage_reader=Reader("values", tiers=[tier]))
    assert not marker.exists()
    assert f"extra.step: step 2 of series values on {tier}: refused the saved value" in \
        failure_text(e)
    target = zeroed(s)  # the step as saved loads, its values through the same path
    dcp.load(target, storage_reader=Reader("values", step=1, tiers=[tier]))
    assert target["extra"]["step"] == 5
    assert target["optim"]["param_groups"] == s["optim"]["param_groups"]


def test_load_into_another_dtype_is_refused(tmp_path):
    tiers = [str(tmp_path / "t")]
    dcp.save({"w": torch.arange(6.0)}, storage_writer=Writer("cast", step=1, tiers=tiers))
    target = {"w": torch.full((6,), 7.0, dtype=torch.float64)}
    with pytest.raises(BaseException) as e:
        dcp.load(target, storage_reader=Reader("cast", tiers=tiers))
    assert "w: saved as float32, the tensor to fill is float64" in failure_text(e)
    assert torch.all(target["w"] == 7.0)


def test_conjugate_and_negative_views_save_their_values(tmp_path):
    tiers = [str(tmp_path / "t")]
    t = torch.randn(4, dtype=torch.complex64)
    x = torch.randn(5)
    dcp.save({"c": t.conj(), "n": torch._neg_view(x)},
             storage_writer=Writer("views", step=1, tiers=tiers))
    back = {"c": torch.zeros(4, dtype=torch.complex64), "n": torch.zeros(5)}
    dcp.load(back, storage_reader=Reader("views", tiers=tiers))
    assert torch.equal(back["c"], t.conj()) and torch.equal(back["n"], -x)


def test_numbers_out_of_range_are_invalid_argument_at_the_call(tmp_path):
    tiers = [str(tmp_path / "t")]
    for make in (Writer, Reader):
        for kwargs, name in [({"step": -1}, "step"), ({"step": 2**64}, "step"),
                             ({"step": 1, "keep_last": -1}, "keep_last"),
                             ({"step": 1, "staging": 2**64}, "staging"),
                             ({"step": 1, "rank": -1}, "rank")]:
            with pytest.raises(sluice.InvalidArgument, match=f"^{name}: "):
                make("nums", tiers=tiers, **kwargs)
        with pytest.raises(sluice.InvalidArgument, match="^checkpoint_id: "):
            make("nums", tiers=tiers).reset(checkpoint_id="9" * 30)
        with pytest.raises(sluice.InvalidArgument, match="checkpoint_id '-1'"):
            make("nums", tiers=tiers).reset(checkpoint_id=-1)


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
