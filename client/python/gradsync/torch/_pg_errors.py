"""gradsync's errors as torch.distributed raises its own, for the process group's callers.

Code written against torch.distributed catches what torch's backends raise: RuntimeError on
torch 1.13, torch.distributed.DistBackendError (a RuntimeError) on torch 2.x. A gradsync error
that leaves the backend is therefore re-made as a class deriving from both its gradsync class
and that torch class, with gradsync's text: `except RuntimeError`, `except DistBackendError`,
`except gradsync.PeerLostError` and `except ConnectionError` all catch a lost rank. Bad
arguments stay gradsync.InvalidArgumentError, a ValueError, as torch's own checks raise.
"""
import functools

import torch.distributed as dist

from ..errors import Error, InvalidArgumentError

# torch 2.1 and later: DistBackendError; torch 1.13: RuntimeError.
_TORCH_BASE = getattr(dist, "DistBackendError", RuntimeError)


@functools.cache
def _combined(cls):
    """The combined class for one gradsync class, made once (so that `type(a) is type(b)` holds
    for two errors of one kind)."""
    return type(cls.__name__, (cls, _TORCH_BASE),
                {"__module__": "gradsync.torch",
                 "__doc__": f"{cls.__name__}, raised as torch's {_TORCH_BASE.__name__} by the gradsync process group"})


def as_torch(error):
    """`error` (a gradsync.Error) as torch's backends raise theirs; any other exception as it is."""
    if not isinstance(error, Error) or isinstance(error, (InvalidArgumentError, _TORCH_BASE)):
        return error
    made = _combined(type(error))(*error.args)
    made.code = error.code
    return made.with_traceback(error.__traceback__)
