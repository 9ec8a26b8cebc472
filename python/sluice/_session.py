"""Sessions, and the file and object calls on them."""

from __future__ import annotations

import io
import logging
import os
import threading
import warnings
from typing import Any

from . import _core
from ._args import check_int
from ._buffers import host_memory, is_tensor
from .errors import Corruption, InvalidArgument, SkippedWarning

log = logging.getLogger("sluice")


def _uri(uri: Any) -> str:
    if isinstance(uri, os.PathLike):
        return os.fspath(uri)
    if not isinstance(uri, str):
        raise InvalidArgument(f"a location is a str or path, not {type(uri).__name__}")
    return uri


class Session:
    """How sluice opens things: stores by URI, the node's cache, the ledger.

    Made by :func:`sluice.connect`. Reads through the node's cache go to the node's
    ``sluiced`` when it answers on its socket, else to the embedded cache (a directory);
    :attr:`cache` says which was found at connect time and :attr:`cache_reason` why.
    """

    def __init__(self, **options: Any) -> None:
        self.options: dict = dict(options)  # as given: another process connects with them
        self._core = _core.Session(**options)
        route = self._core.cache_route()
        self.cache: str = "sluiced" if route["daemon"] else "embedded"
        self.cache_socket: str = route["socket"]
        self.cache_directory: str = route["directory"]
        self.cache_reason: str = route["reason"]

    @property
    def home(self) -> str:
        return self._core.home

    def __repr__(self) -> str:
        where = self.cache_socket if self.cache == "sluiced" else self.cache_directory
        return f"<sluice.Session home={self.home!r} cache={self.cache} at {where!r}>"

    # ---- objects ------------------------------------------------------------------------

    def stat(self, uri: Any, *, cache: bool = False) -> dict:
        """The object's size, etag and modification time (ns)."""
        return self._core.stat(_uri(uri), cache)

    def open(self, uri: Any, mode: str = "rb", *, cache: bool = False, buffering: int = -1,
             overwrite: bool = True, durable: bool = True) -> Any:
        """Opens one object as a binary file.

        ``"rb"``: a reader pinned to the version it opened (a change midway raises
        :class:`sluice.Conflict`), buffered unless ``buffering=0``; ``cache=True`` (or a
        ``cache+`` URI) reads through the node's cache. ``"wb"``: a writer whose object is
        published, atomically, only when it is closed without an exception; an exception
        in its ``with`` block, :meth:`ObjectWriter.abort` or garbage collection of an
        unclosed writer publishes nothing.
        """
        target = _uri(uri)
        if mode in ("rb", "br", "r"):
            if mode == "r":
                raise InvalidArgument(f"{target}: text mode is not supported; open with 'rb'")
            raw = ObjectReader(self._core.open_reader(target, cache), target)
            if buffering == 0:
                return raw
            return io.BufferedReader(raw, buffer_size=buffering if buffering > 1 else 4 << 20)
        if mode in ("wb", "bw"):
            if cache:
                raise InvalidArgument(f"{target}: writes never go through the node's cache")
            return ObjectWriter(self._core.open_writer(target, overwrite, durable), target)
        raise InvalidArgument(f"{target}: mode {mode!r} is not one of 'rb' and 'wb'")

    def read_into(self, uri: Any, buffer: Any, offset: int = 0, *, cache: bool = False) -> int:
        """Reads the object from ``offset`` into ``buffer`` (a bytearray, memoryview, numpy
        array or torch tensor) without an intermediate copy; returns the bytes read: the
        buffer's size, or fewer where the object ends first."""
        target = _uri(uri)
        offset = check_int(offset, f"read_into {target}: offset")
        if is_tensor(buffer) and buffer.device.type != "cpu":
            return _read_into_device(self, target, buffer, offset, cache)
        return self._core.read_into(target, host_memory(buffer, "read_into"), offset, cache)

    def read(self, uri: Any, *, cache: bool = False) -> bytes:
        """The whole object as bytes."""
        reader = self._core.open_reader(_uri(uri), cache)  # one version, start to end
        try:
            out = bytearray(reader.size)
            n = reader.read_into(out, 0) if out else 0
            if n != len(out):
                raise Corruption(f"{uri}: read {n} of its {len(out)} bytes")
            return bytes(out)
        finally:
            reader.close()

    def write(self, uri: Any, data: Any, *, overwrite: bool = True, durable: bool = True) -> None:
        """Publishes ``data`` as the object, atomically."""
        w = self._core.open_writer(_uri(uri), overwrite, durable, None)
        try:
            w.write(host_memory(data, "write"))
            w.commit()
        finally:
            w.abort()

    def copy(self, src: Any, dst: Any, *, recursive: bool = False, cache: bool = False,
             durable: bool = False, jobs: int = 16) -> dict:
        """Copies one object, or every object under a prefix (``recursive``), between any two
        locations, as ``sluice cp`` does: nothing partial is left at the destination. Raises
        the first failure's error when any object failed; returns the summary otherwise."""
        summary = self._core.copy(_uri(src), _uri(dst), recursive, cache, durable, jobs)
        failures = summary["failures"]
        if failures:
            source, code, message = failures[0]
            more = f" (and {len(failures) - 1} more failed)" if len(failures) > 1 else ""
            _core._raise(code, f"{message}{more}")
        for _key, reason in summary["skipped"]:
            warnings.warn(f"copy {src}: skipped {reason}", SkippedWarning, stacklevel=2)
        return summary

    def ls(self, uri: Any, *, recursive: bool = False) -> list[dict]:
        """The objects under a prefix (a local directory, s3://bucket/prefix/, ...): each a
        dict of key, size, etag, mtime_ns. Not recursive: the folders below as keys ending
        in '/'. A local symlink that leads out of the folder is no object of it: it is left
        out, and a :class:`SkippedWarning` names it."""
        objects, skipped = self._core.ls(_uri(uri), recursive)
        for _key, reason in skipped:
            warnings.warn(f"ls {uri}: skipped {reason}", SkippedWarning, stacklevel=2)
        return objects


def _read_into_device(session: Session, uri: str, tensor: Any, offset: int, cache: bool) -> int:
    """A device tensor: read through pinned host memory, a window at a time."""
    import torch  # only here: a device tensor means torch is there

    if not tensor.is_contiguous():
        raise InvalidArgument("read_into: the tensor is not contiguous (its bytes are not one range)")
    dst = tensor.view(-1).view(torch.uint8)
    window = 64 << 20
    host = torch.empty(min(window, dst.numel()), dtype=torch.uint8, pin_memory=True)
    reader = session._core.open_reader(uri, cache)
    done = 0
    while done < dst.numel():
        n = reader.read_into(host_memory(host[: min(window, dst.numel() - done)], "read_into"),
                             offset + done)
        if n == 0:
            break
        dst[done: done + n].copy_(host[:n], non_blocking=False)
        done += n
    return done


class ObjectReader(io.RawIOBase):
    """One object as a raw binary file: readinto, seek, tell; pinned to one version."""

    def __init__(self, reader: Any, name: str) -> None:
        super().__init__()
        self._r = reader
        self._pos = 0
        self.name = name

    @property
    def size(self) -> int:
        return self._r.size

    @property
    def etag(self) -> str:
        return self._r.etag

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        n = self._r.read_into(host_memory(b, "readinto"), self._pos)
        self._pos += n
        return n

    def readall(self) -> bytes:
        out = bytearray(max(0, self.size - self._pos))
        n = self.readinto(out) if out else 0
        return bytes(out[:n])

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise InvalidArgument(f"{self.name}: whence {whence} is not 0, 1 or 2")
        if pos < 0:
            raise InvalidArgument(f"{self.name}: seek to {pos}, before the start")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            self._r.close()
        super().close()


class ObjectWriter(io.RawIOBase):
    """One object being written. Published atomically when closed without an exception;
    nothing is published after :meth:`abort`, an exception in its ``with`` block, or when
    it is collected unclosed."""

    def __init__(self, writer: Any, name: str) -> None:
        super().__init__()
        self._w = writer
        self.name = name
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        return self._w.write(host_memory(b, "write"))

    def tell(self) -> int:
        return self._w.size

    def abort(self) -> None:
        """Discards what was written; the object is left as it was."""
        with self._lock:
            self._w.abort()
        super().close()

    def close(self) -> None:
        with self._lock:
            if not self.closed and not self._w.closed:
                try:
                    self._w.commit()
                finally:
                    super().close()
                return
        super().close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # Never publish a half-written object because it was dropped.
        try:
            self._w.abort()
        except Exception:
            pass


_default: Session | None = None
_default_lock = threading.Lock()


def connect(**options: Any) -> Session:
    """A session with these options (home, daemon, cache_dir, cache_ram, cache_size,
    endpoint_url, profile, region, ledger), each defaulting to the environment as the
    ``sluice`` CLI reads it ($SLUICE_HOME, AWS_*, $SLUICE_LEDGER). With no options, the
    process's default session, made once."""
    global _default
    if options:
        return Session(**options)
    with _default_lock:
        if _default is None:
            _default = Session()
            if _default.cache == "embedded":
                log.info("sluice: reads through the node's cache use the embedded cache at %s (%s)",
                         _default.cache_directory, _default.cache_reason)
            else:
                log.info("sluice: reads through the node's cache go to sluiced at %s",
                         _default.cache_socket)
        return _default
