"""gradsync.Error and one subclass per status code of the daemon (shared/status.h).

The message is the daemon's or the client library's, naming the job, the rank and the cause.
Where Python has a matching built-in exception, the class derives from it too, so
`except TimeoutError` catches gradsync's timeouts.
"""
import builtins


class Error(Exception):
    """Any failure gradsync reports. `code` is the status code's value."""
    code = 0


class InvalidArgumentError(Error, ValueError):
    code = 1


class NotSupportedError(Error):
    code = 2


class LayoutMismatchError(Error):
    code = 3


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (gradsync.TimeoutError on purpose)
    code = 4


class PeerLostError(Error, ConnectionError):
    code = 5


class ProtocolError(Error):
    code = 6


class PermissionDeniedError(Error, PermissionError):
    code = 7


class AbortedError(Error):
    code = 8


class InternalError(Error):
    code = 9


class NotFoundError(Error):
    code = 10


class AlreadyExistsError(Error):
    code = 11


class ResourceExhaustedError(Error):
    code = 12


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, NotSupportedError, LayoutMismatchError, TimeoutError, PeerLostError, ProtocolError,
    PermissionDeniedError, AbortedError, InternalError, NotFoundError, AlreadyExistsError, ResourceExhaustedError)}


def error_for(code, message):
    """The exception for a status code (Error itself for a code this version does not know)."""
    cls = _BY_CODE.get(code, Error)
    error = cls(message)
    if cls is Error:
        error.code = code
    return error
