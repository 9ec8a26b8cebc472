"""torch.distributed.checkpoint through sluice: ``dcp.save``, ``dcp.async_save`` and
``dcp.load`` write to and read from a sluice checkpoint series, with its tiers, atomic
commit (a step exists whole, on a tier, or not at all) and per-chunk checksums, and restore
from the nearest intact copy.

    import torch.distributed.checkpoint as dcp
    from sluice.dcp import Writer, Reader
    dcp.save(state, storage_writer=Writer("llama", step=100, tiers=["/nvme/ckpt", "s3://b/ckpt"]))
    dcp.load(state, storage_reader=Reader("llama", tiers=[...]))   # the newest intact step

Each rank's items are one shard of the step (tensor bytes as they are, BYTE_IO items as
bytes); the coordinator's shard also holds DCP's Metadata, pickled as DCP's own
FileSystemWriter does. Every rank stages its shard in write_data; the coordinator saves
its own in finish, after every rank's results are in, and the step commits once every
rank's shard is durable on each required tier. ``sluice ckpt ls/verify/restore`` see these
steps like any other.

Loading runs no code from the tier (docs/python.md, "What loading from a shared tier
trusts"). The Reader decodes the Metadata with an unpickler that admits only DCP's
metadata classes and the torch values they hold (torch.Size, dtypes, layouts); it decodes
each BYTE_IO item with ``torch.load(weights_only=True)`` and hands DCP's planner (which
loads them with weights_only=False) only bytes it saved again itself. Anything else is
Corruption naming the step and the tier. A tensor is filled with the dtype it was saved as:
a target of another dtype is InvalidArgument, never a silent cast.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import threading
import time
from torch.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner,
                                                  SavePlan, SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from ._args import check_int
from ._buffers import host_memory
from .checkpoint import Checkpointer, _check_numbers, _dtype_name, _host_bytes, _check_strided
from .errors import Corruption, InvalidArgument, IoError, NotFound

__all__ = ["Writer", "Reader"]

METADATA = "__dcp_metadata__"

# What DCP's Metadata pickles as: its dataclasses (and the enum TensorProperties pickles its
# memory format as), torch.Size, torch's dtypes (globals of the module torch, by name) and
# layouts (a call of torch.serialization._get_layout with the layout's name).
_METADATA_CLASSES = frozenset({
    "Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"})


def _layout(name: str) -> torch.layout:
    """torch's layout named ``name`` ("torch.strided"): what a pickled layout calls."""
    for value in vars(torch).values():
        if isinstance(value, torch.layout) and str(value) == name:
            return value
    raise pickle.UnpicklingError(f"{name!r} is not a layout of torch")


class _MetadataUnpickler(pickle._Unpickler):  # the Python one: its BUILD can be checked
    """Unpickles DCP's Metadata and nothing else: no global outside DCP's metadata classes
    and torch's plain values is ever looked up, so a crafted pickle calls nothing but
    those classes' constructors, torch.Size and a lookup of a layout by name. BUILD (setting
    an object's state) is admitted only on an instance of one of DCP's metadata dataclasses,
    each made by this load: never on a class, an enum member, torch.Size or a dtype, which
    are shared by the whole process."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__ and name in _METADATA_CLASSES:
            found = vars(dcp_metadata).get(name)
            if isinstance(found, type):
                return found
        if module == "torch":
            found = vars(torch).get(name)  # vars(): no lazy import behind torch.__getattr__
            if found is torch.Size or isinstance(
                    found, (torch.dtype, torch.layout, torch.memory_format)):
                return found
        if (module, name) == ("torch.serialization", "_get_layout"):
            return _layout
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not part of DCP's "
                                     "metadata")

    def load_build(self) -> None:
        target = self.stack[-2] if len(self.stack) >= 2 else None  # [-1]: the state
        if (target is None or isinstance(target, type) or not dataclasses.is_dataclass(target)
                or type(target).__module__ != dcp_metadata.__name__):
            raise pickle.UnpicklingError(
                f"it sets the state of a {type(target).__name__}, which only DCP's metadata "
                "dataclasses may have set")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def _decode_metadata(doc: bytes) -> Metadata:
    """DCP's Metadata from the bytes a Writer saved, with no code run and no state of the
    process changed; ValueError (or what the unpickler raises) for anything else."""
    metadata = _MetadataUnpickler(io.BytesIO(doc)).load()
    if not isinstance(metadata, Metadata):
        raise ValueError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    kinds = (dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata)
    if not isinstance(metadata.state_dict_metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, kinds)
            for k, v in metadata.state_dict_metadata.items()):
        raise ValueError("its state_dict_metadata is not a dict of DCP's storage metadata")
    storage = metadata.storage_data
    if not isinstance(storage, dict) or not all(
            isinstance(k, MetadataIndex) and isinstance(v, dict)
            and isinstance(v.get("name"), str) and type(v.get("rank")) is int
            for k, v in storage.items()):
        raise ValueError("its storage_data is not what sluice.dcp.Writer writes")
    return metadata


def _item_name(index: MetadataIndex) -> str:
    offset = ",".join(str(o) for o in index.offset) if index.offset is not None else ""
    return f"{index.fqn}|{offset}|{'' if index.index is None else index.index}"


def _step_of(checkpoint_id: Any) -> int | None:
    if checkpoint_id is None:
        return None
    text = str(checkpoint_id)
    if not text.isascii() or not text.isdigit():
        raise InvalidArgument(f"checkpoint_id {text!r} is not a step number")
    return check_int(int(text), "checkpoint_id")


def _safe_bytes(raw: bytes, where: str) -> io.BytesIO:
    """A BYTE_IO item (a value DCP saved with torch.save) as bytes that DCP's planner may
    torch.load, as it does, with weights_only=False: decoded here with weights_only=True
    (torch's unpickler of tensors, plain values, containers and the classes admitted with
    torch.serialization.add_safe_globals), which runs no code, and saved again. Corruption
    naming ``where`` for anything else."""
    try:
        value = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as e:  # the cause, whatever the bytes made torch.load raise
        raise Corruption(f"{where}: refused the saved value, which torch.load(weights_only="
                         "True) does not admit (a class of yours may be admitted with "
                         f"torch.serialization.add_safe_globals): {_load_cause(e)}") from None
    out = io.BytesIO()
    try:
        torch.save(value, out)
    except Exception as e:  # a value torch.load admits but cannot be saved again (too deep)
        raise Corruption(f"{where}: refused the saved value, which cannot be saved again "
                         f"({type(e).__name__})") from None
    out.seek(0)
    return out


def _load_cause(e: Exception) -> str:
    """The cause in torch.load's error, without its advice to load again with
    weights_only=False (which runs what the bytes name)."""
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    lines = [ln.strip() for ln in str(e).splitlines()
             if ln.strip() and not ln.strip().startswith(boilerplate)]
    return f"{type(e).__name__}: {' '.join(lines)}" if lines else type(e).__name__


class _Series:
    """The series a Writer or Reader works on: a Checkpointer given, or one opened on first
    use (in the process that uses it) from the series name, tiers and options. The step and
    the options' numbers are checked here, where the caller gave them."""

    def __init__(self, series: str | Checkpointer, step: int | None, tiers: list[Any] | None,
                 options: dict) -> None:
        _check_numbers(options.get("rank"), options.get("world_size"), options.get("staging"),
                       options.get("keep_last", 0))
        self._series, self._tiers, self._opts = series, tiers, options
        self._ck: Checkpointer | None = series if isinstance(series, Checkpointer) else None
        self.step = None if step is None else check_int(step, "step")

    def _checkpointer(self) -> Checkpointer:
        if self._ck is None:
            self._ck = Checkpointer(str(self._series), self._tiers, **self._opts)
        return self._ck

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return str(checkpoint_id).isdigit()


class Writer(_Series, StorageWriter):
    """Writes a DCP checkpoint as step ``step`` (or the checkpoint_id dcp.save is given) of
    a sluice series; see the module's text."""

    def __init__(self, series: str | Checkpointer, step: int | None = None,
                 tiers: list[Any] | None = None, **checkpointer_options: Any) -> None:
        _Series.__init__(self, series, step, tiers, checkpointer_options)
        self._coordinator = False
        # The coordinator's items, saved in finish: (tensors, the objects their memory is in).
        self._held: tuple[list, list] = ([], [])

    def reset(self, checkpoint_id: Any = None) -> None:
        step = _step_of(checkpoint_id)
        if step is not None:
            self.step = step
        self._held = ([], [])

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._coordinator = is_coordinator
        if self.step is None:
            raise InvalidArgument("sluice.dcp.Writer: no step (give step= or checkpoint_id=)")
        self._checkpointer()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        tensors, results, keep = [], [], []
        assert self._ck is not None
        for item in plan.items:
            data = planner.resolve_data(item)
            name = _item_name(item.index)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                keep.append(raw)
                tensors.append((name, "uint8", [len(raw)], raw))
                size = len(raw)
            else:
                _check_strided(data, f"{item.index.fqn} (DCP)")
                owner, memory = _host_bytes(data)
                keep.append(owner)
                size = owner.numel() * owner.element_size()
                tensors.append((name, _dtype_name(owner), list(owner.shape), memory))
            results.append(WriteResult(index=item.index, size_in_bytes=size,
                                       storage_data={"name": name, "rank": self._ck.rank}))
        fut: Future = Future()
        if self._coordinator:
            self._held = (tensors, keep)
            fut.set_result(results)
            return fut
        # Staged now; the step commits once rank 0 saved its own shard in finish, so this
        # rank waits only until its shard is written to the first tier (or failed there).
        handle = self._ck._cp.save(self.step, tensors)

        def written() -> None:
            while True:
                p = handle.progress()
                tier = p["tiers"][0] if p["tiers"] else None
                if tier and tier["state"] == "failed":
                    fut.set_exception(IoError(f"rank {self._ck.rank}'s shard of step {self.step} "
                                              f"on {tier['tier']}: {tier['error']}"))
                    return
                if tier and (tier["state"] == "committed" or
                             tier["bytes_done"] >= p["bytes_total"]):
                    fut.set_result(results)
                    return
                time.sleep(0.005)

        threading.Thread(target=written, name="sluice-dcp-written", daemon=True).start()
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        assert self._ck is not None
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        doc = pickle.dumps(metadata)
        tensors, _keep = self._held
        self._ck._cp.save(self.step, tensors + [(METADATA, "uint8", [len(doc)], doc)]).wait()
        self._held = ([], [])


class Reader(_Series, StorageReader):
    """Reads a DCP checkpoint from a sluice series: ``step`` (or the checkpoint_id
    dcp.load is given), else the newest intact step."""

    def __init__(self, series: str | Checkpointer, step: int | None = None,
                 tiers: list[Any] | None = None, **checkpointer_options: Any) -> None:
        _Series.__init__(self, series, step, tiers, checkpointer_options)
        self._asked = step  # None: the newest intact step, found again at each load
        self._entries: dict[tuple[str, int], dict] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        step = _step_of(checkpoint_id)
        self.step = step if step is not None else self._asked
        self._entries = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        ck = self._checkpointer()
        if self.step is None:
            self.step = ck.latest()
        self._entries = {(e["name"], e["rank"]): e for e in ck._cp.manifest(self.step)}
        meta = self._entries.get((METADATA, 0))
        if meta is None:
            raise NotFound(f"step {self.step} of series {ck.series} was not saved through "
                           "torch.distributed.checkpoint (no DCP metadata)")
        doc = bytearray(meta["bytes"])
        report = ck._cp.restore(self.step, [(METADATA, 0, doc)])
        try:
            return _decode_metadata(bytes(doc))
        except Exception as e:  # whatever the bytes made the unpickler raise: the cause
            raise Corruption(f"step {self.step} of series {ck.series} on "
                             f"{ck._tier_read(report)}: refused its DCP metadata, which is not "
                             f"what sluice.dcp.Writer writes ({type(e).__name__}: {e})") from None

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._storage = metadata.storage_data
        if not self._entries:
            self._entries = {(e["name"], e["rank"]): e
                             for e in self._checkpointer()._cp.manifest(self.step)}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        ck = self._checkpointer()
        # Each saved item once (several read items may take parts of one), every chunk
        # checked, from the nearest intact tier. Every target is checked before anything is
        # read: a tensor is filled with the dtype it was saved as, never cast.
        wanted: dict[tuple[str, int], Any] = {}
        for item in plan.items:
            info = self._storage[item.storage_index]
            key = (info["name"], info["rank"])
            entry = self._entries.get(key)
            if entry is None:
                raise NotFound(f"{info['name']} (rank {info['rank']}) is not in step "
                               f"{self.step}")
            if item.type == LoadItemType.BYTE_IO:
                if key not in wanted:
                    wanted[key] = bytearray(entry["bytes"])
                continue
            dtype = vars(torch).get(entry["dtype"])  # vars(): no lazy import by a crafted name
            if not isinstance(dtype, torch.dtype):
                raise Corruption(f"{item.storage_index.fqn}: step {self.step} of series "
                                 f"{ck.series} names dtype {entry['dtype']!r}, which is not "
                                 "one of torch's")
            target = planner.resolve_tensor(item)
            if target.dtype != dtype:
                raise InvalidArgument(
                    f"{item.storage_index.fqn}: saved as {entry['dtype']}, the tensor to fill "
                    f"is {_dtype_name(target)} (sluice does not cast: convert it after load)")
            shape, offsets, lengths = entry["shape"], item.storage_offsets, item.lengths
            if list(target.shape) != list(lengths) or len(shape) != len(lengths) or any(
                    o < 0 or o + n > d for o, n, d in zip(offsets, lengths, shape)):
                raise Corruption(f"{item.storage_index.fqn}: step {self.step} of series "
                                 f"{ck.series} holds it as {shape}, which has no part "
                                 f"{list(lengths)} at {list(offsets)}")
            if key not in wanted:
                wanted[key] = torch.empty(entry["shape"], dtype=dtype)
        dests = []
        for (name, rank), buf in wanted.items():
            dests.append((name, rank, host_memory(buf, name)))
        report = ck._cp.restore(self.step, dests)
        for item in plan.items:
            info = self._storage[item.storage_index]
            buf = wanted[(info["name"], info["rank"])]
            if item.type == LoadItemType.BYTE_IO:
                where = (f"{item.storage_index.fqn}: step {self.step} of series {ck.series} "
                         f"on {ck._tier_read(report)}")
                planner.load_bytes(item, _safe_bytes(bytes(buf), where))
                continue
            src = buf
            for dim, (off, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                src = src.narrow(dim, off, n)
            target = planner.resolve_tensor(item).detach()
            target.copy_(src)
            planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut
