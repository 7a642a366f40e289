"""PyTorch integration: GradBuffer, the DDP comm hook, sync_params, MasterParams. Imports torch."""
from .ddp import allreduce_hook
from .grad_buffer import GradBuffer
from ._memory import empty
from .master_params import MasterParams
from .params import sync_params

__all__ = ["GradBuffer", "MasterParams", "allreduce_hook", "empty", "sync_params"]
