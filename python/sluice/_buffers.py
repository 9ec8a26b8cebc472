"""Memory the compiled core reads into or writes from, without a copy.

The core takes anything with the buffer protocol (bytearray, memoryview, numpy arrays,
mmap). A torch tensor has no buffer protocol, so a CPU tensor is lent as its ``data_ptr()``
in a ``_core._RawSpan`` while the caller holds it; torch is never imported here. Only this
package builds a ``_RawSpan``, from a tensor it was given: a caller cannot name memory by
address (a ``(address, nbytes)`` tuple is not a buffer).
"""

from __future__ import annotations

import sys
from typing import Any

from . import _core
from .errors import InvalidArgument, Unsupported


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (a real one: an object that only looks like one is
    no tensor, and its "data_ptr" is never trusted). torch is imported by whoever made it."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def plain_tensor(t: Any) -> Any:
    """``t`` as a plain torch.Tensor sharing its memory. A subclass may override data_ptr,
    numel, element_size or is_contiguous (and intercept them through __torch_function__), so
    their answers name memory it does not own: only a plain tensor's are asked."""
    torch = sys.modules["torch"]
    if type(t) is torch.Tensor:
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(t, torch.Tensor)


def host_memory(obj: Any, what: str) -> Any:
    """``obj`` as the core takes it: itself, or a ``_RawSpan`` of a CPU tensor's bytes. A
    ``_RawSpan`` the caller built is refused: only this package names memory by address."""
    if isinstance(obj, _core._RawSpan):
        raise InvalidArgument(f"{what}: a raw span is not a buffer (give a bytearray, "
                              "memoryview, numpy array or torch tensor)")
    if is_tensor(obj):
        obj = plain_tensor(obj)
        if obj.device.type != "cpu":
            raise Unsupported(f"{what}: a tensor on {obj.device} is not host memory")
        if not obj.is_contiguous():
            raise InvalidArgument(f"{what}: the tensor is not contiguous (its bytes are not one range)")
        return _core._RawSpan(obj.data_ptr(), obj.numel() * obj.element_size())
    return obj
