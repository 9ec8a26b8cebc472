"""An fsspec filesystem for sluice locations read through the node's cache.

    import fsspec, sluice.fs
    with fsspec.open("cache+s3://bucket/data/shard-0001.tar", "rb") as f:
        header = f.read(512)

Registered for the protocols ``cache+s3`` and ``cache+file`` (sluice's own grammar: reads
of such a location go through the node's sluiced, else the embedded cache). Writes go to
the store itself (never through the cache) and are atomic: an object appears whole when its
file is closed, or not at all. fsspec closes a file at the end of its ``with`` block even
when the block raised, which publishes what was written; ``fs.open`` of this filesystem
aborts instead, and inside ``with fs.transaction:`` objects are published only when the
transaction ends without an error. Everything built on fsspec (pandas, DCP's fsspec writer and
reader, ...) gets these through ``fsspec.open``/``fsspec.filesystem``.
"""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from ._session import Session, connect
from .errors import NotFound

__all__ = ["SluiceFileSystem"]


class SluiceFileSystem(AbstractFileSystem):
    protocol = ("cache+s3", "cache+file")
    root_marker = ""
    cachable = False

    def __init__(self, *args: Any, session: Session | None = None,
                 session_options: dict | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session = session or (connect(**session_options) if session_options else connect())
        self._scheme = "cache+s3"

    # Paths inside fsspec have no protocol: "bucket/key" for s3, "/abs/path" for files.
    def _uri(self, path: str, cached: bool = True) -> str:
        path = self._strip_protocol(path)
        if path.startswith("/"):
            return ("cache+file://" if cached else "file://") + path
        return ("cache+s3://" if cached else "s3://") + path

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        path = str(path)
        for p in ("cache+s3://", "cache+file://", "s3://", "file://"):
            if path.startswith(p):
                path = path[len(p):]
                break
        return path.rstrip("/") if len(path) > 1 else path

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        if "r" in mode:
            return self._session.open(self._uri(path), "rb")
        if "w" in mode:
            f = self._session.open(self._uri(path, cached=False), "wb")
            if not autocommit:  # in `with fs.transaction`: published at its end, if no error
                f = _TransactionWriter(f)
            return f
        raise ValueError(f"{path}: mode {mode!r} is not supported (rb, wb)")

    def info(self, path: str, **kwargs: Any) -> dict:
        name = self._strip_protocol(path)
        try:
            st = self._session.stat(self._uri(path, cached=False))
            return {"name": name, "size": st["size"], "type": "file", "etag": st["etag"],
                    "mtime_ns": st["mtime_ns"]}
        except (NotFound, ValueError):
            pass
        listed = self.ls(path, detail=True)
        if listed:
            return {"name": name, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        base = self._strip_protocol(path)
        uri = self._uri(base, cached=False)
        prefix = uri if uri.endswith("/") else uri + "/"
        try:
            objects = self._session.ls(prefix)
        except NotFound:
            return []
        out = []
        root = base if base.startswith("/") else base.split("/", 1)[0]
        for o in objects:
            key = o["key"]
            if base.startswith("/"):
                name = base.rstrip("/") + "/" + key
            else:
                name = root + "/" + key
            is_dir = key.endswith("/")
            out.append({"name": name.rstrip("/"), "size": o["size"],
                        "type": "directory" if is_dir else "file"})
        return out if detail else [o["name"] for o in out]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        with self._session.open(self._uri(path), "rb") as f:
            size = f.raw.size
            start = 0 if start is None else (start if start >= 0 else max(0, size + start))
            end = size if end is None else (end if end >= 0 else max(0, size + end))
            buf = bytearray(max(0, min(end, size) - start))
            if buf:
                f.raw.seek(start)
                f.raw.readinto(buf)
            return bytes(buf)

    def rm_file(self, path: str) -> None:
        self._session._core.remove(self._uri(path, cached=False))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        if not self._strip_protocol(path).startswith("/"):
            return  # object stores have no folders
        import os

        os.makedirs(self._strip_protocol(path), exist_ok=True)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.mkdir(path)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: Any = None,
           **kwargs: Any) -> None:
        """Copies then removes the source (object stores have no rename)."""
        self._session.copy(self._uri(path1, cached=False), self._uri(path2, cached=False),
                           recursive=recursive)
        if recursive:
            for o in self.find(path1):
                self.rm_file(o)
        else:
            self.rm_file(path1)


class _TransactionWriter:
    """A writer inside an fsspec transaction: close() keeps the object unpublished;
    the transaction's end commits it, or discards it when the block raised."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.closed = False

    def write(self, b: Any) -> int:
        return self._f.write(b)

    def close(self) -> None:
        self.closed = True

    def commit(self) -> None:
        self._f.close()

    def discard(self) -> None:
        self._f.abort()

    def __enter__(self) -> "_TransactionWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


for _proto in SluiceFileSystem.protocol:
    fsspec.register_implementation(_proto, SluiceFileSystem, clobber=True)
