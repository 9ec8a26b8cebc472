"""Checkpoints from a training loop: asynchronous, tiered, verified.

    ckpt = sluice.checkpoint.Checkpointer("llama", tiers=["/nvme/ckpt", "s3://bucket/ckpt"])
    handle = ckpt.async_save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                                    "step": step})
    handle.staged.result()       # the tensors may change from here on
    ...
    handle.committed.result()    # every required tier is durable
    state = ckpt.load("latest", into={"model": model.state_dict(), ...})

A state is nested dicts, lists and tuples (at most ``MAX_DEPTH`` deep) of torch tensors
(dense: not sparse), numpy arrays (any dtype that numpy's .npy format describes, Python
objects excepted) and plain values (None, bools, ints, floats, strings). Tensor bytes, of
a conjugate or negative view the values it shows, are copied from their memory into the
checkpointer's staging memory and written to the first tier, then copied to the later ones;
they are never pickled. The structure and plain values are saved beside them as JSON, so
nothing in a checkpoint runs code when it is loaded. Every chunk read back is checked
against its checksum, and a missing or damaged chunk is read from the next tier
(docs/ckpt.md). Checkpoints saved here are listed, verified and restored by ``sluice ckpt``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import uuid
import warnings
from typing import Any

from . import _core
from ._args import U32_MAX, check_int, check_optional_int
from ._buffers import host_memory, is_tensor
from ._session import Session, connect
from .errors import Corruption, InvalidArgument, NotFound

__all__ = ["Checkpointer", "AsyncSave", "MAX_DEPTH"]

STATE_NAME = "__sluice_state__"  # the structure and plain values of a rank's state, JSON
_FORMAT = 1
# How deep a state may nest (dicts, lists and tuples in one another). Real states are a few
# levels deep; the limit keeps a runaway (or self-containing) state an InvalidArgument rather
# than a RecursionError, here and in the JSON coder (about 3 of its levels per state level).
MAX_DEPTH = 100


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape")


def _dtype_name(x: Any) -> str:
    if is_tensor(x):
        return str(x.dtype).removeprefix("torch.")
    return str(x.dtype)


class _Flattened:
    """A state split into its tensors (name, leaf) and a JSON skeleton naming them."""

    def __init__(self) -> None:
        self.tensors: list[tuple[str, Any]] = []
        self._names: set[str] = set()

    def name_for(self, path: list[str]) -> str:
        base = "/".join(path) or "tensor"
        name, n = base, 1
        while name in self._names or name == STATE_NAME:
            name, n = f"{base}#{n}", n + 1
        self._names.add(name)
        return name

    def walk(self, x: Any, path: list[str]) -> Any:
        if len(path) > MAX_DEPTH:
            raise InvalidArgument(f"{'/'.join(path[:3])}/...: the state nests deeper than "
                                  f"{MAX_DEPTH} levels (sluice.checkpoint.MAX_DEPTH), or "
                                  "contains itself")
        if is_tensor(x) or _is_numpy(x):
            where = "/".join(path) or "the state"
            name = self.name_for(path)
            self.tensors.append((name, x))
            leaf = {"kind": "torch" if is_tensor(x) else "numpy", "name": name,
                    "dtype": _dtype_name(x), "shape": list(x.shape)}
            if is_tensor(x):
                _check_strided(x, where)
                leaf["device"] = str(x.device)
                leaf["requires_grad"] = bool(x.requires_grad)
            else:
                leaf["descr"] = _numpy_descr(x.dtype, where)
            return {"t": leaf}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"v": x}
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise InvalidArgument(f"{'/'.join(path) or 'the state'}: a key of type "
                                          f"{type(k).__name__} cannot be saved (str and int only)")
                items.append([k, self.walk(v, path + [str(k)])])
            return {"d": items}
        if isinstance(x, (list, tuple)):
            out = [self.walk(v, path + [str(i)]) for i, v in enumerate(x)]
            return {"l": out} if isinstance(x, list) else {"u": out}
        raise InvalidArgument(f"{'/'.join(path) or 'the state'}: a value of type "
                              f"{type(x).__name__} cannot be saved (tensors, numpy arrays, "
                              "dicts, lists, tuples and plain values only)")


def _check_strided(t: Any, where: str) -> None:
    """InvalidArgument naming ``where`` unless ``t`` is a strided (dense) tensor: a sparse
    tensor's bytes are not one range of values, and are not saved as if they were."""
    import torch

    if t.layout != torch.strided:
        raise InvalidArgument(f"{where}: a tensor of layout {t.layout} cannot be saved or "
                              "filled (only dense tensors are; call .to_dense() first)")


def _numpy_descr(dtype: Any, where: str) -> Any:
    """``dtype`` as numpy's .npy format writes it (a JSON value), checked to load back as
    the same dtype; InvalidArgument naming ``where`` for one that would not (Python objects,
    field titles, user-defined dtypes), so that nothing unloadable is ever committed."""
    from numpy.lib.format import descr_to_dtype, dtype_to_descr

    if dtype.hasobject:
        raise InvalidArgument(f"{where}: a numpy array of Python objects cannot be saved "
                              f"(dtype {dtype}; its values would need pickling)")
    try:
        with warnings.catch_warnings():  # a dtype's metadata is not kept: numpy warns
            warnings.simplefilter("ignore")
            descr = json.loads(json.dumps(dtype_to_descr(dtype)))
        back = descr_to_dtype(descr)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{where}: numpy dtype {dtype} cannot be saved ({e})") from None
    if back != dtype or back.itemsize != dtype.itemsize:
        raise InvalidArgument(f"{where}: numpy dtype {dtype} cannot be saved (it would load "
                              f"as {back})")
    return descr


def _host_bytes(x: Any) -> tuple[Any, Any]:
    """(keep-alive, memory) of a leaf's bytes in host memory, contiguous. A conjugate or
    negative view is resolved first: its memory holds the values before conj() or neg()."""
    if is_tensor(x):
        t = x.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        return t, host_memory(t, "save")
    import numpy as np

    a = np.ascontiguousarray(x)
    return a, a.reshape(-1).view(np.uint8) if a.size else bytearray()


class AsyncSave:
    """An asynchronous save: ``staged`` resolves when the tensors may be changed (their
    bytes are in the staging memory), ``committed`` when every required tier is durable
    (or with the error that stopped it)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.staged: concurrent.futures.Future = concurrent.futures.Future()
        self.committed: concurrent.futures.Future = concurrent.futures.Future()
        self._handle: Any = None

    def progress(self) -> dict | None:
        """Bytes staged, and each tier's state and bytes written (None before staging)."""
        return self._handle.progress() if self._handle is not None else None

    def wait(self, timeout: float | None = None) -> None:
        """Waits until committed; raises what stopped it."""
        self.committed.result(timeout)


class Checkpointer:
    """Checkpoints of one series on tiers, nearest first (local paths, s3://bucket/prefix,
    sluiced:// peers; none: $SLUICE_HOME/ckpt). A save commits once every required tier is
    durable (``require_all=False``: only the first); ``keep_last`` keeps that many committed
    steps on each tier (0: all). With several ranks (``torch.distributed``, or rank/world_size
    given), each rank saves its own state and rank 0 commits the step once every rank's is
    there. ``staging`` is the host memory saves are copied into, allocated once here (bytes,
    or a size such as "256M"; None: 1 GiB). Every number is checked here: one out of range
    raises InvalidArgument naming it.

    Retention never removes a step the ledger pins (``sluice gc pin``). A peer daemon's tier
    (``sluiced://MEMBER@HOST:PORT/FOLDER/``, or ``peer://FOLDER/``: one chosen from the job's
    members) needs this node's member name (``node_name``; default $SLUICE_NODE_NAME, else
    the short host name), the job's node secret (``node_secret_file``; default
    $SLUICE_NODE_SECRET_FILE) and, for ``peer://``, the members (``peers``: a host list file
    or "slurm", with ``peer_port``; defaults $SLUICE_PEERS and $SLUICE_PEER_PORT)."""

    def __init__(self, series: str, tiers: list[Any] | None = None, *, rank: int | None = None,
                 world_size: int | None = None, run_id: str | None = None,
                 staging: int | str | None = None, keep_last: int = 0,
                 require_all: bool = True, session: Session | None = None,
                 node_name: str | None = None, node_secret_file: Any = None,
                 peers: Any = None, peer_port: int | None = None) -> None:
        from .data import rank_and_world

        given_rank, given_world, staging_bytes, keep_last = _check_numbers(
            rank, world_size, staging, keep_last)
        if given_rank is None or given_world is None:
            rank, world_size = rank_and_world()
        else:
            rank, world_size = given_rank, given_world
        if world_size > 1 and not run_id:
            run_id = _shared_run_id()
        self.series = series
        self.rank, self.world_size = rank, world_size
        self._session = session or connect()
        uris = [os.fspath(t) for t in (tiers or [])]
        # The tiers by name, as the core orders them (none given: its default, home/ckpt).
        self.tiers: list[str] = uris or [self._session.home + "/ckpt"]
        port = check_optional_int(peer_port, "peer_port", lo=1, hi=65535)
        self._cp = _core.open_checkpointer(
            self._session._core, series, uris, rank, world_size, run_id or "", staging_bytes,
            keep_last, require_all, True, node_name or "",
            os.fspath(node_secret_file) if node_secret_file is not None else "",
            os.fspath(peers) if peers is not None else "", port or 0)
        self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sluice-save")
        self._waiter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sluice-commit")
        self._lock = threading.Lock()

    # ---- saving ----------------------------------------------------------------------

    def _stage(self, step: int, state: Any) -> Any:
        flat = _Flattened()
        skeleton = flat.walk(state, [])
        keep, tensors = [], []
        for name, leaf in flat.tensors:
            owner, memory = _host_bytes(leaf)
            keep.append(owner)
            tensors.append((name, _dtype_name(leaf), list(leaf.shape), memory))
        doc = json.dumps({"format": _FORMAT, "state": skeleton}, allow_nan=True).encode()
        tensors.append((STATE_NAME, "uint8", [len(doc)], bytearray(doc)))
        handle = self._cp.save(step, tensors)
        del keep
        return handle

    def async_save(self, step: int, state: Any) -> AsyncSave:
        """Starts a save and returns at once; see :class:`AsyncSave`. Saves run one at a time
        in the order they were started. Until ``staged`` resolves, the state's tensors must
        not change. ``step`` is checked here (InvalidArgument), the state as it is staged."""
        result = AsyncSave(check_int(step, "step"))

        def stage() -> None:
            try:
                result._handle = self._stage(step, state)
            except BaseException as e:  # the future carries it to the caller
                result.staged.set_exception(e)
                result.committed.set_exception(e)
                return
            result.staged.set_result(step)
            self._waiter.submit(commit)

        def commit() -> None:
            try:
                result._handle.wait()
            except BaseException as e:
                result.committed.set_exception(e)
                return
            result.committed.set_result(step)

        self._saver.submit(stage)
        return result

    def save(self, step: int, state: Any) -> None:
        """Saves and returns once every required tier committed."""
        self.async_save(step, state).wait()

    # ---- reading ---------------------------------------------------------------------

    def steps(self) -> list[dict]:
        """Committed steps on any tier, ascending: step, tiers, bytes, created_ns."""
        return self._cp.list()

    def latest(self) -> int:
        """The newest committed step that reads and verifies on some tier."""
        return self._cp.latest()

    def verify(self, step: int) -> dict:
        """Reads every chunk of the step on every tier holding it and checks it."""
        return self._cp.verify(check_int(step, "step"))

    def load(self, step: Any = "latest", into: Any = None) -> Any:
        """The state saved at ``step`` ("latest": the newest intact one), from the nearest
        intact copy, every chunk verified. With ``into``, its tensors and arrays are filled
        in place (CPU or CUDA), after every one was checked against what was saved (dtype,
        shape): a mismatch raises before anything is read; its dicts get the saved plain
        values. A conjugate or negative view of ``into`` is filled so that it shows the saved
        values; a sparse tensor there is refused. Returns the state (``into`` itself when
        given)."""
        if isinstance(step, str):
            if step != "latest":
                raise InvalidArgument(f"step {step!r} is not a step number or 'latest'")
            step = self.latest()
        step = check_int(step, "step")
        entries = {(e["name"], e["rank"]): e for e in self._cp.manifest(step)}
        meta = entries.get((STATE_NAME, self.rank))
        if meta is None:
            raise NotFound(f"step {step} of series {self.series} holds no state saved by "
                           f"rank {self.rank} from Python (saved with the CLI or another tool?)")
        doc = bytearray(meta["bytes"])
        report = self._cp.restore(step, [(STATE_NAME, self.rank, doc)])
        try:
            skeleton = json.loads(bytes(doc))["state"]
        except (ValueError, RecursionError, KeyError, TypeError) as e:
            raise Corruption(f"step {step} of series {self.series} on "
                             f"{self._tier_read(report)}: the state saved by rank {self.rank} "
                             f"is not one sluice writes ({type(e).__name__}: {e})") from None
        saved = {name: e for (name, rank), e in entries.items() if rank == self.rank}
        plan: list[tuple[str, Any, Any]] = []  # name, destination leaf, where to copy after
        assign: list[tuple[Any, Any, Any]] = []  # into's containers: set once the restore is done
        built = _build(skeleton, into, saved, plan, assign, [])
        dests, after = [], []
        for name, leaf, _ in plan:
            owner, memory = _dest_memory(leaf)
            dests.append((name, self.rank, memory))
            if owner is not leaf:  # a device tensor: restored through host memory
                after.append((owner, leaf))
        # Nothing of `into` changed before this line: every leaf was checked first. A restore
        # that fails part-way may leave some of its tensors filled (docs/python.md).
        self._cp.restore(step, dests)
        for host, dst in after:
            dst.detach().copy_(host)
        for container, key, value in assign:
            container[key] = value
        return built

    def _tier_read(self, report: dict) -> str:
        """The tier (or tiers) a restore's bytes came from, by name, from its report."""
        names = [t for t, n in zip(self.tiers, report["bytes_by_tier"]) if n]
        return " and ".join(names) or " and ".join(self.tiers)

    def close(self) -> None:
        """Waits for the saves started and closes."""
        self._saver.shutdown(wait=True)
        self._waiter.shutdown(wait=True)
        self._cp.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_numbers(rank: Any, world_size: Any, staging: Any,
                   keep_last: Any) -> tuple[int | None, int | None, int, int]:
    """A Checkpointer's numbers checked where the caller gave them, InvalidArgument naming
    the one out of range: (rank, world_size) (both None where neither was given: found when
    the checkpointer opens), the staging bytes (0: the core's default, 1 GiB), keep_last."""
    if rank is not None or world_size is not None:
        world_size = check_int(1 if world_size is None else world_size, "world_size", lo=1,
                               hi=U32_MAX)
        rank = check_int(0 if rank is None else rank, "rank", hi=world_size - 1)
    if staging is None:
        staging_bytes = 0
    else:
        if isinstance(staging, str):
            from ._units import parse_size

            staging = parse_size(staging, "staging")
        staging_bytes = check_int(staging, "staging")
        if staging_bytes == 0:  # the core would take 0 for its default: refused instead
            raise InvalidArgument("staging: 0 bytes cannot hold a save (None: the default, "
                                  "1 GiB)")
    return rank, world_size, staging_bytes, check_int(keep_last, "keep_last", hi=U32_MAX)


def _shared_run_id() -> str:
    """One id for this run of the job on every rank: rank 0's, broadcast, where
    torch.distributed is up; else the launcher's."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        box = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if os.environ.get(var):
            return f"{os.environ[var]}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', os.environ.get('SLURM_RESTART_COUNT', '0'))}"
    raise InvalidArgument("a checkpoint of several ranks needs a run_id shared by every rank "
                          "(give run_id=, or initialize torch.distributed)")


def _build(node: dict, into: Any, saved: dict, plan: list, assign: list, path: list[str]) -> Any:
    """The saved structure, with tensor leaves allocated (or taken from ``into``) and queued
    in ``plan`` for the restore. Changes nothing of ``into``: what its containers get is
    queued in ``assign``."""
    where = "/".join(path) or "the state"
    if "v" in node:
        return node["v"]
    if "t" in node:
        leaf = node["t"]
        entry = saved.get(leaf["name"])
        if entry is None:
            raise NotFound(f"{where}: tensor {leaf['name']!r} is not in the checkpoint")
        if into is not None:
            if not (is_tensor(into) or _is_numpy(into)):
                raise InvalidArgument(f"{where}: the checkpoint has a tensor here, the state to "
                                      f"fill has a {type(into).__name__}")
            if is_tensor(into):
                _check_strided(into, where)
            if _dtype_name(into) != leaf["dtype"] or list(into.shape) != leaf["shape"]:
                raise InvalidArgument(
                    f"{where}: saved as {leaf['dtype']}{leaf['shape']}, the tensor to fill is "
                    f"{_dtype_name(into)}{list(into.shape)}")
            if is_tensor(into) and not into.is_contiguous():
                raise InvalidArgument(f"{where}: the tensor to fill is not contiguous")
            if _is_numpy(into) and not into.flags["C_CONTIGUOUS"]:
                raise InvalidArgument(f"{where}: the array to fill is not C-contiguous")
            if _is_numpy(into) and not into.flags["WRITEABLE"]:
                raise InvalidArgument(f"{where}: the array to fill is read-only")
            plan.append((leaf["name"], into, None))
            return into
        out = _allocate(leaf, where)  # a numpy scalar comes back as a 0-d array
        plan.append((leaf["name"], out, None))
        return out
    if "d" in node:
        target = into if isinstance(into, dict) else None
        if into is not None and target is None:
            raise InvalidArgument(f"{where}: the checkpoint has a dict here, the state to fill "
                                  f"has a {type(into).__name__}")
        out = target if target is not None else {}
        for k, v in node["d"]:
            sub = target.get(k) if target is not None else None
            value = _build(v, sub, saved, plan, assign, path + [str(k)])
            if target is not None:
                assign.append((target, k, value))
            else:
                out[k] = value
        return out
    items = node.get("l", node.get("u"))
    if items is None:
        raise InvalidArgument(f"{where}: the saved structure is not one sluice writes")
    if into is not None and (not isinstance(into, (list, tuple)) or len(into) != len(items)):
        raise InvalidArgument(f"{where}: the checkpoint has a sequence of {len(items)} here, "
                              f"the state to fill has {type(into).__name__}")
    built = [_build(v, into[i] if into is not None else None, saved, plan, assign,
                    path + [str(i)]) for i, v in enumerate(items)]
    if isinstance(into, list):
        assign.append((into, slice(None), built))
        return into
    return built if "l" in node else tuple(built)


def _allocate(leaf: dict, where: str) -> Any:
    if leaf["kind"] == "torch":
        import torch

        dtype = vars(torch).get(leaf["dtype"])  # vars(): no lazy import by a crafted name
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgument(f"{where}: dtype {leaf['dtype']} is not one this torch has")
        t = torch.empty(leaf["shape"], dtype=dtype)
        if leaf.get("requires_grad"):
            t.requires_grad_(True)
        return t
    import numpy as np
    from numpy.lib.format import descr_to_dtype

    try:  # "descr": saved since structured dtypes load (str(dtype) does not parse back)
        dtype = descr_to_dtype(leaf["descr"]) if "descr" in leaf else np.dtype(leaf["dtype"])
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{where}: numpy dtype {leaf['dtype']} does not load ({e})") \
            from None
    return np.empty(leaf["shape"], dtype=dtype)


def _dest_memory(leaf: Any) -> tuple[Any, Any]:
    """(host object filled, memory) for a restore into ``leaf``. A device tensor, and a
    conjugate or negative view (its memory holds the values before conj() or neg()), is
    filled through a host tensor copied into it after the restore."""
    if is_tensor(leaf):
        t = leaf.detach()
        if t.device.type != "cpu" or t.is_conj() or t.is_neg():
            import torch

            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
            return host, host_memory(host, "load")
        return leaf, host_memory(t, "load")
    import numpy as np

    return leaf, leaf.reshape(-1).view(np.uint8) if leaf.size else bytearray()
