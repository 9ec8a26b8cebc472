"""sluice: the data layer of a GPU node, from Python.

    import sluice
    s = sluice.connect()                 # the node's sluiced when it answers, else embedded
    with sluice.open("s3://bucket/x.bin") as f:
        header = f.read(4096)
    n = sluice.read_into("s3://bucket/x.bin", bytearray(1 << 20))
    sluice.copy("s3://bucket/train/", "/scratch/train/", recursive=True)

``sluice.data`` streams datasets into PyTorch, ``sluice.checkpoint`` saves and restores
checkpoints; see docs/python.md.
"""

from __future__ import annotations

from typing import Any

from . import _core  # noqa: F401  (the compiled core; fails here if it is missing)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._session import ObjectReader, ObjectWriter, Session, connect

__version__ = "0.1.0"


def open(uri: Any, mode: str = "rb", **kwargs: Any) -> Any:  # noqa: A001 (as io.open)
    """:meth:`Session.open` on the default session."""
    return connect().open(uri, mode, **kwargs)


def read_into(uri: Any, buffer: Any, offset: int = 0, **kwargs: Any) -> int:
    """:meth:`Session.read_into` on the default session."""
    return connect().read_into(uri, buffer, offset, **kwargs)


def copy(src: Any, dst: Any, recursive: bool = False, **kwargs: Any) -> dict:
    """:meth:`Session.copy` on the default session."""
    return connect().copy(src, dst, recursive=recursive, **kwargs)


def ls(uri: Any, recursive: bool = False) -> list[dict]:
    """:meth:`Session.ls` on the default session."""
    return connect().ls(uri, recursive=recursive)


def stat(uri: Any, **kwargs: Any) -> dict:
    """:meth:`Session.stat` on the default session."""
    return connect().stat(uri, **kwargs)


__all__ = ["Session", "ObjectReader", "ObjectWriter", "connect", "open", "read_into", "copy",
           "ls", "stat", *_errors_all]
