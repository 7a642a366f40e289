"""allreduce_hook: gradsync as a DDP communication hook.

    ddp_model.register_comm_hook(client, gradsync.torch.allreduce_hook)

DDP hands the hook its own bucket buffers, so they go through the client's staging area (one
per bucket index and layout), averaged across the ranks of the job ("dp"), or of a group:
pass (client, "group") as the state, the same ranks as DDP's process_group. The returned
future completes from a waiter thread once the daemon queued (CUDA: stream-ordered, on the
stream backward ran on, as with NCCL) or finished (CPU) the reduction, so backward never
blocks on it.
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
            work, future, tensor, stream = self.queue.get()
            try:
                if stream is None:
                    work.wait()
                    future.set_result(tensor)
                else:
                    # The CUDA future records its events on this thread's current stream: make
                    # that the stream backward queued the bucket on.
                    with torch.cuda.stream(stream):
                        work.wait_stream(stream)
                        future.set_result(tensor)
            except Exception as e:  # the future carries it to DDP, which raises it in backward
                future.set_exception(e)
            # Hold nothing between items: the last work would keep the client alive.
            work = future = tensor = stream = None


def _waiter(client):
    waiter = getattr(client, "_ddp_waiter", None)
    if waiter is None:
        waiter = client._ddp_waiter = _Waiter()
    return waiter


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def allreduce_hook(state, bucket):
    """DDP comm hook: averages the bucket across every rank of the client's job, or of a group
    when the state is (client, group)."""
    client, group = state if isinstance(state, tuple) else (state, None)
    tensor = _bucket_tensor(bucket)
    work = _coalesced.allreduce(client, [tensor], "avg", None, False, None, 0, group, tag=("ddp", bucket.index()))
    if tensor.is_cuda:
        future = torch.futures.Future(devices=[tensor.device])
        stream = torch.cuda.current_stream(tensor.device)
    else:
        future = torch.futures.Future()
        stream = None
    _waiter(client).queue.put((work, future, tensor, stream))
    return future
