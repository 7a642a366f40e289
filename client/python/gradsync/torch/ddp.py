"""allreduce_hook: gradsync as a DDP communication hook.

    ddp_model.register_comm_hook(client, gradsync.torch.allreduce_hook)

DDP hands the hook its own bucket buffers, so they go through the client's staging area (one
per bucket index and layout), averaged across the job's ranks. The returned future completes
when the reduction did: on CUDA at once, stream-ordered (the current stream waits for the
results, as with NCCL); on CPU from a waiter thread once the daemon answered.
"""
import queue
import threading

import torch

from . import _coalesced


class _Waiter:
    """One thread per client that waits for CPU works and completes their futures."""

    def __init__(self):
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="gradsync-ddp-waiter", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            work, future, tensor = self.queue.get()
            try:
                work.wait()
            except Exception as e:  # the future carries it to DDP, which raises it in backward
                future.set_exception(e)
            else:
                future.set_result(tensor)


def _waiter(client):
    waiter = getattr(client, "_ddp_waiter", None)
    if waiter is None:
        waiter = client._ddp_waiter = _Waiter()
    return waiter


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def allreduce_hook(client, bucket):
    """DDP comm hook: averages the bucket across every rank of the client's job."""
    tensor = _bucket_tensor(bucket)
    work = _coalesced.allreduce(client, [tensor], "avg", None, False, None, 0, None, tag=("ddp", bucket.index()))
    if tensor.is_cuda:
        future = torch.futures.Future(devices=[tensor.device])
        work.wait_stream()
        future.set_result(tensor)
        return future
    future = torch.futures.Future()
    _waiter(client).queue.put((work, future, tensor))
    return future
