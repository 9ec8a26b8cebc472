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

Objects, their bytes and their listings come from the session (the same calls as ``sluice
ls``/``cp``). Folders differ by store: a local folder is a directory, which may be empty
(listed, made and removed with ``os``, since the file store knows folders only by the files
in them); an S3 folder is a common prefix, so it exists while an object is under it and
``mkdir`` makes nothing. Checked by fsspec's own conformance suite
(tests/python/test_fsspec_conformance.py); the limits it finds are in docs/python.md.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from ._session import Session, connect
from .errors import InvalidArgument, NotFound

__all__ = ["SluiceFileSystem"]

# The file store's temporary folder (writers' files before they are published): no folder of
# the user's, as the store's own listings skip it.
_STORE_TEMP = ".sluice-tmp"


def _local(path: str) -> bool:
    return path.startswith("/")


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
        if _local(path):
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
        if "w" in mode or "x" in mode:
            # "xb": refused up front when the object exists, and again when it is published
            # (a rename that replaces nothing; S3's If-None-Match), against a racing writer.
            exclusive = "x" in mode
            if exclusive and self.exists(path):
                raise FileExistsError(f"{path} exists (mode {mode!r} creates a new object)")
            f = self._session.open(self._uri(path, cached=False), "wb", overwrite=not exclusive)
            if not autocommit:  # in `with fs.transaction`: published at its end, if no error
                f = _TransactionWriter(f)
            return f
        raise ValueError(f"{path}: mode {mode!r} is not supported (rb, wb, xb)")

    def info(self, path: str, **kwargs: Any) -> dict:
        name = self._strip_protocol(path)
        if _local(name) and os.path.isdir(name):
            return _folder(name)
        found = self._stat(name)
        if found:
            return found
        if not _local(name) and self.isdir(name):
            return _folder(name)
        raise FileNotFoundError(path)

    def _stat(self, name: str) -> dict | None:
        try:
            st = self._session.stat(self._uri(name, cached=False))
        except (NotFound, InvalidArgument):  # InvalidArgument: a bucket or a prefix
            return None
        return {"name": name, "size": st["size"], "type": "file", "etag": st["etag"],
                "mtime_ns": st["mtime_ns"]}

    def isdir(self, path: str) -> bool:
        name = self._strip_protocol(path)
        if _local(name):
            return os.path.isdir(name)
        try:  # an S3 folder: a prefix with objects under it (one listing, no stat first)
            return bool(self._session.ls(self._uri(name, cached=False) + "/"))
        except (NotFound, InvalidArgument):
            return False

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        base = self._strip_protocol(path)
        out = self._ls_local(base) if _local(base) else self._ls_bucket(base)
        return out if detail else [o["name"] for o in out]

    def _ls_local(self, base: str) -> list[dict]:
        if not os.path.isdir(base):
            return [self.info(base)]  # a file lists itself; FileNotFoundError when missing
        objects = self._session.ls(self._uri(base, cached=False) + "/")
        out = [_entry(base + "/" + o["key"], o) for o in objects if not o["key"].endswith("/")]
        with os.scandir(base) as entries:  # every folder, the empty ones too
            out += [_folder(e.path) for e in entries
                    if e.is_dir(follow_symlinks=False) and e.name != _STORE_TEMP]
        return sorted(out, key=lambda o: o["name"])

    def _ls_bucket(self, base: str) -> list[dict]:
        objects = self._session.ls(self._uri(base, cached=False) + "/")
        if not objects:  # an object lists itself
            found = self._stat(base)
            if not found:
                raise FileNotFoundError(base)
            return [found]
        bucket = base.split("/", 1)[0]
        return [_entry(bucket + "/" + o["key"], o) for o in objects]

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs: Any) -> Any:
        """On S3, one listing of everything under the prefix (what the store's listing reads
        anyway) rather than fsspec's one per folder."""
        base = self._strip_protocol(path)
        if _local(base):
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail,
                                **kwargs)
        bucket = base.split("/", 1)[0]
        out: dict[str, dict] = {}
        for o in self._session.ls(self._uri(base, cached=False) + "/", recursive=True):
            name = bucket + "/" + o["key"]
            parts = name[len(base) + 1:].split("/")
            if withdirs:  # the folders down to it, as deep as maxdepth allows
                for depth in range(1, min(len(parts), (maxdepth or len(parts)) + 1)):
                    folder = base + "/" + "/".join(parts[:depth])
                    out.setdefault(folder, _folder(folder))
            if maxdepth is None or len(parts) <= maxdepth:
                out[name] = _entry(name, o)
        if out and withdirs:
            out[base] = _folder(base)
        if not out:  # a path that names an object finds itself
            found = self._stat(base)
            if found:
                out[base] = found
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

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

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        with self.open(path, "xb" if mode == "create" else "wb", **kwargs) as f:
            f.write(value)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if _local(src) and os.path.isdir(src):  # a recursive copy names each folder too
            if _local(dst):
                os.makedirs(dst, exist_ok=True)
            return
        self._session.copy(self._uri(src, cached=False), self._uri(dst, cached=False))

    def rm_file(self, path: str) -> None:
        self._session._core.remove(self._uri(path, cached=False))

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Removes objects and, with ``recursive``, everything under a folder. A local folder
        is removed once emptied; an S3 folder is gone with its last object."""
        for p in reversed(self.expand_path(path, recursive=recursive, maxdepth=maxdepth)):
            if _local(p) and os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)  # emptied: expand_path sorts a folder before what it holds
            else:
                self.rm_file(p)  # an S3 folder's name too: deleting no object is no error

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if not _local(path):
            return  # an S3 folder exists while an object is under it
        if create_parents:
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if _local(path):
            os.makedirs(path, exist_ok=exist_ok)


def _folder(name: str) -> dict:
    return {"name": name, "size": 0, "type": "directory"}


def _entry(name: str, o: dict) -> dict:
    is_dir = o["key"].endswith("/")
    return {"name": name.rstrip("/"), "size": o["size"], "type": "directory" if is_dir else "file"}


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
