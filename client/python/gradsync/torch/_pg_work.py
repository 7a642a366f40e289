"""The Work the gradsync process group returns: an operation in flight in the daemon.

torch calls it in two ways. Python (`dist.all_reduce(t)`, `work.wait()` after `async_op=True`)
calls wait() on this object, which waits for the daemon on the calling thread: no thread in
between, so a small synchronous collective costs the client's round trip and little more. C++
(DDP's reducer, which asks for get_future() and chains on it) gets a torch Future that the
group's waiter thread completes once the daemon is done, so backward goes on meanwhile.

Lifetime: C++ holds a Python Work subclass by a pointer that does not keep the Python object
alive, and a call on it after the object is gone reaches the base class, whose wait() never
returns (torch 1.13: DDP's construction hangs). So the group keeps every Work alive until it
completes, and then the last few thousand, which hold their outputs by weak references only and
the daemon's handle no more (Tracker).

CUDA tensors (as NCCL's Works): the operation waits for what the caller's current stream queued
before it; wait() makes the current stream wait for the results, and blocks the host only until
the daemon has answered (it answers device operations once they are queued on its streams);
get_future() gives a device-aware future completed on the stream current at that call.

Errors: wait() raises gradsync's error as torch raises its own (_pg_errors). A torch 1.13
Future cannot carry an exception to DDP's reducer (it reads set_exception's exception as the
bucket's value), so, as the DDP hook does, the failure is raised at the end of backward by a
callback queued when the future was asked for, and the future gets it too.
"""
import collections
import contextlib
import datetime
import queue
import threading
import weakref

import torch
from torch._C._distributed_c10d import Work as _TorchWork

from ..errors import TimeoutError as _Timeout
from . import ddp
from ._pg_errors import as_torch


def _weak(value):
    """Tensors (in lists, nested) as weak references: a completed Work kept alive for C++ must
    not keep a caller's outputs alive too."""
    if isinstance(value, torch.Tensor):
        return weakref.ref(value)
    if isinstance(value, (list, tuple)):
        return [_weak(v) for v in value]
    return value


def _strong(value):
    """_weak() undone; a tensor nobody holds any more is left out."""
    if isinstance(value, weakref.ref):
        return value()
    if isinstance(value, list):
        return [s for s in (_strong(v) for v in value) if s is not None]
    return value


def _seconds(timeout):
    """torch's wait(timeout): a timedelta, where zero (the default) means no limit."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
        return None if seconds <= 0 else seconds
    return None if timeout <= 0 else float(timeout)


class GradsyncWork(_TorchWork):
    """One collective: `work` (a gradsync.Work, or None when the call completed it), then
    `finish(value)` (copies the daemon's results into the caller's tensors; None when the work
    wrote them in place), and `result`, the tensors torch's Work.result() and the future hold."""

    def __init__(self, tracker, work, finish, result):
        super().__init__()
        self._tracker = tracker
        self._work = work
        self._finish = finish
        self._result = result
        self._device = -1 if work is None else work._device  # -1: host tensors, else the GPU
        self._done_event = None  # CUDA: recorded where the results were made ready
        self._error = None
        self._done = work is None
        self._lock = threading.Lock()  # the waiter thread and the caller may both complete it
        tracker.started(self)

    def _complete(self, timeout=None, stream=None):
        """Waits (at most `timeout` seconds; None: until the daemon answers) and finishes, once.
        CUDA: `stream` (None: the current one) waits for the results on the GPU and the copies
        into the caller's tensors are queued on it; the host waits only for the daemon's answer.
        Raises the operation's error, as torch raises its own, on every call after a failure."""
        with self._lock:
            if not self._done:
                try:
                    if self._device >= 0:
                        stream = stream if stream is not None else torch.cuda.current_stream(self._device)
                        with torch.cuda.stream(stream):
                            value = self._work.wait_stream(stream, timeout)
                            if self._finish is not None:
                                with torch.no_grad():
                                    self._finish(value)
                            self._done_event = torch.cuda.Event()
                            self._done_event.record(stream)
                    else:
                        value = self._work.wait(timeout)
                        if self._finish is not None:
                            with torch.no_grad():  # the outputs may be parameters (FSDP's, say)
                                self._finish(value)
                except _Timeout as e:
                    if timeout is not None and not self._work.is_completed():
                        raise as_torch(e) from None  # the caller's limit: the operation goes on
                    self._error = as_torch(e)
                except Exception as e:  # noqa: BLE001 (every failure is the operation's)
                    self._error = as_torch(e)
                self._done = True
                self._work = self._finish = None
                self._result = _weak(self._result)
                self._tracker.completed(self)
        if self._error is not None:
            raise self._error
        if self._done_event is not None:
            # Completed on another stream or thread (the waiter's, an earlier wait): this
            # stream waits for the results too (a no-op on the stream that completed it).
            (stream if stream is not None else torch.cuda.current_stream(self._device)).wait_event(self._done_event)

    # --- torch's Work -------------------------------------------------------------------------

    def wait(self, timeout=None):
        """Host tensors: blocks until the results are in place. CUDA tensors (as NCCL's Work):
        the caller's current stream waits for them, the host only for the daemon's answer."""
        self._complete(_seconds(timeout))
        return True

    def is_completed(self):
        if self._done:
            return True
        with self._lock:
            work = self._work
        if work is not None and not work.is_completed():
            return False
        try:
            self._complete()
        except Exception:  # noqa: BLE001 (wait() raises it)
            pass
        return True

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self._complete()
        return _strong(self._result)

    def synchronize(self):
        self._complete()

    def get_future(self):
        """A torch Future of the outputs. CUDA: a device-aware future, completed on the stream
        that was current here, as NCCL's are."""
        stream = None
        if self._device >= 0:
            future = torch.futures.Future(devices=[torch.device("cuda", self._device)])
            stream = torch.cuda.current_stream(self._device)
        else:
            future = torch.futures.Future()
        if self._done and self._error is None:
            if stream is not None and self._done_event is not None:
                stream.wait_event(self._done_event)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():  # where the future records
                future.set_result(_strong(self._result))
            return future
        outcome = ddp._Outcome()
        ddp._at_backward_end(outcome)
        # The outputs, held until the future has them (the Work itself lets go once complete).
        self._tracker.waiter().queue.put((self, _strong(self._result), future, stream, outcome))
        return future


class _Waiter:
    """The thread that completes the futures of get_future(), one Work after another."""

    def __init__(self):
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="gradsync-pg-waiter", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            work, outputs, future, stream, outcome = self.queue.get()
            try:
                if stream is None:
                    work._complete()
                    future.set_result(outputs)
                else:
                    # The future records its events on this thread's current stream: make that
                    # the stream the caller asked on.
                    with torch.cuda.stream(stream):
                        work._complete(stream=stream)
                        future.set_result(outputs)
                outcome.done.set()
            except Exception as e:  # noqa: BLE001 (raised at the end of backward, and by the future)
                outcome.fail(future, e)
            work = outputs = future = stream = outcome = None  # hold nothing between items


class Tracker:
    """Keeps the group's Works alive (see the module's note): every one in flight, and the last
    `keep` completed ones, which then hold no tensors. Sweeps completed ones on each start, so
    that an async Work nobody waits for does not pile up."""

    def __init__(self, keep=4096):
        self._lock = threading.Lock()
        self._in_flight = {}
        self._completed = collections.deque(maxlen=keep)
        self._waiter = None

    def started(self, work):
        with self._lock:
            pending = list(self._in_flight.values())
            if not work._done:
                self._in_flight[id(work)] = work
            else:
                self._completed.append(work)
        for earlier in pending:
            earlier.is_completed()  # completes it (and moves it) when the daemon is done with it

    def completed(self, work):
        with self._lock:
            self._in_flight.pop(id(work), None)
            self._completed.append(work)

    def in_flight(self):
        with self._lock:
            return len(self._in_flight)

    def waiter(self):
        with self._lock:
            if self._waiter is None:
                self._waiter = _Waiter()
            return self._waiter
