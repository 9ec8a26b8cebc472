"""Streaming datasets into PyTorch: every sample exactly once across ranks and DataLoader
workers, in a deterministic shuffled order, resumable exactly (also with another world size
or worker count).

    ds = sluice.data.StreamingDataset("s3://bucket/train/", shuffle=True, seed=7, batch_size=64)
    loader = sluice.data.DataLoader(ds, batch_size=64, num_workers=4)
    for batch in loader:                  # dicts: "__key__" and one bytes field per extension
        ...
        state = loader.state_dict()       # save it with the checkpoint

    loader.load_state_dict(state)         # in the new job: continue where it stopped

The order of an epoch is a function of (seed, epoch) only (docs/dataset.md). Rank r of W
reads the epoch's positions r, r + W, r + 2W, ... (its stream); its DataLoader workers take
that stream in blocks of ``batch_size`` samples, one worker after the other, which is the
order a DataLoader hands batches to the training loop. So the count of samples the training
loop has taken is the exact resume point, and a resumed job with other ranks or workers
reads exactly the samples not taken yet.

Two ways to keep that count:
- :class:`DataLoader` (a ``torch.utils.data.DataLoader``) counts what it hands out, in the
  main process, as Mosaic Streaming does: its ``state_dict()`` is exact and elastic.
- torchdata's ``StatefulDataLoader`` asks each worker's copy of the dataset for its state
  (``state_dict``/``load_state_dict`` below): exact when resumed with the same layout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from typing import Any, Iterator

import torch
import torch.utils.data

from . import _core
from ._args import U32_MAX, U64_MAX, check_int, check_optional_int
from ._session import Session, connect
from .errors import InvalidArgument, Unavailable

__all__ = ["StreamingDataset", "DataLoader", "rank_and_world"]

# 2: a state names the dataset's location and content identity and carries a digest of its
# fields. Version 1 states (layout only, no digest) are still read; see load_state_dict.
_STATE_VERSION = 2
# Samples at least this large on average (the dataset's bytes over its samples) reach the
# main process packed in shared memory; smaller ones pickled. Between 1 KiB (pickling
# faster) and 100 KiB (packing faster); the crossover itself is not measured.
_PACK_MIN_SAMPLE_BYTES = 16 << 10
_noted: set = set()
log = logging.getLogger("sluice")


def _note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        log.warning(message)


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size: from torch.distributed when it is
    initialized, else the launcher's environment (RANK and WORLD_SIZE, as torchrun sets
    them), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise InvalidArgument(f"RANK or WORLD_SIZE is not a number: {e}") from None
    if not 0 <= rank < world:
        raise InvalidArgument(f"RANK {rank} is not below WORLD_SIZE {world}")
    return rank, world


def _size(v: Any, name: str) -> int:
    if isinstance(v, str):
        from ._units import parse_size

        return parse_size(v, name)
    if not isinstance(v, int) or v < 0:
        raise InvalidArgument(f"{name}: {v!r} is not a size")
    return v


class StreamingDataset(torch.utils.data.IterableDataset):
    """A sluice dataset (``sluice dataset pack``) or plain WebDataset tar shards under a
    prefix, as an ``IterableDataset`` of WebDataset-style samples: dicts of ``__key__``,
    ``__index__`` (the dataset-wide sample number) and one ``bytes`` per field (decoding
    is yours).

    Each ``iter()`` reads one epoch, :attr:`epoch` (``set_epoch`` chooses it; the
    :class:`DataLoader` advances it after each full pass). ``memory`` is the rank's
    read-ahead budget, shared by its DataLoader workers; the automatic shuffle window is the
    one the whole budget gives, whatever the number of workers. ``batch_size`` must be the
    DataLoader's batch size when it has workers, so that each worker's batches are whole
    blocks of the rank's stream. Reads go through the node's cache (sluiced, else the
    embedded cache) with the loader's order declared to it, unless ``cache=False``.
    """

    def __init__(self, uri: Any, *, shuffle: bool = True, seed: int = 0, batch_size: int = 1,
                 epoch: int = 0, shuffle_window: int = 0, memory: Any = "256M",
                 cache: bool = True, catalog: bool = True, format: str = "auto",
                 skip_corrupt: bool = False, rank: int | None = None,
                 world_size: int | None = None, session: Session | None = None,
                 session_options: dict | None = None) -> None:
        """Every number is checked here (InvalidArgument naming it), not in a worker: ``seed``
        and ``shuffle_window`` from 0 to 2**64 - 1, ``epoch`` from 0 to 2**63 - 1,
        ``batch_size`` from 1, ``memory`` a size (bytes, or text such as "256M") below
        2**64, ``rank`` below ``world_size`` (at most 2**32 - 1)."""
        super().__init__()
        self.uri = os.fspath(uri)
        self.batch_size = check_int(batch_size, f"{self.uri}: batch_size", lo=1)
        self.shuffle = bool(shuffle)
        self.seed = check_int(seed, f"{self.uri}: seed", hi=U64_MAX)
        self.shuffle_window = check_int(shuffle_window, f"{self.uri}: shuffle_window", hi=U64_MAX)
        self.memory_bytes = check_int(_size(memory, f"{self.uri}: memory"), f"{self.uri}: memory",
                                      hi=U64_MAX)
        epoch = check_int(epoch, f"{self.uri}: epoch")
        rank = check_optional_int(rank, f"{self.uri}: rank", hi=U32_MAX - 1)
        world_size = check_optional_int(world_size, f"{self.uri}: world_size", lo=1, hi=U32_MAX)
        self.cache = cache
        self.catalog = catalog
        self.format = format
        self.skip_corrupt = skip_corrupt
        # Decided here, in the calling process: a DataLoader worker started by spawn or
        # forkserver has no torch.distributed of its own.
        if rank is None and world_size is None:
            rank, world_size = rank_and_world()
        self._rank, self._world = int(rank or 0), int(1 if world_size is None else world_size)
        if not 0 <= self._rank < self._world:
            raise InvalidArgument(f"{self.uri}: rank {self._rank} is not below world_size "
                                  f"{self._world}")
        # How each process (the main one, each worker) connects: a Session does not cross
        # into worker processes, its options do.
        self._session_options = dict(session_options or {})
        if session is not None and not self._session_options:
            self._session_options = dict(session.options)
        self.epoch = epoch
        self._start = 0  # where this epoch's reads start (a resumed position)
        self._worker_batches = 0  # batches this worker copy has yielded in this epoch
        self._iter_layout: tuple[int, int, int, int] | None = None
        self._dataset: Any = None
        self._dataset_pid = -1
        self._whole_batches = False  # in sluice.DataLoader's workers: yield whole batches
        # Opened now, in the calling process: a missing dataset is an error here, not in
        # the first worker; the catalog makes each worker's own open cheap.
        self._open()

    # ---- opening ---------------------------------------------------------------------

    def _session(self) -> Session:
        return connect(**self._session_options) if self._session_options else connect()

    def _open(self) -> Any:
        """The dataset's layout (listing, sample tables), read without the cache."""
        if self._dataset_pid != os.getpid():
            # A forked worker inherited the parent's open dataset, whose threads are not in
            # this process (the core leaks such objects rather than destroy them): its own.
            self._dataset = None
        if self._dataset is None:
            self._dataset = _core.open_dataset(self._session()._core, self.uri, False,
                                               self.catalog, self.format, self.skip_corrupt)
            self._dataset_pid = os.getpid()
        return self._dataset

    def _open_for_reading(self, in_worker: bool) -> Any:
        """The dataset opened for one pass: through the node's cache where one can be had.
        sluiced serves every process; the embedded cache (a directory) only one process at
        a time, so without sluiced DataLoader workers, or a second pass running at once in
        this process, read directly (said once in the log)."""
        if not self.cache:
            return self._open()
        session = self._session()
        if session.cache == "embedded" and in_worker:
            _note_once(f"sluice: DataLoader workers read {self.uri} directly: the embedded cache "
                       f"serves one process ({session.cache_reason}); start sluiced to share "
                       "the node's cache between workers")
            return self._open()
        try:
            return _core.open_dataset(session._core, self.uri, True, self.catalog, self.format,
                                      self.skip_corrupt)
        except Unavailable as e:
            if "in use by" not in str(e):
                raise
            _note_once(f"sluice: reading {self.uri} directly: {e}")
            return self._open()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_dataset"] = None  # each process opens its own
        state["_dataset_pid"] = -1
        return state

    @property
    def samples(self) -> int:
        """Samples in the dataset (in one epoch, across all ranks)."""
        return self._open().samples

    def __len__(self) -> int:
        """This rank's samples in an epoch from the start."""
        rank, world = self._layout()[:2]
        n = self.samples
        return (n - rank + world - 1) // world if rank < n else 0

    def _layout(self) -> tuple[int, int, int, int]:
        rank, world = self._rank, self._world
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank, world, worker, workers

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` reads, from its start (0 to 2**63 - 1, else
        InvalidArgument)."""
        self.epoch = check_int(epoch, f"{self.uri}: epoch")
        self._start = 0
        self._worker_batches = 0

    # ---- reading ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        rank, world, worker, workers = self._layout()
        in_worker = torch.utils.data.get_worker_info() is not None
        ds = self._open_for_reading(in_worker)
        layout = (world, workers, self.batch_size, worker)
        skip = 0
        if self._worker_batches:
            # A worker's copy resumed from its own state (StatefulDataLoader): skip the
            # whole rounds of blocks it already delivered. Only the same layout can.
            if self._iter_layout != layout:
                raise InvalidArgument(
                    f"{self.uri}: this worker's state was saved with (world, workers, "
                    f"batch_size, worker) {self._iter_layout}, not {layout}: resume per-worker "
                    "states with the same layout, or use sluice.data.DataLoader's state, "
                    "which any layout can resume")
            skip = self._worker_batches * workers * self.batch_size * world
        start = self._start + skip
        self._iter_layout = layout
        if start >= ds.samples:
            self.epoch, self._start, self._worker_batches = self.epoch + 1, 0, 0
            return
        # The read-ahead budget is the rank's, shared by its workers (each worker's buffers
        # are touched when they are first filled); the shuffle window stays the one the
        # whole budget gives, so the order does not depend on the number of workers.
        window = self._window()
        token = _core.make_token(ds, self.epoch, start, self.seed, window) if start else ""
        loader = _core.Loader(dataset=ds, seed=self.seed, epoch=self.epoch, epochs=1,
                              rank=rank, world=world, worker=worker, workers=workers,
                              block=self.batch_size, resume=token, shuffle=self.shuffle,
                              shuffle_window=window,
                              memory_bytes=max(8 << 20, self.memory_bytes // workers),
                              skip_corrupt=self.skip_corrupt)
        if self._whole_batches and in_worker:
            yield from self._batches(loader, ds)
        else:
            yield from self._samples(loader)
        # A full pass: what a worker's state says now is the next epoch's start.
        self.epoch += 1
        self._start = 0
        self._worker_batches = 0

    def _samples(self, loader: Any) -> Iterator[dict]:
        """The pass's samples one by one, counting this copy's whole blocks."""
        in_block = 0
        want = max(self.batch_size, 64)
        while batch := loader.next_batch(want):
            for sample in batch:
                # Counted before it is handed out: a worker's state is taken right after it
                # made a batch, with the batch's last sample still "in" the generator.
                in_block += 1
                if in_block == self.batch_size:
                    in_block = 0
                    self._worker_batches += 1
                yield sample

    def _batches(self, loader: Any, ds: Any) -> Iterator[Any]:
        """The pass in whole blocks, for sluice's DataLoader with the default collation,
        collated in the main process (a tensor made here would cross in a shared-memory
        file of its own: for 1 KiB samples that doubled an epoch). Large samples' bytes go in
        one of this worker's shared-memory buffers (`_SharedSlots`), small ones are
        pickled."""
        packed = ds.bytes >= _PACK_MIN_SAMPLE_BYTES * max(1, ds.samples)
        slots = _SharedSlots() if packed else None
        while True:
            if slots is not None:
                taken: list = []
                records = loader.next_packed(self.batch_size, lambda n: slots.take(n, taken))
                if records is None:
                    return
                batch: Any = _Packed(slots, *taken[0], records)
            else:
                samples = loader.next_batch(self.batch_size)
                if not samples:
                    return
                batch = _Samples(samples)
            self._worker_batches += 1
            yield batch

    # ---- resume state (torchdata's StatefulDataLoader calls these in each worker) -----

    def state_dict(self) -> dict:
        """This copy's place: the epoch, where it started, and the batches it has yielded
        (in a worker: its own), with what :meth:`load_state_dict` checks it against."""
        return _sealed({"version": _STATE_VERSION, "uri": self.uri, "seed": self.seed,
                        **self._identity(), "epoch": self.epoch, "start": self._start,
                        "worker_batches": self._worker_batches,
                        "layout": list(self._iter_layout) if self._iter_layout else None})

    def _window(self) -> int:
        """The shuffle window in effect (0: no shuffle): the given one, else the whole
        read-ahead budget's."""
        return _core.shuffle_window(self._open(), self.shuffle, self.shuffle_window,
                                    self.memory_bytes)

    def _identity(self) -> dict:
        """What a state is tied to: where the dataset is, its layout and content (the
        layout's fingerprint; the identity, which adds each shard's etag and sample table),
        and the order (shuffle and its window)."""
        ds = self._open()
        return {"location": ds.location, "samples": ds.samples, "fingerprint": ds.fingerprint,
                "identity": ds.identity, "shuffle": self.shuffle, "window": self._window()}

    def load_state_dict(self, state: dict) -> None:
        """Continues from a state of :meth:`state_dict` or of :meth:`DataLoader.state_dict`.

        The state must be one saved for this dataset, unchanged: the same location, layout
        and content (each shard's etag and sample table), seed and shuffle setting, its
        numbers in range, and every field as it was saved (its digest). Otherwise
        InvalidArgument says which, and this dataset is left as it was. A state with the
        automatic shuffle window brings its window along (the order of the epoch depends on
        it); an explicit ``shuffle_window`` must be the state's. Version 1 states (of older
        releases) name the layout only: they are read with a warning, and only with the
        window this dataset uses itself.
        """
        where = self.uri
        version = state.get("version") if isinstance(state, dict) else None
        if type(version) is not int or version not in (1, _STATE_VERSION):  # True, 1.0: no
            raise InvalidArgument(f"{where}: not a sluice StreamingDataset state: {state!r}")
        if state.get("seed") != self.seed:
            raise InvalidArgument(f"{where}: the state was saved with seed {state.get('seed')!r}, "
                                  f"this dataset has seed {self.seed}")
        mine = self._identity()
        # The numbers first, each named: a negative or huge one is a broken state, whatever
        # else matches.
        epoch = check_int(state.get("epoch"), f"{where}: the state's epoch")
        window = check_int(state.get("window"), f"{where}: the state's window", hi=U64_MAX)
        if "position" in state:  # a DataLoader's (main-process) state
            start = check_int(state["position"], f"{where}: the state's position",
                              hi=mine["samples"])
            worker_batches, layout = 0, None
        else:
            start = check_int(state.get("start", 0), f"{where}: the state's start",
                              hi=mine["samples"])
            worker_batches = check_int(state.get("worker_batches", 0),
                                       f"{where}: the state's worker_batches")
            layout = state.get("layout")
            if layout is not None:
                if not isinstance(layout, (list, tuple)) or len(layout) != 4:
                    raise InvalidArgument(f"{where}: the state's layout {layout!r} is not "
                                          "(world, workers, batch_size, worker)")
                layout = tuple(check_int(v, f"{where}: the state's layout") for v in layout)
        # Why a digest rather than a check of the window alone: a state's window is whatever
        # the saving job's memory budget or shuffle_window gave, any number from 1, so no
        # rule can tell an edited window (or epoch, or position) from a real one. The digest
        # over every field refuses a state edited, or pieced together from two, after
        # state_dict made it. It is a checksum, not a signature: a state is as trusted as the
        # checkpoint that holds it, and this stops mistakes, not a forger.
        if version == _STATE_VERSION and state.get("digest") != _digest(state, where):
            raise InvalidArgument(f"{where}: the state does not match its digest: a field was "
                                  "changed after it was saved (or it joins two states); resume "
                                  "from the state as state_dict() returned it")
        if version >= 2 and state.get("location") != mine["location"]:
            raise InvalidArgument(f"{where}: the state was saved for another dataset, "
                                  f"{state.get('location')!r}, not {mine['location']!r}")
        if (state.get("samples"), state.get("fingerprint")) != (mine["samples"], mine["fingerprint"]):
            raise InvalidArgument(
                f"{where}: the state was saved for another dataset ({state.get('samples')} "
                f"samples; this one has {mine['samples']}, or its shards changed)")
        if version >= 2 and state.get("identity") != mine["identity"]:
            raise InvalidArgument(
                f"{where}: the state was saved for another dataset with the same shards, sizes "
                f"and sample counts ({mine['location']}): a shard's etag or sample table differs "
                "(the dataset was regenerated or replaced since the state was saved; or this "
                "node's dataset catalog predates the change: open with catalog=False)")
        if state.get("shuffle") != self.shuffle:
            raise InvalidArgument(f"{where}: the state was saved with shuffle="
                                  f"{state.get('shuffle')}, this dataset has shuffle={self.shuffle}")
        adopt = None
        if self.shuffle and window != mine["window"]:
            if self.shuffle_window:
                raise InvalidArgument(
                    f"{where}: the state was saved with shuffle window {window}, this dataset "
                    f"uses {mine['window']}")
            if version == 1:  # no digest: its window cannot be told from an edited one
                raise InvalidArgument(
                    f"{where}: the version 1 state names shuffle window {window}, this dataset "
                    f"uses {mine['window']}: pass shuffle_window={window} if the state is as "
                    "it was saved")
            adopt = window  # an automatic window follows the state
        if version == 1:
            _note_once(f"sluice: {where}: resuming from a version 1 state, which names the "
                       "dataset's layout but not its content: a state of a dataset regenerated "
                       "with the same layout cannot be told from one of this dataset")
        if adopt is not None:
            self.shuffle_window = adopt
        self.epoch, self._start = epoch, start
        self._worker_batches, self._iter_layout = worker_batches, layout


def _digest(state: dict, where: str) -> str:
    """The digest a sealed state carries: BLAKE2b-128 of its other fields as canonical
    JSON (sorted keys; lists and tuples alike)."""
    fields = {k: v for k, v in state.items() if k != "digest"}
    try:
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{where}: not a sluice StreamingDataset state: {e}") from None
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _sealed(state: dict) -> dict:
    """The state with its digest (see load_state_dict)."""
    state["digest"] = _digest(state, state["uri"])
    return state


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` over a :class:`StreamingDataset` that counts the
    samples it hands to the training loop, so :meth:`state_dict` is the exact place to
    resume from, for any number of ranks and workers after it. It sets the dataset's
    ``batch_size`` to its own and advances the dataset's epoch after each full pass."""

    def __init__(self, dataset: StreamingDataset, batch_size: int = 1, **kwargs: Any) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise InvalidArgument("sluice.data.DataLoader reads a sluice.data.StreamingDataset, "
                                  f"not a {type(dataset).__name__}")
        if kwargs.get("shuffle"):
            raise InvalidArgument("shuffle is the dataset's (StreamingDataset(shuffle=True))")
        if kwargs.get("drop_last"):
            raise InvalidArgument("drop_last would drop samples the count says were taken")
        batch_size = check_int(batch_size, "sluice.data.DataLoader: batch_size (a count of "
                               "samples: the count of what was taken needs batches)", lo=1)
        if kwargs.get("persistent_workers"):
            raise InvalidArgument("persistent_workers: workers that outlive a pass keep their own "
                                  "place, which a resume or a new epoch cannot reach")
        if kwargs.get("in_order") is False:
            raise InvalidArgument("in_order=False hands batches out of the rank's order, which "
                                  "the count of what was taken relies on")
        dataset.batch_size = batch_size
        self._sluice_batch_size = batch_size
        # With workers and the default collation, each worker makes whole batches, and
        # hands those of large samples to the main process in a shared-memory buffer
        # (_SharedSlots) instead of pickling every sample's bytes through a pipe: 1.1 s against
        # 1.8 s for a GiB of 100 KiB samples with 4 workers on 2 cores. torch's loader then
        # takes the workers' batches as they are (its batch_size None); batch_size still
        # says the batch size.
        # Without workers the batches are collated by the same function (_collated) as
        # the workers' whole batches: torch's default collation would take the first
        # sample's fields for the batch's, dropping a field the first sample lacks.
        self._whole_batches = (kwargs.get("num_workers", 0) > 0
                               and kwargs.get("collate_fn") is None)
        if kwargs.get("collate_fn") is None and not self._whole_batches:
            kwargs["collate_fn"] = _collate_samples
        super().__init__(dataset, batch_size=None if self._whole_batches else batch_size,
                         **kwargs)
        self._taken = 0  # samples of this epoch handed out (from the dataset's start)

    @property  # type: ignore[override]
    def batch_size(self) -> int:
        return self._sluice_batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        pass  # torch's own setting (None when batches come packed); ours is fixed at init

    def __iter__(self) -> Iterator[Any]:
        ds: StreamingDataset = self.dataset  # type: ignore[assignment]
        start, epoch = ds._start, ds.epoch
        self._taken = 0
        ds._worker_batches, ds._iter_layout = 0, None  # this count is the one that holds
        rank, world = ds._layout()[:2]
        ds._whole_batches = self._whole_batches
        try:
            batches = super().__iter__()  # the workers start here, with their copy of ds
        finally:
            ds._whole_batches = False
        held: dict = {}  # the workers' shared buffers (see _SharedSlots)
        for batch in batches:
            if isinstance(batch, _Packed):
                batch = batch.unpack(self.pin_memory and torch.cuda.is_available(), held)
            elif isinstance(batch, _Samples):
                batch = batch.unpack(self.pin_memory and torch.cuda.is_available())
            self._taken += _batch_len(batch)
            # Where the next sample of this rank's stream is, job-wide (lockstep).
            pos = start + world * self._taken
            if pos >= ds.samples:
                ds.epoch, ds._start = epoch + 1, 0
            else:
                ds.epoch, ds._start = epoch, pos
            yield batch
        ds.epoch, ds._start = epoch + 1, 0
        ds._worker_batches = 0

    def state_dict(self) -> dict:
        """The exact place to resume from: the epoch and the job-wide position in it."""
        ds: StreamingDataset = self.dataset  # type: ignore[assignment]
        return _sealed({"version": _STATE_VERSION, "uri": ds.uri, "seed": ds.seed,
                        **ds._identity(), "epoch": ds.epoch, "position": ds._start})

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict) and "__key__" in batch:
        return len(batch["__key__"])
    if isinstance(batch, (list, tuple)):
        return len(batch)
    raise InvalidArgument("sluice.data.DataLoader: cannot count the samples of a batch of type "
                          f"{type(batch).__name__} (a collate_fn should return a dict with "
                          "__key__, or a list)")


def _memfd(name: str, n: int) -> tuple[int, mmap.mmap]:
    """A new anonymous shared-memory file of n bytes, mapped: (its descriptor, the map)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, n)
        return fd, mmap.mmap(fd, n)
    except BaseException:
        os.close(fd)
        raise


class _SharedSlots:
    """A DataLoader worker's shared-memory buffers for packed batches, used again and
    again. A fresh buffer a batch cost more than the batch's copies: creating and zeroing
    it, faulting its pages in on both sides, unmapping it on both sides (about a quarter of
    the CPU of a warm epoch of 100 KiB samples, 4 workers, 2 cores).

    Each slot is a memfd of this worker's. A batch crosses to the main process as the
    slot's number, descriptor and size (a few bytes pickled); the main process opens the
    slot through /proc/<worker>/fd when the batch arrives and maps it the first time,
    keeping the map for the pass (`_Packed`).
    Not torch's shared tensors: with the file_system sharing strategy each worker's first
    one started a torch_shm_manager process, which loads libtorch (about a tenth of the
    CPU of a cold epoch, 4 workers, 2 cores), and with file_descriptor every batch sent a
    descriptor through a socket of its own.

    A slot is busy from `take` until the main process has copied the batch out of it and
    cleared the slot's byte in `busy` (a memfd too). When every slot is busy a batch gets
    a buffer of its own, pickled with the batch. The descriptors stay open until the worker
    exits (torch's workers do not outlive a pass), not only until this object goes: the main
    process opens a slot when the batch arrives, which may be after the worker's pass is
    over (its last batches still in the pipe)."""

    _MAX = 8  # slots: the batches in flight (prefetch_factor) and a few more

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.id = f"{self.pid}-{id(self)}"
        self.busy_fd, self._busy_map = _memfd("sluice-busy", self._MAX)
        self.busy = memoryview(self._busy_map)
        self.slots: list = []  # (generation, descriptor, size, map) per slot
        self._made = 0  # slots made, each a generation of its own

    def close(self) -> None:
        """Closes the slots' descriptors. Not for a worker's pass (see above): for a
        process that makes slots and outlives them, such as a test."""
        self.busy.release()
        for _, fd, _, _ in self.slots:
            os.close(fd)
        os.close(self.busy_fd)
        self.slots = []

    def _make(self, n: int) -> tuple:
        self._made += 1
        fd, mm = _memfd("sluice-batch", n)
        return (self._made, fd, n, mm)

    def take(self, n: int, taken: list) -> Any:
        """A writable buffer of at least n bytes; appends (slot, where) to `taken`: where
        the main process finds the slot, (generation, descriptor, size), or for slot -1 a
        buffer of its own (a bytearray, pickled with the batch)."""
        free = [i for i in range(len(self.slots)) if not self.busy[i]]
        fits = [i for i in free if self.slots[i][2] >= n]
        if fits:
            slot = fits[0]
        elif len(self.slots) < self._MAX or free:
            # a new slot, or a free one too small made again a quarter larger than asked
            slot = free[0] if free else len(self.slots)
            made = self._make(max(n + n // 4, 1 << 16))
            if slot == len(self.slots):
                self.slots.append(made)
            else:
                os.close(self.slots[slot][1])
                self.slots[slot] = made
        else:
            own = bytearray(n)
            taken.append((-1, own))
            return own
        self.busy[slot] = 1
        generation, fd, size, mm = self.slots[slot]
        taken.append((slot, (generation, fd, size)))
        return mm


def _open_worker_fd(pid: int, fd: int, flags: int) -> int:
    """A DataLoader worker's descriptor opened here, through /proc."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError as e:
        raise Unavailable(f"{path}: cannot open a DataLoader worker's batch buffer: "
                          f"{e.strerror}") from e


class _Packed:
    """A batch from a DataLoader worker: its samples' bytes back to back in one of the
    worker's `_SharedSlots` (or, when they were all busy, in a buffer pickled with it), and
    where each sample's fields lie in it.

    The main process opens the worker's slot and busy bytes as soon as it unpickles the
    batch: the worker is alive then (torch tells a worker to exit only once its end of pass
    has come, which follows its batches on the same queue), and may not be by `unpack`,
    when torch kept the batch back for the order."""

    def __init__(self, slots: _SharedSlots, slot: int, where: Any, records: list) -> None:
        self.pool, self.pid, self.busy_fd, self.slot = slots.id, slots.pid, slots.busy_fd, slot
        self.where = where  # (generation, descriptor, size), or the bytes for slot -1
        self.records = records  # (key, index, ((field, offset, length), ...)) per sample
        self._opened: Any = None  # (data, busy) descriptors of this process, or the error

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_opened"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    def __del__(self) -> None:
        self._close()

    def _open(self) -> None:
        if self.slot < 0 or self._opened is not None:
            return
        try:
            data = _open_worker_fd(self.pid, self.where[1], os.O_RDONLY)
            try:
                busy = _open_worker_fd(self.pid, self.busy_fd, os.O_RDWR)
            except Unavailable:
                os.close(data)
                raise
            self._opened = (data, busy)
        except Unavailable as e:
            self._opened = e  # raised by unpack: an unpickling error would be torch's to report

    def _close(self) -> None:
        opened, self._opened = getattr(self, "_opened", None), None
        if isinstance(opened, tuple):
            for fd in opened:
                os.close(fd)

    def unpack(self, pin_memory: bool = False, held: dict | None = None) -> dict:
        """The collated batch; the slot is free again when this returns. `held` keeps the
        worker's buffers mapped here, for its next batches in them."""
        held = {} if held is None else held
        busy = None
        if self.slot < 0:
            data = self.where
        else:
            self._open()
            try:
                if isinstance(self._opened, Exception):
                    raise self._opened
                generation, _, size = self.where
                mine = held.get((self.pool, self.slot))
                if mine is None or mine[0] != generation:  # a slot made again: mapped again
                    mine = held[self.pool, self.slot] = (
                        generation, mmap.mmap(self._opened[0], size, prot=mmap.PROT_READ))
                data = mine[1]
                busy = held.get((self.pool, "busy"))
                if busy is None:
                    busy = held[self.pool, "busy"] = mmap.mmap(self._opened[1], _SharedSlots._MAX)
            finally:
                self._close()
        view = memoryview(data)
        try:
            return _collated([(key, index, {name: bytes(view[at:at + length])
                                            for name, at, length in fields})
                              for key, index, fields in self.records], pin_memory)
        finally:
            view.release()
            # The copies above are done (bytes() returned) before this store frees the slot
            # for the worker's next write: program order on x86 (TSO). On weaker memory
            # models (aarch64) only the interpreter's work between them keeps the store
            # after the loads; a release fence from _core would make it certain.
            if busy is not None:
                busy[self.slot] = 0


class _Samples:
    """A batch of small samples from a DataLoader worker, pickled as they are."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def unpack(self, pin_memory: bool = False) -> dict:
        return _collated([(s.pop("__key__"), s.pop("__index__"), s) for s in self.samples],
                         pin_memory)


def _collate_samples(samples: list) -> dict:
    """The DataLoader's collation without workers: WebDataset-style sample dicts, as
    :func:`_collated` makes batches of them (torch pins the result with ``pin_memory``)."""
    return _collated([(s["__key__"], s["__index__"],
                       {k: v for k, v in s.items() if k not in ("__key__", "__index__")})
                      for s in samples], False)


def _collated(samples: list, pin_memory: bool) -> dict:
    """What torch's default collation makes of (key, index, {field: bytes}) samples:
    ``__key__`` a list, ``__index__`` a tensor (pinned with ``pin_memory``), one list of
    ``bytes`` per field, which every sample must have."""
    first_key, _, first = samples[0]
    index = torch.tensor([s[1] for s in samples])
    batch: dict = {"__key__": [s[0] for s in samples],
                   "__index__": index.pin_memory() if pin_memory else index}
    for name in first:
        batch[name] = []
    for key, _, fields in samples:
        if fields.keys() != first.keys():
            raise InvalidArgument(
                f"sample '{key}' has the fields {sorted(fields)} and sample '{first_key}' of "
                f"the same batch {sorted(first)}: the default collation needs the same "
                "fields in every sample of a batch (pass a collate_fn)")
        for name, value in fields.items():
            batch[name].append(value)
    return batch
