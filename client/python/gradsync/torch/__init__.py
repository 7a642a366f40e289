"""PyTorch integration: GradBuffer, the DDP comm hook, sync_params. Imports torch."""
from .ddp import allreduce_hook
from .grad_buffer import GradBuffer
from ._memory import empty
from .params import sync_params

__all__ = ["GradBuffer", "allreduce_hook", "empty", "sync_params"]
