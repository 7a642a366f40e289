"""PyTorch integration: GradBuffer, the DDP comm hook, sync_params, MasterParams, and the
torch.distributed backend "gradsync" (registered on import; client_of(group) is its client,
inline_futures(group) orders future callbacks for hooks such as PowerSGD, Options its
pg_options).
Imports torch."""
from . import backend as _backend
from ._pg_fallback import Options
from .backend import client_of, inline_futures
from .ddp import HookState, allreduce_hook
from .grad_buffer import GradBuffer
from ._memory import empty
from .master_params import MasterParams
from .params import sync_params

__all__ = ["GradBuffer", "HookState", "MasterParams", "Options", "allreduce_hook", "client_of", "empty", "inline_futures", "sync_params"]

_backend.register()
