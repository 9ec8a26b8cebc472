"""Memory the compiled core reads into or writes from, without a copy.

The core takes anything with the buffer protocol (bytearray, memoryview, numpy arrays,
mmap). A torch tensor has no buffer protocol, so a CPU tensor is lent as its ``data_ptr()``
in a ``_core._RawSpan`` while the caller holds it; torch is never imported here. Only this
package builds a ``_RawSpan``, from a tensor it was given: a caller cannot name memory by
address (a ``(address, nbytes)`` tuple is not a buffer).
"""

from __future__ import annotations

from typing import Any

from . import _core
from .errors import InvalidArgument, Unsupported


def is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def host_memory(obj: Any, what: str) -> Any:
    """``obj`` as the core takes it: itself, or a ``_RawSpan`` of a CPU tensor's bytes."""
    if is_tensor(obj):
        if obj.device.type != "cpu":
            raise Unsupported(f"{what}: a tensor on {obj.device} is not host memory")
        if not obj.is_contiguous():
            raise InvalidArgument(f"{what}: the tensor is not contiguous (its bytes are not one range)")
        return _core._RawSpan(obj.data_ptr(), obj.numel() * obj.element_size())
    return obj
