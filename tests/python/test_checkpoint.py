"""sluice.checkpoint: a model and optimizer saved and restored bit-exact, from Python and the
CLI; async save with changing tensors; kill -9 during async_save; bad input."""

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

import sluice
import sluice.checkpoint
import sluiced_harness
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


def test_keep_last_never_prunes_a_step_the_ledger_pins(tmp_path):
    """Issue 48: `sluice gc pin` protects a step from every checkpointer's retention, Python's
    keep_last included (it used to prune it: the pin check was the CLI's alone)."""
    tier = tmp_path / "ckpt"
    tier.mkdir()

    def cli(*args):
        r = subprocess.run([binary("sluice"), *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    cli("team", "add", "ml")
    cli("project", "add", "ml-ckpt", "--team", "ml", "--location", str(tier), "--kind",
        "checkpoint")
    cli("gc", "pin", "ml-ckpt", "run/step-000000000002/")
    t = torch.arange(4096, dtype=torch.float32)
    with sluice.checkpoint.Checkpointer("run", tiers=[str(tier)], keep_last=1) as ck:
        for step in range(1, 5):
            ck.save(step, {"w": t + step})
    # Closed: every save's retention has run (it follows each commit).
    with sluice.checkpoint.Checkpointer("run", tiers=[str(tier)]) as ck:
        assert [s["step"] for s in ck.steps()] == [2, 4]
        assert same(ck.load(2)["w"], t + 2)


@pytest.fixture
def peer_job(tmp_path):
    """Two sluiced on loopback, n0 and n1, members of one job: a peers file, a node secret."""
    if not os.path.exists(binary("sluiced")):
        pytest.skip(f"no sluiced in {os.path.dirname(binary('sluiced'))}")
    from s3_harness import free_port

    ports = [free_port(), free_port()]
    peers = tmp_path / "peers"
    peers.write_text("".join(f"n{i} 127.0.0.1:{p}\n" for i, p in enumerate(ports)))
    secret = tmp_path / "secret"
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("peer-secret-0123456789abcdef\n")
    daemons = []
    for i, port in enumerate(ports):
        d = sluiced_harness.Sluiced(
            binary("sluiced"), str(tmp_path / f"n{i}.sock"), str(tmp_path / f"cache{i}"),
            ["--cache-ram", "0", "--peer-listen", f"127.0.0.1:{port}", "--peers", str(peers),
             "--node-name", f"n{i}", "--node-secret-file", str(secret),
             "--objects-dir", str(tmp_path / f"objects{i}")])
        daemons.append(d)
    yield {"peers": str(peers), "secret": str(secret), "dir": tmp_path}
    for d in daemons:
        d.stop()


def test_a_peer_tier_from_python(peer_job, monkeypatch):
    """Issue 48: Python opens peer:// and sluiced:// tiers (the peer settings live in the client
    layer, as keyword arguments or the launcher's environment), and a node that lost its local
    copy restores from the peer."""
    t = torch.arange(1 << 18, dtype=torch.float32)
    local = str(peer_job["dir"] / "local")
    auth = {"node_name": "n0", "node_secret_file": peer_job["secret"], "peers": peer_job["peers"]}
    with sluice.checkpoint.Checkpointer("m", tiers=[local, "peer://ckpt/"], **auth) as ck:
        ck.save(1, {"w": t})
    assert (peer_job["dir"] / "objects1").exists()  # n1 keeps n0's copy
    # This node's copy is lost; the settings come from the environment a launcher sets.
    monkeypatch.setenv("SLUICE_NODE_NAME", "n0")
    monkeypatch.setenv("SLUICE_NODE_SECRET_FILE", peer_job["secret"])
    monkeypatch.setenv("SLUICE_PEERS", peer_job["peers"])
    with sluice.checkpoint.Checkpointer("m", tiers=["peer://ckpt/"]) as ck:
        assert same(ck.load(1)["w"], t)
    monkeypatch.delenv("SLUICE_NODE_SECRET_FILE")
    with pytest.raises(sluice.InvalidArgument, match="node_secret_file"):
        sluice.checkpoint.Checkpointer("m", tiers=["peer://ckpt/"])
    with pytest.raises(sluice.InvalidArgument, match="peer_port"):
        sluice.checkpoint.Checkpointer("m", tiers=["peer://ckpt/"], peer_port=70000)


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


def test_conjugate_and_negative_views_save_their_values_and_fill_as_targets(tmp_path):
    t = torch.randn(4, dtype=torch.complex64)
    x = torch.randn(5)
    with sluice.checkpoint.Checkpointer("views", tiers=[str(tmp_path / "t")]) as ck:
        # Saved as the values they show, not as the memory under them.
        ck.save(1, {"c": t.conj(), "n": torch._neg_view(x)})
        back = ck.load(1)
        assert torch.equal(back["c"], t.conj().resolve_conj()) and not back["c"].is_conj()
        assert torch.equal(back["n"], -x) and not back["n"].is_neg()
        # Filled as targets: the view shows the saved values afterwards.
        ck.save(2, {"c": t, "n": x})
        tc = torch.zeros(4, dtype=torch.complex64).conj()
        tn = torch._neg_view(torch.zeros(5))
        ck.load(2, into={"c": tc, "n": tn})
        assert torch.equal(tc, t) and tc.is_conj()
        assert torch.equal(tn, x) and tn.is_neg()


def test_numpy_structured_dtypes_load_and_object_dtypes_are_refused(tmp_path):
    dtypes = {
        "plain": np.dtype([("a", "<i4"), ("b", "<f8")]),
        "aligned": np.dtype([("a", "u1"), ("b", ">f8", (2,))], align=True),
        "nested": np.dtype([("p", [("x", "<i2"), ("y", "<f4")]), ("s", "S3")]),
        "offsets": np.dtype({"names": ["a", "b"], "formats": ["<i2", "<f4"],
                             "offsets": [0, 8], "itemsize": 16}),
        "datetime": np.dtype("datetime64[ns]"),
    }
    rng = np.random.default_rng(0)
    state = {k: np.frombuffer(rng.bytes(3 * d.itemsize), dtype=d).copy()
             for k, d in dtypes.items()}
    tier = str(tmp_path / "t")
    with sluice.checkpoint.Checkpointer("np", tiers=[tier]) as ck:
        ck.save(1, state)
        back = ck.load(1)
        for k, a in state.items():
            assert back[k].dtype == a.dtype and back[k].tobytes() == a.tobytes(), k
        into = {k: np.zeros(3, dtype=d) for k, d in dtypes.items()}
        ck.load(1, into=into)
        assert all(into[k].tobytes() == state[k].tobytes() for k in state)
        # Dtypes whose values are Python objects, or that would not load as themselves,
        # are refused at save time, naming the key; nothing is committed.
        bad = {"objects": np.array([1, "a"], dtype=object),
               "field_of_objects": np.zeros(2, dtype=[("a", "<i4"), ("o", "O")]),
               "titled": np.zeros(2, dtype=[(("a title", "a"), "<i4")])}
        for key, a in bad.items():
            with pytest.raises(sluice.InvalidArgument, match=f"arrays/{key}: .*cannot be saved"):
                ck.save(2, {"arrays": {key: a}})
        assert [s["step"] for s in ck.steps()] == [1]


def test_numbers_out_of_range_are_invalid_argument_at_the_call(tmp_path):
    tier = str(tmp_path / "t")
    Ck = sluice.checkpoint.Checkpointer
    for kwargs, name in [({"keep_last": -1}, "keep_last"), ({"keep_last": 2**32}, "keep_last"),
                         ({"staging": 2**64}, "staging"), ({"staging": 0}, "staging"),
                         ({"staging": "0"}, "staging"), ({"staging": True}, "staging"),
                         ({"rank": -1}, "rank"), ({"world_size": 0}, "world_size"),
                         ({"rank": 2, "world_size": 2, "run_id": "r"}, "rank"),
                         ({"world_size": 2**32, "run_id": "r"}, "world_size")]:
        with pytest.raises(sluice.InvalidArgument, match=f"^{name}: "):
            Ck("nums", tiers=[tier], **kwargs)
    with Ck("nums", tiers=[tier], staging="8M") as ck:
        for step in (-1, 2**64, 1.0, True):
            with pytest.raises(sluice.InvalidArgument, match="^step: "):
                ck.save(step, {"w": torch.zeros(1)})
            with pytest.raises(sluice.InvalidArgument, match="^step: "):
                ck.async_save(step, {"w": torch.zeros(1)})  # at the call, not in the future
            with pytest.raises(sluice.InvalidArgument, match="^step: "):
                ck.load(step)
            with pytest.raises(sluice.InvalidArgument, match="^step: "):
                ck.verify(step)
        assert ck.steps() == []


def test_sparse_tensors_are_refused_naming_the_key_and_the_cause(tmp_path):
    with sluice.checkpoint.Checkpointer("sparse", tiers=[str(tmp_path / "t")]) as ck:
        dense = torch.eye(3)
        for sparse in (dense.to_sparse(), dense.to_sparse_csr()):
            with pytest.raises(sluice.InvalidArgument, match="emb/w: .*layout.*to_dense"):
                ck.save(1, {"emb": {"w": sparse}})
        assert ck.steps() == []
        ck.save(2, {"w": dense})
        with pytest.raises(sluice.InvalidArgument, match="w: .*layout"):
            ck.load(2, into={"w": dense.to_sparse()})


def test_a_state_nested_too_deep_is_refused_with_the_limit(tmp_path):
    with sluice.checkpoint.Checkpointer("deep", tiers=[str(tmp_path / "t")]) as ck:
        deep: dict = {"w": torch.zeros(1)}
        for _ in range(5000):
            deep = {"d": deep}
        with pytest.raises(sluice.InvalidArgument, match="deeper than [0-9]+ levels"):
            ck.save(1, deep)
        loop: list = [torch.zeros(1)]
        loop.append(loop)
        with pytest.raises(sluice.InvalidArgument, match="contains itself"):
            ck.save(1, {"loop": loop})
        assert ck.steps() == []
        # As deep as the limit allows saves and loads.
        ok: Any = torch.arange(3)
        for _ in range(sluice.checkpoint.MAX_DEPTH):
            ok = [ok]
        ck.save(2, ok)
        back = ck.load(2)
        for _ in range(sluice.checkpoint.MAX_DEPTH):
            back = back[0]
        assert torch.equal(back, torch.arange(3))


def test_a_doctored_state_document_is_corruption(tmp_path):
    tier = str(tmp_path / "t")
    with sluice.checkpoint.Checkpointer("doc", tiers=[tier]) as ck:
        doc = b"[" * 100_000 + b"]" * 100_000  # JSON nested past any recursion limit
        ck._cp.save(1, [(sluice.checkpoint.STATE_NAME, "uint8", [len(doc)], doc)]).wait()
        with pytest.raises(sluice.Corruption, match=f"step 1 of series doc on {tier}"):
            ck.load(1)
