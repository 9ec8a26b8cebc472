"""sluice.data: WebDataset shards read exactly, exactly once across ranks and DataLoader
workers, exact resume (plain DataLoader counting, torchdata's StatefulDataLoader), elastic
resume."""

import collections
import io
import mmap
import multiprocessing
import os
import pickle
import shutil
import tarfile
import types

import pytest
import torch
import webdataset as wds

import conftest
import sluice
import sluice.data
from sluice import _core

SAMPLES = 157  # not a multiple of anything below


def write_shards(root, samples=SAMPLES, per_shard=20, name="sample", text="text of"):
    """WebDataset shards written by the webdataset library itself. Another `name` or `text`
    of the same length gives other keys or bytes in shards of the same sizes."""
    os.makedirs(root, exist_ok=True)
    expected = {}
    for shard in range((samples + per_shard - 1) // per_shard):
        with wds.TarWriter(os.path.join(root, f"shard-{shard:04d}.tar")) as sink:
            for i in range(shard * per_shard, min(samples, (shard + 1) * per_shard)):
                key = f"{name}{i:06d}"
                txt = f"{text} {i}".encode() * (1 + i % 7)
                cls = str(i % 10).encode()
                sink.write({"__key__": key, "txt": txt, "cls": cls})
                expected[key] = {"txt": txt, "cls": cls}
    return expected


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "shards"
    return str(root), write_shards(str(root))


def keys_of(batch):
    return list(batch["__key__"])


def run(loader, limit=None):
    """The keys of every batch, or of the first `limit` (taking no more than that)."""
    out = []
    it = iter(loader)
    while limit is None or limit > 0:
        try:
            batch = next(it)
        except StopIteration:
            break
        out.extend(keys_of(batch))
        limit = None if limit is None else limit - 1
    return out


def test_webdataset_shards_read_exactly(shards):
    root, expected = shards
    ds = sluice.data.StreamingDataset(root, shuffle=False)
    seen = {}
    for sample in ds:
        assert set(sample) == {"__key__", "__index__", "txt", "cls"}
        seen[sample["__key__"]] = {"txt": sample["txt"], "cls": sample["cls"]}
    assert seen == expected
    # Shuffled: the same samples in another order, the same order for the same seed.
    a = [s["__key__"] for s in sluice.data.StreamingDataset(root, seed=3)]
    b = [s["__key__"] for s in sluice.data.StreamingDataset(root, seed=3)]
    c = [s["__key__"] for s in sluice.data.StreamingDataset(root, seed=4)]
    assert a == b and a != c and sorted(a) == sorted(expected)


def test_reads_from_s3_through_the_cache(s3, shards, monkeypatch, s3server):
    root, expected = shards
    s3.copy(root, "s3://data/wds/", recursive=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3server.endpoint)
    ds = sluice.data.StreamingDataset("s3://data/wds/", seed=1,
                                      session_options={"home": s3.home, "daemon": "none"})
    got = {s["__key__"]: s["txt"] for s in ds}
    assert got == {k: v["txt"] for k, v in expected.items()}


@pytest.mark.parametrize("batch_size", [1, 8])
def test_exactly_once_two_workers_three_ranks(shards, batch_size):
    root, expected = shards
    seen = collections.Counter()
    for rank in range(3):
        ds = sluice.data.StreamingDataset(root, seed=5, rank=rank, world_size=3)
        loader = sluice.data.DataLoader(ds, batch_size=batch_size, num_workers=2)
        keys = run(loader)
        assert abs(len(keys) - SAMPLES / 3) < 1
        seen.update(keys)
    assert set(seen) == set(expected)
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("packed", [True, False])
def test_workers_make_whole_batches(shards, tmp_path, monkeypatch, packed):
    """With workers and the default collation, workers make whole batches, packed in shared
    memory for large samples (forced here) and pickled for small ones: either way the
    default collation of the samples, with the same bytes, keys and indexes; len and
    batch_size as a DataLoader has them. Packed batches come in a few shared buffers per
    worker, used again and again."""
    root, expected = shards
    unpacked = []
    if packed:
        monkeypatch.setattr(sluice.data, "_PACK_MIN_SAMPLE_BYTES", 0)
        unpack = sluice.data._Packed.unpack
        monkeypatch.setattr(sluice.data._Packed, "unpack", lambda self, *a: unpacked.append(
            (self.pool, self.slot)) or unpack(self, *a))
        mapped = []  # the maps this process makes (the workers' own are in their copies)
        monkeypatch.setattr(sluice.data, "mmap", types.SimpleNamespace(
            PROT_READ=mmap.PROT_READ, mmap=lambda *a, **k: mapped.append(a) or mmap.mmap(*a, **k)))
    ds = sluice.data.StreamingDataset(root, seed=4)
    loader = sluice.data.DataLoader(ds, batch_size=8, num_workers=2)
    assert loader.batch_size == 8 and len(loader) == (SAMPLES + 7) // 8
    seen = {}
    sizes = []
    for batch in loader:
        assert set(batch) == {"__key__", "__index__", "txt", "cls"}
        assert batch["__index__"].dtype == torch.int64
        sizes.append(len(batch["__key__"]))
        for i, key in enumerate(batch["__key__"]):
            assert type(batch["txt"][i]) is bytes
            seen[key] = {"txt": batch["txt"][i], "cls": batch["cls"][i]}
            assert ds._open().key(int(batch["__index__"][i])) == key
    assert seen == expected
    assert sizes[:-1] == [8] * (len(sizes) - 1)
    assert len(unpacked) == (len(sizes) if packed else 0)
    if packed:
        # every batch in a slot of its worker (none had to get a buffer of its own), and
        # each slot mapped here once, with each worker's busy bytes
        assert len({pool for pool, _ in unpacked}) == 2
        assert all(slot >= 0 for _, slot in unpacked)
        slots = set(unpacked)
        assert len(slots) < len(unpacked) / 2
        assert len(mapped) == len(slots) + 2


def test_a_workers_shared_slots_are_used_again_and_a_busy_one_never():
    slots = sluice.data._SharedSlots()
    taken: list = []
    for _ in range(slots._MAX):
        slots.take(100, taken)
    assert [slot for slot, _ in taken] == list(range(slots._MAX))
    for _, (_, fd, size) in taken:  # memfds of at least the size asked
        assert size >= 100 and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    # every slot busy: a buffer of its own, not kept
    own = slots.take(100, taken)
    assert taken[-1][0] == -1 and len(own) == 100 and len(slots.slots) == slots._MAX
    # the main process frees slot 3: the next batch goes there, in the same memory
    slots.busy[3] = 0
    slots.take(100, taken)
    assert taken[-1] == (3, taken[3][1])
    # a batch larger than the free slot: that slot is made again, larger
    slots.busy[3] = 0
    slots.take(1 << 20, taken)
    generation, _, size = taken[-1][1]
    assert taken[-1][0] == 3 and size >= 1 << 20 and generation != taken[3][1][0]
    assert sum(slots.busy) == slots._MAX
    slots.close()


def test_a_packed_batch_is_read_from_the_workers_slot_and_frees_it():
    """The main process's side of a slot (here the worker is this process): the batch's
    bytes come out of the worker's memfd, mapped once, and its busy byte is cleared; a
    slot made again is mapped again; a batch that had no slot brings its own bytes."""
    slots = sluice.data._SharedSlots()
    held: dict = {}

    def packed(payload: bytes) -> sluice.data._Packed:
        taken: list = []
        buf = slots.take(len(payload), taken)
        buf[:len(payload)] = payload
        records = [("a", 0, (("txt", 0, 3),)), ("b", 1, (("txt", 3, len(payload) - 3),))]
        return sluice.data._Packed(slots, *taken[0], records)

    batch = packed(b"onetwo").unpack(held=held)
    assert batch["__key__"] == ["a", "b"] and batch["txt"] == [b"one", b"two"]
    assert batch["__index__"].tolist() == [0, 1]
    assert sum(slots.busy) == 0 and len(held) == 2  # the slot and the busy bytes
    first = held[slots.id, 0]
    assert packed(b"abcdef").unpack(held=held)["txt"] == [b"abc", b"def"]
    assert held[slots.id, 0] is first  # not mapped again
    big = b"x" * (1 << 17)
    assert packed(big).unpack(held=held)["txt"] == [b"xxx", big[3:]]
    assert held[slots.id, 0] is not first and sum(slots.busy) == 0
    for _ in range(slots._MAX):  # every slot made and busy: a buffer of its own
        slots.take(10, [])
    assert sum(slots.busy) == len(slots.slots) == slots._MAX
    batch = packed(b"ownbuf")
    assert batch.slot == -1 and isinstance(batch.where, bytearray)
    batch = pickle.loads(pickle.dumps(batch))  # its bytes cross with it
    assert batch.unpack(held=held)["txt"] == [b"own", b"buf"]
    slots.close()


def _send_a_batch_then_exit(conn) -> None:
    slots = sluice.data._SharedSlots()
    taken: list = []
    slots.take(6, taken)[:6] = b"abcdef"
    conn.send_bytes(pickle.dumps(sluice.data._Packed(slots, *taken[0], [
        ("a", 0, (("txt", 0, 6),))])))
    conn.recv()  # exit when told, as torch tells a worker at its end of pass
    os._exit(0)


def test_a_packed_batch_unpacked_after_its_worker_exited():
    """torch may keep a worker's batch back for the order while the worker, told its pass is
    over, exits: the batch is opened when it arrives, and unpacked later."""
    parent, child = multiprocessing.get_context("fork").Pipe()
    worker = multiprocessing.get_context("fork").Process(target=_send_a_batch_then_exit,
                                                         args=(child,))
    worker.start()
    batch = pickle.loads(parent.recv_bytes())
    parent.send(None)
    worker.join(30)
    assert worker.exitcode == 0
    assert not os.path.exists(f"/proc/{worker.pid}")
    assert batch.unpack(held={})["txt"] == [b"abcdef"]


def test_a_packed_batch_whose_worker_is_gone_is_a_clear_error():
    slots = sluice.data._SharedSlots()
    taken: list = []
    slots.take(10, taken)
    batch = sluice.data._Packed(slots, *taken[0], [("a", 0, (("txt", 0, 10),))])
    batch.pid = 2 ** 22 + 1  # past pid_max's largest: no such process
    with pytest.raises(sluice.errors.Unavailable, match="worker's batch buffer"):
        batch.unpack(held={})
    slots.close()


@pytest.mark.parametrize("workers,packed", [(0, False), (1, False), (1, True)])
def test_whole_batches_need_the_same_fields(tmp_path, monkeypatch, workers, packed):
    if packed:
        monkeypatch.setattr(sluice.data, "_PACK_MIN_SAMPLE_BYTES", 0)
    # Samples whose fields differ cannot share a default-collated batch: said, not guessed,
    # with any number of workers (issue 47, defect 6: without workers torch's collation took
    # the first sample's fields and dropped "json" from the batch).
    for name, first, second in (("fewer", {"txt": b"1"}, {"txt": b"2", "json": b"{}"}),
                                ("odd", {"txt": b"1"}, {"json": b"{}"})):
        odd = tmp_path / name
        odd.mkdir()
        with wds.TarWriter(str(odd / "shard-0000.tar")) as sink:
            sink.write({"__key__": "a", **first})
            sink.write({"__key__": "b", **second})
        bad = sluice.data.DataLoader(sluice.data.StreamingDataset(str(odd), shuffle=False),
                                     batch_size=2, num_workers=workers)
        with pytest.raises(sluice.InvalidArgument, match="same fields in every sample"):
            run(bad)
    # The same fields in another order (a tar made by hand) are the same fields.
    mixed = tmp_path / "mixed"
    mixed.mkdir(exist_ok=True)
    with tarfile.open(str(mixed / "shard-0000.tar"), "w") as tar:
        for name, data in (("a.txt", b"A"), ("a.cls", b"1"), ("b.cls", b"2"), ("b.txt", b"B")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    loader = sluice.data.DataLoader(sluice.data.StreamingDataset(str(mixed), shuffle=False),
                                    batch_size=2, num_workers=workers)
    (batch,) = list(loader)
    assert batch["__key__"] == ["a", "b"]
    assert batch["txt"] == [b"A", b"B"] and batch["cls"] == [b"1", b"2"]
    assert batch["__index__"].tolist() == [0, 1]


def test_a_loader_keeps_a_few_connections_to_sluiced(shards, s3, s3server, tmp_path):
    """A loader's reads in flight share a few connections to sluiced: a daemon that allows
    a uid 6 refuses none of them (it refused most when each read took its own)."""
    if not os.path.exists(conftest.binary("sluiced")):
        pytest.skip("no sluiced in the build")
    root, expected = shards
    s3.copy(root, "s3://data/conns/", recursive=True)
    d = conftest.Daemon(str(tmp_path), s3server.endpoint, "--max-connections-per-uid", "6")
    try:
        s = sluice.connect(home=s3.home, daemon=d.socket, endpoint_url=s3server.endpoint)
        ds = _core.open_dataset(s._core, "s3://data/conns/", True)
        loader = _core.Loader(dataset=ds, seed=1, shuffle=True, memory_bytes=8 << 20)
        keys = []
        while batch := loader.next_batch(64):
            keys += [x["__key__"] for x in batch]
        assert sorted(keys) == sorted(expected)
        stats = loader.stats()
        assert stats["throttled"] == 0
        assert stats["window_parts"] == 0, stats  # small shards: every window fits a slice
    finally:
        d.stop()


def test_a_rank_sees_its_stream_in_order_with_workers(shards):
    """Batches from two workers arrive in the rank's order (positions r, r+W, ...)."""
    root, _ = shards
    ds = sluice.data.StreamingDataset(root, seed=2, rank=1, world_size=2)
    with_workers = run(sluice.data.DataLoader(ds, batch_size=4, num_workers=2))
    ds0 = sluice.data.StreamingDataset(root, seed=2, rank=1, world_size=2)
    without = run(sluice.data.DataLoader(ds0, batch_size=4, num_workers=0))
    assert with_workers == without


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_resume_mid_epoch_is_exact(shards, workers):
    root, _ = shards
    full = run(sluice.data.DataLoader(
        sluice.data.StreamingDataset(root, seed=9), batch_size=6, num_workers=workers))
    loader = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=9), batch_size=6,
                                    num_workers=workers)
    first = run(loader, limit=7)
    state = loader.state_dict()
    assert state["position"] == 42 and state["epoch"] == 0
    resumed = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=9), batch_size=6,
                                     num_workers=workers)
    resumed.load_state_dict(state)
    rest = run(resumed)
    assert first + rest == full
    # After a full pass the state is the next epoch's start, and the next pass reads it.
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["position"] == 0
    again = run(resumed)
    assert sorted(again) == sorted(full) and again != full


def test_elastic_resume_reads_the_rest_exactly_once(shards):
    root, expected = shards
    taken = collections.Counter()
    states = []
    for rank in range(2):  # 2 ranks x 2 workers, 5 steps of 4
        ds = sluice.data.StreamingDataset(root, seed=7, rank=rank, world_size=2)
        loader = sluice.data.DataLoader(ds, batch_size=4, num_workers=2)
        taken.update(run(loader, limit=5))
        states.append(loader.state_dict())
    assert states[0] == states[1]  # lockstep: every rank says the same
    for rank in range(3):  # 3 ranks x 1 worker, batch 5
        ds = sluice.data.StreamingDataset(root, seed=7, rank=rank, world_size=3)
        loader = sluice.data.DataLoader(ds, batch_size=5, num_workers=1)
        loader.load_state_dict(states[0])
        taken.update(run(loader))
    assert set(taken) == set(expected) and set(taken.values()) == {1}


def test_stateful_dataloader_resume_mid_epoch_is_exact(shards):
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    root, _ = shards

    def make():
        return tdl.StatefulDataLoader(
            sluice.data.StreamingDataset(root, seed=11, batch_size=5), batch_size=5,
            num_workers=2)

    full = run(make())
    loader = make()
    it = iter(loader)
    first = []
    for _ in range(9):
        first.extend(next(it)["__key__"])
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = run(resumed)
    assert first + rest == full


def test_bad_input_raises(shards, tmp_path):
    root, _ = shards
    with pytest.raises(sluice.NotFound):
        sluice.data.StreamingDataset(str(tmp_path / "none"))
    with pytest.raises(sluice.InvalidArgument):
        sluice.data.StreamingDataset(root, batch_size=0)
    with pytest.raises(sluice.InvalidArgument):
        sluice.data.StreamingDataset(root, rank=3, world_size=2).__len__()
    ds = sluice.data.StreamingDataset(root, seed=1)
    with pytest.raises(sluice.InvalidArgument, match="seed"):
        ds.load_state_dict({"version": 1, "seed": 2, "epoch": 0, "position": 3})
    with pytest.raises(sluice.InvalidArgument):
        ds.load_state_dict({"what": 1})
    with pytest.raises(sluice.InvalidArgument):
        sluice.data.DataLoader(ds, batch_size=2, drop_last=True)
    with pytest.raises(sluice.InvalidArgument, match="persistent_workers"):
        sluice.data.DataLoader(ds, batch_size=2, num_workers=1, persistent_workers=True)
    with pytest.raises(sluice.InvalidArgument, match="batch_size"):
        sluice.data.DataLoader(ds, batch_size=None)
    # A state names the order: another shuffle setting or window is refused.
    saved = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1), batch_size=4)
    run(saved, limit=1)
    with pytest.raises(sluice.InvalidArgument, match="shuffle=True"):
        sluice.data.StreamingDataset(root, seed=1, shuffle=False).load_state_dict(saved.state_dict())
    with pytest.raises(sluice.InvalidArgument, match="shuffle window"):
        sluice.data.StreamingDataset(root, seed=1, shuffle_window=3).load_state_dict(
            saved.state_dict())
    # An automatic window follows the state's, whatever memory the new job has.
    other_memory = sluice.data.StreamingDataset(root, seed=1, memory="64M")
    other_memory.load_state_dict(saved.state_dict())
    assert other_memory.shuffle_window == saved.state_dict()["window"]
    other = tmp_path / "other"
    write_shards(str(other), samples=40)
    ds2 = sluice.data.StreamingDataset(str(other), seed=1)
    state = sluice.data.DataLoader(ds, batch_size=4)
    run(state, limit=2)
    with pytest.raises(sluice.InvalidArgument, match="another dataset"):
        ds2.load_state_dict(state.state_dict())


def mid_epoch_state(root, **kwargs):
    """A DataLoader's state after two batches of 4 (seed 1)."""
    loader = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1, **kwargs),
                                    batch_size=4)
    run(loader, limit=2)
    return loader.state_dict()


def test_a_state_binds_to_the_datasets_content(shards, tmp_path):
    """Issue 47, defect 7: a state of another dataset with the same shard names, sizes and
    sample counts, or of this dataset before it was regenerated, is refused; so is one of
    the same shards at another location. It used to be accepted, and the resumed epoch
    skipped samples."""
    root, _ = shards
    state = mid_epoch_state(root)
    layout = {n: os.path.getsize(os.path.join(root, n)) for n in os.listdir(root)}
    # Regenerated in place: other keys and other bytes, the same names, sizes and counts.
    write_shards(root, name="elpmas", text="TEXT OF")
    assert {n: os.path.getsize(os.path.join(root, n)) for n in os.listdir(root)} == layout
    regenerated = sluice.data.StreamingDataset(root, seed=1)
    assert regenerated._open().fingerprint == state["fingerprint"]  # the layout cannot tell
    with pytest.raises(sluice.InvalidArgument, match="etag or sample table"):
        regenerated.load_state_dict(state)
    assert (regenerated.epoch, regenerated._start) == (0, 0)  # left as it was
    # Regenerated again with the same keys (only the bytes differ): a stale state.
    state = mid_epoch_state(root)
    write_shards(root, name="elpmas", text="Text Of")
    with pytest.raises(sluice.InvalidArgument, match="etag or sample table"):
        sluice.data.StreamingDataset(root, seed=1).load_state_dict(state)
    # The resume token the core checks is bound the same way (sluice dataset read --resume).
    old = sluice.data.StreamingDataset(root, seed=1)
    token = _core.make_token(old._open(), 0, 8, 1, old._window())
    assert token.startswith("v3.")
    write_shards(root, name="elpmas", text="text of")
    new = sluice.data.StreamingDataset(root, seed=1)
    loader = _core.Loader(dataset=new._open(), seed=1, resume=token, shuffle_window=old._window())
    with pytest.raises(sluice.InvalidArgument, match="etag or sample table"):
        loader.next_batch(1)
    # The same shards copied elsewhere: another dataset, by location.
    state = mid_epoch_state(root)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root, elsewhere)
    with pytest.raises(sluice.InvalidArgument, match="another dataset"):
        sluice.data.StreamingDataset(str(elsewhere), seed=1).load_state_dict(state)
    # The same dataset named another way (a relative path) is the same dataset.
    relative = os.path.relpath(root)
    resumed = sluice.data.StreamingDataset(relative, seed=1)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed._start) == (0, 8)
    # So is the same dataset read by another route (not through the node's cache; or
    # through a node whose daemon is down: the embedded cache).
    direct = sluice.data.StreamingDataset(root, seed=1, cache=False)
    direct.load_state_dict(state)
    assert (direct.epoch, direct._start) == (0, 8)
    # Through a symlink to its folder, and after a chmod (a new ctime), still the same.
    link = tmp_path / "link"
    os.symlink(root, link)
    for name in os.listdir(root):
        os.chmod(os.path.join(root, name), 0o640)
    linked = sluice.data.StreamingDataset(str(link), seed=1, cache=False, catalog=False)
    linked.load_state_dict(state)
    assert (linked.epoch, linked._start) == (0, 8)


def test_an_edited_state_is_refused(shards):
    """Issue 47, defect 7: a state whose window (or any other field) was changed after it
    was saved is refused; an edited window used to be adopted, and the rest of the epoch
    read 17 samples twice."""
    root, expected = shards
    state = mid_epoch_state(root)
    for field, value in (("window", state["window"] + 17), ("position", 12), ("epoch", 1),
                         ("shuffle", False), ("identity", 1), ("location", "file:///x")):
        edited = dict(state, **{field: value})
        ds = sluice.data.StreamingDataset(root, seed=1)
        with pytest.raises(sluice.InvalidArgument, match="digest"):
            ds.load_state_dict(edited)
        assert ds.shuffle_window == 0 and (ds.epoch, ds._start) == (0, 0)
    with pytest.raises(sluice.InvalidArgument, match="digest"):
        sluice.data.StreamingDataset(root, seed=1).load_state_dict(
            {k: v for k, v in state.items() if k != "digest"})
    # A version that only compares equal to 1 (True, 1.0) is no version 1 state (the hostile
    # test's relabelling, which skipped every content check).
    for version in (True, 1.0, 2.0):
        with pytest.raises(sluice.InvalidArgument, match="not a sluice StreamingDataset state"):
            sluice.data.StreamingDataset(root, seed=1).load_state_dict(
                dict(state, version=version, position=150))
    # A worker's state (StatefulDataLoader) is sealed the same way.
    worker_state = sluice.data.StreamingDataset(root, seed=1).state_dict()
    with pytest.raises(sluice.InvalidArgument, match="digest"):
        sluice.data.StreamingDataset(root, seed=1).load_state_dict(
            dict(worker_state, worker_batches=3))
    # The state as saved resumes exactly, with the window it names (another memory budget).
    full = run(sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1), batch_size=4))
    loader = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1, memory="64M"),
                                    batch_size=4)
    loader.load_state_dict(state)
    assert full[:8] + run(loader) == full


def test_a_version_1_state_is_read_by_its_layout(shards, caplog):
    """States of older releases (version 1: no location, identity or digest) still resume,
    with a warning, and only with the window this dataset uses itself."""
    root, expected = shards
    state = mid_epoch_state(root)
    old = {k: v for k, v in state.items() if k not in ("location", "identity", "digest")}
    old["version"] = 1
    loader = sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1), batch_size=4)
    with caplog.at_level("WARNING", logger="sluice"):
        loader.load_state_dict(old)
    assert "version 1 state" in caplog.text
    first = run(sluice.data.DataLoader(sluice.data.StreamingDataset(root, seed=1), batch_size=4),
                limit=2)
    assert sorted(first + run(loader)) == sorted(expected)
    with pytest.raises(sluice.InvalidArgument, match="shuffle_window=9"):
        sluice.data.StreamingDataset(root, seed=1).load_state_dict(dict(old, window=9))


def test_numbers_out_of_range_are_refused_where_given(shards):
    """Issue 47, defect 10: numbers a C++ parameter cannot hold are InvalidArgument naming
    the argument, raised by the call that took them (they used to reach pybind11 as a
    TypeError, a bad seed only at iter())."""
    root, _ = shards
    for kwargs, name in (({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
                         ({"epoch": -1}, "epoch"), ({"shuffle_window": -1}, "shuffle_window"),
                         ({"memory": 2**70}, "memory"), ({"batch_size": "4"}, "batch_size"),
                         ({"rank": -1, "world_size": 2}, "rank"),
                         ({"rank": 0, "world_size": 2**32}, "world_size")):
        with pytest.raises(sluice.InvalidArgument, match=name):
            sluice.data.StreamingDataset(root, **kwargs)
    ds = sluice.data.StreamingDataset(root, seed=2**64 - 1)  # the largest seed reads
    assert len(run(sluice.data.DataLoader(ds, batch_size=8), limit=1)) == 8
    with pytest.raises(sluice.InvalidArgument, match="epoch"):
        ds.set_epoch(-1)
    state = mid_epoch_state(root)
    for field, value in (("epoch", -1), ("position", -4), ("window", -1), ("position", 2**64),
                         ("epoch", 2**64)):
        with pytest.raises(sluice.InvalidArgument, match=f"state's {field}"):
            sluice.data.StreamingDataset(root, seed=1).load_state_dict(dict(state, **{field: value}))
    with pytest.raises(sluice.InvalidArgument, match="seed"):
        sluice.data.StreamingDataset(root, seed=1).load_state_dict(dict(state, seed=-1))
