"""Errors of the forkbox SDK.

Every failed call raises a :class:`ForkboxError` subclass named after the
error class the daemon gave it (the classes of the Go SDK's ``errdefs``, which
the daemon sends as Connect codes): catch the class, never match the message::

    try:
        client.get_sandbox("nope")
    except forkbox.NotFoundError:
        ...

``err.code`` is the class name as the daemon and the other SDKs spell it
("NotFound", "InvalidArgument", ...). A command that ran but did not succeed
is an :class:`ExecError` (not a ForkboxError: the call itself worked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Type

if TYPE_CHECKING:
    from ._models import ExecResult


class ForkboxError(Exception):
    """An error of one of forkbox's classes, as the daemon (or this SDK) gave it."""

    #: The class name: "NotFound", "InvalidArgument", ...
    code = "Unknown"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidArgumentError(ForkboxError):
    """Bad input: a malformed resource string, a path that escapes, ..."""

    code = "InvalidArgument"


class NotFoundError(ForkboxError):
    """No such sandbox, checkpoint, image, environment, file, ..."""

    code = "NotFound"


class AlreadyExistsError(ForkboxError):
    """A name already taken (a live sandbox's name, ...)."""

    code = "AlreadyExists"


class FailedPreconditionError(ForkboxError):
    """The call is not allowed in the current state (exec on a paused
    sandbox, a fork without the per-fork credentials, resume with no
    checkpoint, a failed environment step, ...)."""

    code = "FailedPrecondition"


class UnavailableError(ForkboxError):
    """The daemon (or a sandbox's agent) cannot be reached right now."""

    code = "Unavailable"


class ResourceExhaustedError(ForkboxError):
    """No free slot: the client's max_concurrency, or the daemon's limit."""

    code = "ResourceExhausted"


class PermissionDeniedError(ForkboxError):
    """Not allowed: e.g. this process may not open the daemon's socket."""

    code = "PermissionDenied"


class UnauthenticatedError(ForkboxError):
    """A missing or wrong bearer token (TCP)."""

    code = "Unauthenticated"


class DeadlineExceededError(ForkboxError):
    code = "DeadlineExceeded"


class CanceledError(ForkboxError):
    """The call was canceled (e.g. Execution.cancel())."""

    code = "Canceled"


class UnimplementedError(ForkboxError):
    """The daemon does not implement this (class "NotImplemented"; named so
    as not to shadow Python's NotImplementedError)."""

    code = "NotImplemented"


class InternalError(ForkboxError):
    """A bug in the daemon (see its log)."""

    code = "Internal"


class UnknownError(ForkboxError):
    code = "Unknown"


_BY_NAME: Dict[str, Type[ForkboxError]] = {
    c.code: c
    for c in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        FailedPreconditionError,
        UnavailableError,
        ResourceExhaustedError,
        PermissionDeniedError,
        UnauthenticatedError,
        DeadlineExceededError,
        CanceledError,
        UnimplementedError,
        InternalError,
        UnknownError,
    )
}

# Connect codes (as they travel in JSON) → class names, as errdefs/errconnect maps them.
_CONNECT_CODES = {
    "canceled": "Canceled",
    "unknown": "Unknown",
    "invalid_argument": "InvalidArgument",
    "deadline_exceeded": "DeadlineExceeded",
    "not_found": "NotFound",
    "already_exists": "AlreadyExists",
    "permission_denied": "PermissionDenied",
    "resource_exhausted": "ResourceExhausted",
    "failed_precondition": "FailedPrecondition",
    "aborted": "Unknown",
    "out_of_range": "InvalidArgument",
    "unimplemented": "NotImplemented",
    "internal": "Internal",
    "unavailable": "Unavailable",
    "data_loss": "Internal",
    "unauthenticated": "Unauthenticated",
}

# HTTP statuses of responses without a Connect error body (a proxy, ...),
# as the Connect protocol maps them.
_HTTP_STATUS = {
    400: "Internal",
    401: "Unauthenticated",
    403: "PermissionDenied",
    404: "NotImplemented",
    429: "Unavailable",
    502: "Unavailable",
    503: "Unavailable",
    504: "Unavailable",
}


def error_class(name: str) -> Type[ForkboxError]:
    """The exception class of an error class name ("NotFound" → NotFoundError)."""
    return _BY_NAME.get(name, UnknownError)


def from_class_name(name: str, message: str) -> ForkboxError:
    """An error of the class named name, as the daemon spells it (a fork child's error_class)."""
    return error_class(name)(message)


def from_connect_code(code: str, message: str) -> ForkboxError:
    """An error from a Connect code ("not_found") and message."""
    return error_class(_CONNECT_CODES.get(code, "Unknown"))(message)


def from_http_status(status: int, message: str) -> ForkboxError:
    return error_class(_HTTP_STATUS.get(status, "Unknown"))(message)


class ExecError(Exception):
    """A command that ran to its end but did not succeed: non-zero exit,
    killed by a signal, timed out or OOM-killed. ``Execution.wait()`` raises
    it unless called with ``check=False``; ``result`` holds the whole outcome."""

    def __init__(self, command: str, result: "ExecResult") -> None:
        if result.timed_out:
            why = "timed out"
        elif result.oom_killed:
            why = "was killed: out of memory"
        elif result.signal:
            why = f"was killed by {result.signal}"
        else:
            why = f"exited with code {result.exit_code}"
        tail = "\n".join(result.stderr.strip().split("\n")[-5:])
        super().__init__(f"command {command!r} {why}" + (f": {tail}" if tail else ""))
        self.command = command
        self.result = result
        self.exit_code = result.exit_code
