"""allreduce_hook: gradsync as a DDP communication hook.

    ddp_model.register_comm_hook(client, gradsync.torch.allreduce_hook)

DDP hands the hook its own bucket buffers, so they go through the client's staging area (one
per bucket index and layout), averaged across the ranks of the job ("dp"), or of a group:
pass (client, "group") as the state, the same ranks as DDP's process_group. What crosses nodes
is chosen with HookState(client, group=None, wire_dtype=None) as the state: wire_dtype takes
what the backend's Options(wire_dtype=...) takes, with the same rules (gradsync.torch._wire). The returned
future completes from a waiter thread once the daemon queued (CUDA: stream-ordered, on the
stream backward ran on, as with NCCL) or finished (CPU) the reduction, so backward never
blocks on it. Its callbacks run on the waiter's callback threads (_pg_waiter), in order; a
callback that waits for a later bucket's future does not hold that future up.

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
import threading

import torch

from ..client import Client
from ..errors import InvalidArgumentError
from . import _coalesced, _wire, sparse
from ._pg_waiter import Waiter


class HookState(tuple):
    """allreduce_hook's state with every option: the client, the group its buckets are averaged
    over (None: the job's "dp"), and what they carry between nodes (wire_dtype: None, "native",
    torch.bfloat16 or torch.float16; see gradsync.torch.Options). A tuple (client, group,
    wire_dtype), checked when made; the state may also be the client alone, or (client, group)."""
    __slots__ = ()

    def __new__(cls, client, group=None, wire_dtype=None):
        who = "gradsync.torch.HookState"
        if not isinstance(client, Client):
            raise InvalidArgumentError(f"{who}: client must be a gradsync.Client (gradsync.connect(), or "
                                       f"gradsync.torch.client_of(group)), not {type(client).__name__}")
        if group is not None and not isinstance(group, str):
            raise InvalidArgumentError(f"{who}: group must be None or the name of a group declared at connect(), "
                                       f"not {type(group).__name__} (a torch ProcessGroup is not one)")
        return super().__new__(cls, (client, group, _wire.setting(wire_dtype, who)))

    def __getnewargs__(self):
        # What copy.copy calls __new__ with: the three fields, not the tuple as the client (a
        # deepcopy or pickle fails anyway, on the client's handles).
        return tuple(self)

    client = property(lambda self: self[0])
    group = property(lambda self: self[1])
    wire_dtype = property(lambda self: self[2])

    def __repr__(self):
        return f"gradsync.torch.HookState({self.client!r}, group={self.group!r}, wire_dtype={self.wire_dtype!r})"


def _unpack(state):
    """(client, group, wire setting) of any state allreduce_hook takes."""
    if isinstance(state, HookState):
        return tuple(state)
    if isinstance(state, tuple):
        if not 1 <= len(state) <= 3:
            raise InvalidArgumentError(f"gradsync allreduce_hook: the state is a client, (client, group) or "
                                       f"HookState(client, group, wire_dtype), not a tuple of {len(state)}")
        return tuple(HookState(*state))
    return tuple(HookState(state))


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


class _HookWork:
    """A hook call's reduction as the group waiter takes it (_pg_waiter.Waiter: work._complete
    then the future completed on a callback thread, so that a callback waiting for a later
    bucket's future cannot hold that future up)."""
    __slots__ = ("work",)

    def __init__(self, work):
        self.work = work

    def _complete(self, stream=None):
        if stream is None:
            self.work.wait()
        else:
            self.work.wait_stream(stream)


def _waiter(client):
    waiter = getattr(client, "_ddp_waiter", None)
    if waiter is None:
        waiter = client._ddp_waiter = Waiter()
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
    when the state is (client, group); HookState(client, group, wire_dtype) also sets what
    crosses nodes. When the reduction fails, backward() raises gradsync's
    error (gradsync.PeerLostError when a rank was lost, ...), not a RuntimeError."""
    tensor = _bucket_tensor(bucket)
    if tensor.is_cuda:
        future = torch.futures.Future(devices=[tensor.device])
        stream = torch.cuda.current_stream(tensor.device)
    else:
        future = torch.futures.Future()
        stream = None
    outcome = _Outcome()

    def failed(error):
        """The hook's answer to an error (a bad state, a failed job): raised at the end of
        backward, as it is, and the future failed with it; raised here outside backward."""
        outcome.fail(future, error)
        if not _at_backward_end(outcome):
            raise error
        return future

    try:
        client, group, wire_setting = _unpack(state)
    except Exception as e:
        return failed(e)
    if tensor.is_sparse:
        # A sparse gradient (nn.Embedding(sparse=True)): gathered and summed in the call
        # (gradsync.torch.sparse); DDP takes the coalesced average as the parameter's gradient.
        try:
            future.set_result(sparse.allreduce(client, [tensor], "avg", None, group).wait()[0])
        except Exception as e:
            return failed(e)
        outcome.done.set()
        return future
    try:
        wire = _wire.wire_for(wire_setting, [tensor])
        work = _coalesced.allreduce(client, [tensor], "avg", None, _wire.avg_prescaled("avg", wire), None, 0, group,
                                    tag=("ddp", bucket.index()), wire_dtype=wire)
    except Exception as e:  # the job failed already, say: raised at the end of backward, as it is
        return failed(e)
    _waiter(client).queue.put((_HookWork(work), tensor, future, stream, outcome))
    _at_backward_end(outcome)
    return future
