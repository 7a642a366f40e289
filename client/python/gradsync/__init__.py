"""gradsync: the Python client of gradsyncd, the per-node gradient-reduction daemon.

    import gradsync
    client = gradsync.connect()            # under torchrun: everything from its environment
    work = client.allreduce_coalesced(grads)
    work.wait()

PyTorch integration (GradBuffer, the DDP comm hook, sync_params) is in gradsync.torch, the only
module that imports torch. The package is pure Python over libgradsync_client.so (ctypes).
"""
try:
    from ._version import __version__  # written by the build: gradsyncd's version
except ImportError:  # the sources as they are, not a build of them
    __version__ = "0+unknown"
from .client import Client, connect
from .errors import (AbortedError, AlreadyExistsError, Error, InternalError, InvalidArgumentError,
                     LayoutMismatchError, NotFoundError, NotSupportedError, PeerLostError, PermissionDeniedError,
                     ProtocolError, ResourceExhaustedError, TimeoutError)
from .work import Work

__all__ = ["connect", "Client", "Work", "Error", "InvalidArgumentError", "NotSupportedError", "LayoutMismatchError",
           "TimeoutError", "PeerLostError", "ProtocolError", "PermissionDeniedError", "AbortedError", "InternalError",
           "NotFoundError", "AlreadyExistsError", "ResourceExhaustedError"]
