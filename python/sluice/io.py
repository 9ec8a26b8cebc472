"""Direct file I/O shaped like KvikIO's ``CuFile``: positional reads and writes into host
or device buffers, as futures or blocking, a batch call, and which path the bytes take.

    with sluice.io.File("/nvme/shard.bin", "r") as f:
        fut = f.pread(tensor)            # a CUDA tensor, a CPU tensor, numpy, bytearray
        n = fut.get()
        print(f.path_report()["path"])   # "direct+io_uring", "gds", "...+bounce(cuda:0)"

Reads and writes go through sluice's data path: io_uring (or a thread pool) with O_DIRECT
where the file system allows it, GPUDirect Storage where cuFile and a GPU are there, else
device memory through pinned bounce buffers. :func:`path_report` says which and why.
"""

from __future__ import annotations

import os
from typing import Any

from . import _core
from ._args import check_int, check_optional_int
from ._buffers import host_memory, is_tensor, plain_tensor
from .errors import InvalidArgument

__all__ = ["File", "IOFuture", "path_report"]


def _memory(buf: Any, what: str, fills: bool) -> Any:
    """``buf`` as the core takes it (``fills``: the I/O writes into it)."""
    if is_tensor(buf):
        buf = plain_tensor(buf)
    if is_tensor(buf) and buf.device.type == "cuda":
        if not buf.is_contiguous():
            raise InvalidArgument(f"{what}: the tensor is not contiguous (its bytes are not one range)")
        return _core._RawSpan(buf.data_ptr(), buf.numel() * buf.element_size(),
                              buf.device.index or 0)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None and not is_tensor(buf):
        if cai.get("strides") not in (None,):
            raise InvalidArgument(f"{what}: the device array is not C-contiguous")
        if fills and cai["data"][1]:
            raise InvalidArgument(f"{what}: the device array is read-only (bytes cannot be filled)")
        n = 1
        for d in cai["shape"]:
            n *= d
        import numpy as np

        return _core._RawSpan(cai["data"][0], n * np.dtype(cai["typestr"]).itemsize, 0)
    return host_memory(buf, what)


def _checked(what: str, size: Any, file_offset: Any, buf_offset: Any) -> tuple:
    """(size, file_offset, buf_offset) checked where the caller called (InvalidArgument)."""
    return (check_optional_int(size, f"{what}: size"), check_int(file_offset, f"{what}: file_offset"),
            check_int(buf_offset, f"{what}: buf_offset"))


class IOFuture:
    """A read or write in flight; holds its buffer until done."""

    def __init__(self, core: Any, buf: Any) -> None:
        self._core, self._buf = core, buf

    def get(self) -> int:
        """Waits, and returns the bytes moved (raises what failed)."""
        return self._core.get()

    def done(self) -> bool:
        return self._core.done()


class File:
    """A file opened for direct I/O. ``flags``: "r", "r+", "w" (create, truncate), "a"
    (create). ``direct`` and ``compat`` ("auto", "on", "off"): O_DIRECT, and whether
    GPUDirect Storage is used ("on": never, the bounce path; "off": required)."""

    def __init__(self, file: Any, flags: str = "r", *, direct: str = "auto",
                 compat: str = "auto") -> None:
        self.path = os.fspath(file)
        self._f = _core.File(self.path, flags, direct, compat)

    def pread(self, buf: Any, size: int | None = None, file_offset: int = 0,
              buf_offset: int = 0) -> IOFuture:
        """Starts reading ``size`` bytes (default: what fits) at ``file_offset`` into
        ``buf`` at ``buf_offset``."""
        args = _checked("pread", size, file_offset, buf_offset)
        return IOFuture(self._f.pread(_memory(buf, "pread", True), *args), buf)

    def pwrite(self, buf: Any, size: int | None = None, file_offset: int = 0,
               buf_offset: int = 0) -> IOFuture:
        args = _checked("pwrite", size, file_offset, buf_offset)
        return IOFuture(self._f.pwrite(_memory(buf, "pwrite", False), *args), buf)

    def read(self, buf: Any, size: int | None = None, file_offset: int = 0,
             buf_offset: int = 0) -> int:
        args = _checked("read", size, file_offset, buf_offset)
        return self._f.read(_memory(buf, "read", True), *args)

    def write(self, buf: Any, size: int | None = None, file_offset: int = 0,
              buf_offset: int = 0) -> int:
        args = _checked("write", size, file_offset, buf_offset)
        return self._f.write(_memory(buf, "write", False), *args)

    def batch(self, ios: list[tuple]) -> list[int]:
        """Many reads and writes in flight at once, as cuFile's batch API (which KvikIO's
        Python API lacks): ``ios`` is a list of (op, buf, size or None, file_offset) with op
        "read" or "write"; returns each one's bytes, in order, once all are done."""
        return self._f.batch([(op, _memory(buf, "batch", op == "read"),
                               *_checked("batch", size, off, 0)[:2])
                              for op, buf, size, off in ios])

    def sync(self) -> None:
        """Makes written bytes durable (fdatasync)."""
        self._f.sync()

    @property
    def size(self) -> int:
        return self._f.size

    def path_report(self) -> dict:
        """Which path this file's I/O takes (direct, gds, engine, path) and why."""
        return self._f.path_report()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def path_report(path: Any = None, device: int = 0) -> dict:
    """Which path device memory would take here, and why: "gds" (GPUDirect Storage),
    "bounce" (pinned host buffers and CUDA copies) or "host" (no CUDA: host memory only);
    with ``path``, that file's own report (O_DIRECT, engine) too."""
    cuda = _core.cuda_status(device)
    out: dict = {"cuda": cuda["available"], "cuda_why": cuda["why"] or cuda["name"]}
    if path is not None:
        with File(path, "r") as f:
            out["file"] = f.path_report()
        gds = out["file"]["gds"]
    else:
        gds = False
    if cuda["available"] and gds:
        out["path"], out["why"] = "gds", "cuFile registered the file and a CUDA device is there"
    elif cuda["available"]:
        out["path"] = "bounce"
        out["why"] = ("no GPUDirect Storage for this file; device memory goes through pinned "
                      "host buffers" if path is not None else
                      "a CUDA device is there; give a path to see whether cuFile takes the file")
    else:
        out["path"], out["why"] = "host", f"no CUDA ({cuda['why']}): host memory only"
    return out
