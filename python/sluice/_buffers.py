"""Memory the compiled core reads into or writes from, without a copy.

The core takes anything with the buffer protocol (bytearray, memoryview, numpy arrays,
mmap) or a raw ``(address, nbytes)`` pair. A torch tensor has no buffer protocol, so a CPU
tensor is lent as its ``data_ptr()`` while the caller holds it; torch is never imported here.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument, Unsupported


def is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def host_memory(obj: Any, what: str) -> Any:
    """``obj`` as the core takes it: itself, or (address, nbytes) for a CPU tensor."""
    if is_tensor(obj):
        if obj.device.type != "cpu":
            raise Unsupported(f"{what}: a tensor on {obj.device} is not host memory")
        if not obj.is_contiguous():
            raise InvalidArgument(f"{what}: the tensor is not contiguous (its bytes are not one range)")
        return (obj.data_ptr(), obj.numel() * obj.element_size())
    return obj
