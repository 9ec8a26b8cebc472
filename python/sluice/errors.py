"""sluice's exceptions: one base class, one subclass per error code.

Every error sluice raises is a :class:`sluice.Error` whose ``code`` is the stable name of
its cause (``"not_found"``) and whose message is the one the ``sluice`` CLI prints. Where
Python has a built-in exception for the same cause, the subclass derives from it as well,
so ``except FileNotFoundError`` catches :class:`NotFound`.
"""

from __future__ import annotations

from . import _core

__all__ = [
    "Error",
    "NotFound",
    "InvalidArgument",
    "IoError",
    "Corruption",
    "NoSpace",
    "QuotaExceeded",
    "Unavailable",
    "Unsupported",
    "PermissionDenied",
    "AlreadyExists",
    "Cancelled",
    "TimedOut",
    "Conflict",
    "InternalError",
    "SkippedWarning",
]


class Error(Exception):
    """The base class of every error sluice raises."""

    code: str = "internal"


class NotFound(Error, FileNotFoundError):
    """The file, object, key, bucket or step does not exist."""

    code = "not_found"


class InvalidArgument(Error, ValueError):
    """The caller asked for something malformed: a bad URI, a buffer too small, a wrong dtype."""

    code = "invalid_argument"


class IoError(Error, OSError):
    """The device or file system failed the operation."""

    code = "io_error"


class Corruption(Error):
    """Bytes read back do not match their checksum or format."""

    code = "corruption"


class NoSpace(Error, OSError):
    """The file system or device is full."""

    code = "no_space"


class QuotaExceeded(Error):
    """A team's sluice quota would be exceeded."""

    code = "quota_exceeded"


class Unavailable(Error, ConnectionError):
    """A service is unreachable for now; the call may succeed later."""

    code = "unavailable"


class Unsupported(Error, NotImplementedError):
    """This machine lacks the feature (no CUDA, no io_uring, no O_DIRECT)."""

    code = "unsupported"


class PermissionDenied(Error, PermissionError):
    """The file system, the server or sluiced refused the caller."""

    code = "permission_denied"


class AlreadyExists(Error, FileExistsError):
    """An exclusive create found something there (a committed step, an object)."""

    code = "already_exists"


class Cancelled(Error):
    """The operation was abandoned."""

    code = "cancelled"


class TimedOut(Error, TimeoutError):
    """A deadline passed."""

    code = "timed_out"


class Conflict(Error):
    """The object changed under the caller (another version now)."""

    code = "conflict"


class InternalError(Error):
    """A broken invariant inside sluice: a bug, please report it."""

    code = "internal"


class SkippedWarning(UserWarning):
    """A listing left a name out: a local symlink that leads out of the folder listed (no
    object of it; reading it is refused). The rest of the listing, copy or dataset stands."""


_BY_CODE = {cls.code: cls for cls in (globals()[name] for name in __all__)
            if issubclass(cls, Error) and cls is not Error}
_core._set_error_classes(_BY_CODE)


def error_class(code: str) -> type[Error]:
    """The exception class for an error code name (``"not_found"`` -> :class:`NotFound`)."""
    return _BY_CODE.get(code, Error)
