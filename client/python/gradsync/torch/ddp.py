"""allreduce_hook: gradsync as a DDP communication hook.

    ddp_model.register_comm_hook(client, gradsync.torch.allreduce_hook)

DDP hands the hook its own bucket buffers, so they go through the client's staging area (one
per bucket index and layout), averaged across the ranks of the job ("dp"), or of a group:
pass (client, "group") as the state, the same ranks as DDP's process_group. The returned
future completes from a waiter thread once the daemon queued (CUDA: stream-ordered, on the
stream backward ran on, as with NCCL) or finished (CPU) the reduction, so backward never
blocks on it.

When a reduction fails (a rank lost, the daemon stopping, the job's timeout), backward() raises
gradsync's own error (gradsync.PeerLostError, ...) with its text, on every PyTorch. DDP's
reducer cannot carry a Python exception itself: it reads a failed future's value as the bucket
tensor (Future.set_exception stores the exception as the value: "RuntimeError: Unable to cast
... to Tensor"), and turns an exception raised by the hook into a RuntimeError. So the hook
never raises into the reducer: each call queues a callback at the end of backward, which runs
before the reducer's (queued after the last bucket's hook call), waits for that bucket's
reduction, and raises its error as it is. The future fails with the same error too (its
wait() raises it), for a caller that runs the hook outside backward.
"""
import functools
import queue
import threading

import torch

from . import _coalesced, sparse


class _Outcome:
    """One hook call's result: `done` once its future is complete; `error`, the exception its
    reduction failed with, if it did."""
    __slots__ = ("done", "error")

    def __init__(self):
        self.done = threading.Event()
        self.error = None

    def fail(self, future, error):
        self.error = error
        try:
            future.set_exception(error)
        except Exception:  # already completed (set_result itself failed): the error is raised anyway
            pass
        finally:
            self.done.set()


class _Waiter:
    """One thread per client that waits for CPU works and completes their futures."""

    def __init__(self):
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="gradsync-ddp-waiter", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            work, future, tensor, stream, outcome = self.queue.get()
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
                outcome.done.set()
            except Exception as e:  # _raise_failed raises it at the end of backward
                outcome.fail(future, e)
            # Hold nothing between items: the last work would keep the client alive.
            work = future = tensor = stream = outcome = None


def _waiter(client):
    waiter = getattr(client, "_ddp_waiter", None)
    if waiter is None:
        waiter = client._ddp_waiter = _Waiter()
    return waiter


def _raise_failed(outcome):
    outcome.done.wait()
    error, outcome.error = outcome.error, None
    if error is not None:
        raise error


def _at_backward_end(outcome):
    """Queues _raise_failed(outcome) at the end of the running backward; False outside one."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_raise_failed, outcome))
    except RuntimeError:  # "Final callbacks can only be installed during backward pass"
        return False
    return True


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def allreduce_hook(state, bucket):
    """DDP comm hook: averages the bucket across every rank of the client's job, or of a group
    when the state is (client, group). When the reduction fails, backward() raises gradsync's
    error (gradsync.PeerLostError when a rank was lost, ...), not a RuntimeError."""
    client, group = state if isinstance(state, tuple) else (state, None)
    tensor = _bucket_tensor(bucket)
    if tensor.is_cuda:
        future = torch.futures.Future(devices=[tensor.device])
        stream = torch.cuda.current_stream(tensor.device)
    else:
        future = torch.futures.Future()
        stream = None
    outcome = _Outcome()
    if tensor.is_sparse:
        # A sparse gradient (nn.Embedding(sparse=True)): gathered and summed in the call
        # (gradsync.torch.sparse); DDP takes the coalesced average as the parameter's gradient.
        try:
            future.set_result(sparse.allreduce(client, [tensor], "avg", None, group).wait()[0])
        except Exception as e:
            outcome.fail(future, e)
            if not _at_backward_end(outcome):
                raise
            return future
        outcome.done.set()
        return future
    try:
        work = _coalesced.allreduce(client, [tensor], "avg", None, False, None, 0, group,
                                    tag=("ddp", bucket.index()))
    except Exception as e:  # the job failed already, say: raised at the end of backward, as it is
        outcome.fail(future, e)
        if not _at_backward_end(outcome):
            raise
        return future
    _waiter(client).queue.put((work, future, tensor, stream, outcome))
    _at_backward_end(outcome)
    return future
