"""gradsync's errors as torch.distributed raises its own, for the process group's callers.

Code written against torch.distributed catches what torch's backends raise: RuntimeError on
torch 1.13, torch.distributed.DistBackendError (a RuntimeError) on torch 2.x. A gradsync error
that leaves the backend is therefore re-made as a class deriving from both its gradsync class
and that torch class, with gradsync's text: `except RuntimeError`, `except DistBackendError`,
`except gradsync.PeerLostError` and `except ConnectionError` all catch a lost rank. Bad
arguments stay gradsync.InvalidArgumentError, a ValueError, as torch's own checks raise.
"""
import torch.distributed as dist

from ..errors import _BY_CODE, Error, InvalidArgumentError

# torch 2.1 and later: DistBackendError; torch 1.13: RuntimeError.
_TORCH_BASE = getattr(dist, "DistBackendError", RuntimeError)


def _combined_classes():
    """One combined class per gradsync class, made at import and set as attributes of this
    module under their own names (TorchPeerLostError, ...), so that their errors pickle (a pool
    or an RPC that sends an exception back pickles it by its class's module and name)."""
    made = {}
    for cls in [Error, *_BY_CODE.values()]:
        name = "Torch" + cls.__name__
        combined = type(name, (cls, _TORCH_BASE), {
            "__module__": __name__,
            "__doc__": f"{cls.__name__}, raised as torch's {_TORCH_BASE.__name__} by the gradsync process group"})
        globals()[name] = combined
        made[cls] = combined
    return made


_COMBINED = _combined_classes()


def as_torch(error):
    """`error` (a gradsync.Error) as torch's backends raise theirs; any other exception as it is."""
    if not isinstance(error, Error) or isinstance(error, (InvalidArgumentError, _TORCH_BASE)):
        return error
    made = _COMBINED.get(type(error), _COMBINED[Error])(*error.args)
    made.code = error.code
    return made.with_traceback(error.__traceback__)
