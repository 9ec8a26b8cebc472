"""torch.distributed.checkpoint through sluice: ``dcp.save``, ``dcp.async_save`` and
``dcp.load`` write to and read from a sluice checkpoint series, with its tiers, atomic
commit (a step exists whole, on a tier, or not at all) and per-chunk checksums, and restore
from the nearest intact copy.

    import torch.distributed.checkpoint as dcp
    from sluice.dcp import Writer, Reader
    dcp.save(state, storage_writer=Writer("llama", step=100, tiers=["/nvme/ckpt", "s3://b/ckpt"]))
    dcp.load(state, storage_reader=Reader("llama", tiers=[...]))   # the newest intact step

Each rank's items are one shard of the step (tensor bytes as they are, BYTE_IO items as
bytes); the coordinator's shard also holds DCP's Metadata, pickled by DCP's rules as its
own FileSystemWriter does. Every rank stages its shard in write_data; the coordinator saves
its own in finish, after every rank's results are in, and the step commits once every
rank's shard is durable on each required tier. ``sluice ckpt ls/verify/restore`` see these
steps like any other.
"""

from __future__ import annotations

import io
import pickle
import threading
import time
from torch.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner,
                                                  SavePlan, SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from ._buffers import host_memory
from .checkpoint import Checkpointer, _dtype_name, _host_bytes
from .errors import InvalidArgument, IoError, NotFound

__all__ = ["Writer", "Reader"]

METADATA = "__dcp_metadata__"


def _item_name(index: MetadataIndex) -> str:
    offset = ",".join(str(o) for o in index.offset) if index.offset is not None else ""
    return f"{index.fqn}|{offset}|{'' if index.index is None else index.index}"


def _step_of(checkpoint_id: Any) -> int | None:
    if checkpoint_id is None:
        return None
    text = str(checkpoint_id)
    if not text.isdigit():
        raise InvalidArgument(f"checkpoint_id {text!r} is not a step number")
    return int(text)


class _Series:
    """The series a Writer or Reader works on: a Checkpointer given, or one opened on first
    use (in the process that uses it) from the series name, tiers and options."""

    def __init__(self, series: str | Checkpointer, step: int | None, tiers: list[Any] | None,
                 options: dict) -> None:
        self._series, self._tiers, self._opts = series, tiers, options
        self._ck: Checkpointer | None = series if isinstance(series, Checkpointer) else None
        self.step = step

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
                owner, memory = _host_bytes(data)
                keep.append(owner)
                size = memory[1]
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
        ck._cp.restore(self.step, [(METADATA, 0, doc)])
        return pickle.loads(bytes(doc))

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
        # checked, from the nearest intact tier.
        wanted: dict[tuple[str, int], Any] = {}
        for item in plan.items:
            info = self._storage[item.storage_index]
            key = (info["name"], info["rank"])
            if key not in wanted:
                entry = self._entries.get(key)
                if entry is None:
                    raise NotFound(f"{info['name']} (rank {info['rank']}) is not in step "
                                   f"{self.step}")
                if item.type == LoadItemType.BYTE_IO:
                    wanted[key] = bytearray(entry["bytes"])
                else:
                    dtype = getattr(torch, entry["dtype"])
                    wanted[key] = torch.empty(entry["shape"], dtype=dtype)
        dests = []
        for (name, rank), buf in wanted.items():
            dests.append((name, rank, host_memory(buf, name)))
        ck._cp.restore(self.step, dests)
        for item in plan.items:
            info = self._storage[item.storage_index]
            buf = wanted[(info["name"], info["rank"])]
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(bytes(buf)))
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
