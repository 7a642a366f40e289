"""sync_params: the seeds' _sync_params. Every rank's parameters and buffers become the root's."""
import torch

from . import _coalesced


def sync_params(module, client, root=0):
    """Broadcasts module's parameters and buffers from rank `root`, in place, and waits."""
    tensors = [t.data for t in module.parameters()] + [b for b in module.buffers()]
    # bool buffers (masks) travel as their bytes
    tensors = [t.view(torch.uint8) if t.dtype == torch.bool else t for t in tensors if t.numel() > 0]
    if not tensors:
        return
    by_device = {}
    for t in tensors:
        by_device.setdefault(str(t.device), []).append(t)
    works = [_coalesced.broadcast(client, group, root, None) for group in by_device.values()]
    for work in works:
        work.wait()
