"""The Work the gradsync process group returns: an operation in flight in the daemon.

torch calls it in two ways. Python (`dist.all_reduce(t)`, `work.wait()` after `async_op=True`)
calls wait() on this object, which waits for the daemon on the calling thread: no thread in
between, so a small synchronous collective costs the client's round trip and little more. C++
(DDP's reducer, which asks for get_future() and chains on it) gets a torch Future that the
group's waiter thread sees done once the daemon is, and a callback thread completes
(_pg_waiter), so backward goes on meanwhile.

Lifetime: C++ holds a Python Work subclass by a pointer that does not keep the Python object
alive, and a call on it after the object is gone reaches the base class, whose wait() never
returns (torch 1.13: DDP's construction hangs). So the group keeps every Work alive until it
completes, and then the last few thousand: the last 64 with their outputs, the older ones
holding their outputs by weak references only, and none the daemon's handle (Tracker).

CUDA tensors (as NCCL's Works): the operation waits for what the caller's current stream queued
before it; wait() makes the current stream wait for the results, and blocks the host only until
the daemon has answered (it answers device operations once they are queued on its streams);
get_future() gives a device-aware future completed on the stream current at its first call.

Staging: two async collectives of one layout in flight at once need two staging sets (the
second would wait for the first to finish). The group picks the set by a slot per layout that
moves on when the layout's last Work was not waited for (wait(), result(), synchronize())
before the next call: program order, the same on every rank, unlike completion. A loop of
synchronous calls keeps one set per layout; DDP's buckets (never waited, only futures) rotate
through `slots` of them (Slots).

Errors: wait() raises gradsync's error as torch raises its own (_pg_errors). A torch 1.13
Future cannot carry an exception to DDP's reducer (it reads set_exception's exception as the
bucket's value), so, as the DDP hook does, the failure is raised at the end of backward by a
callback queued when the future was asked for, and the future gets it too.
"""
import collections
import contextlib
import ctypes
import datetime
import functools
import threading
import time
import weakref

import torch
from torch._C._distributed_c10d import Work as _TorchWork

from .. import _lib
from ..errors import TimeoutError as _Timeout
from . import ddp
from ._pg_errors import as_torch
from ._pg_waiter import Waiter


class _Waited:
    """Whether a Work was waited for; Slots keeps this, not the Work (and its tensors).

    Only a wait on the thread that started the collective counts: that thread's program order
    is the same on every rank, while a wait on another thread (a communication thread that
    waits for the Works the training thread starts) happens before or after the next
    collective as timing has it, which differs by rank, and ranks that chose different
    staging sets for one collective would fail the job."""
    __slots__ = ("flag", "thread")

    def __init__(self):
        self.flag = False
        self.thread = threading.get_ident()

    def note(self):
        """The Work is being waited for, here."""
        if threading.get_ident() == self.thread:
            self.flag = True


def _weak(value):
    """Tensors (in lists, nested) as weak references: a completed Work kept alive for C++ must
    not keep a caller's outputs alive for long (Tracker)."""
    if isinstance(value, torch.Tensor):
        return weakref.ref(value)
    if isinstance(value, (list, tuple)):
        return [_weak(v) for v in value]
    return value


def _strong(value):
    """_weak() undone; raises when a tensor is gone, rather than returning a shorter list."""
    if isinstance(value, weakref.ref):
        tensor = value()
        if tensor is None:
            raise RuntimeError("gradsync backend: this Work's outputs were freed (nothing else held them) before "
                               "result() or get_future() asked for them")
        return tensor
    if isinstance(value, list):
        return [_strong(v) for v in value]
    return value


def _seconds(timeout):
    """torch's wait(timeout): a timedelta, where zero (the default) means no limit."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
        return None if seconds <= 0 else seconds
    return None if timeout <= 0 else float(timeout)


def _left(deadline):
    """Seconds to a time.monotonic() deadline (None: no limit)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _backward_end(outcome, waited):
    """At the end of the backward that asked for a future (DDP's reducer, in program order):
    its Work counts as waited for (Slots), and its failure is raised (ddp._raise_failed)."""
    waited.flag = True
    ddp._raise_failed(outcome)


def _at_backward_end(outcome, waited):
    try:
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_backward_end, outcome, waited))
    except RuntimeError:  # "Final callbacks can only be installed during backward pass"
        return False
    return True


class ForeignWork:
    """A Work of another backend (the gloo fallback's barrier) that a gradsync barrier waits
    for among its earlier Works: what GradsyncWork._complete and _poll ask of those."""

    def __init__(self, work, aborted=lambda: None):
        self._work = work
        self._aborted = aborted  # the group's abort error once it was aborted, else None
        self._done = False

    def _poll(self):
        return self._done or self._work.is_completed()

    def _complete(self, timeout=None, stream=None):
        """Waits (at most `timeout` seconds: then gradsync's TimeoutError, the caller's limit,
        and the work goes on) and raises the work's error; raises the group's abort error once
        it is aborted (gloo's own work may go on: its abort does not end it). Polled: gloo's
        wait(timeout) raises its timeout as the work's failure, and takes zero for none."""
        if self._done:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while not self._work.is_completed():
            if (error := self._aborted()) is not None:
                raise error
            if deadline is not None and time.monotonic() >= deadline:
                raise _Timeout(f"gradsync backend: the gloo fallback's work did not complete within {timeout:g} s "
                               "(it is still running)")
            pause = min(pause * 2, 0.002)  # a barrier ends at most 2 ms after gloo's
            time.sleep(pause)
        self._work.wait()
        self._done = True


class GradsyncWork(_TorchWork):
    """One collective: `work` (a gradsync.Work, or None when the call completed it), then
    `finish(value)` (copies the daemon's results into the caller's tensors; None when the work
    wrote them in place), and `result`, the tensors torch's Work.result() and the future hold.
    `after`: Works that must be complete before this one is (a barrier's earlier collectives).

    The daemon's answer is waited for outside any lock (the library's wait, which a gradsync
    Work allows from several threads at once); then, under the lock, once, the library's own
    finisher (the copy back out of the staging area) and `finish` run on one stream, which
    records the done event every other stream waits for. So is_completed() never blocks on the
    daemon, wait(timeout) keeps its bound while the waiter thread waits too, and a new
    collective is never held up by an earlier one."""

    def __init__(self, tracker, work, finish, result, after=()):
        super().__init__()
        self._tracker = tracker
        self._work = work
        self._finish = finish
        self._result = result
        self._after = list(after)
        # -1: host tensors, else the GPU (a sparse reduction's finished Work says nothing: host).
        self._device = -1 if work is None else getattr(work, "_device", -1)
        self._done_event = None  # CUDA: recorded where the results were made ready
        self._error = None
        self._done = work is None and not self._after
        self.waited = _Waited()  # waited for in program order (Slots)
        self._future = None
        self._lock = threading.Lock()
        tracker.started(self)

    @classmethod
    def failed(cls, tracker, error, result):
        """A Work whose operation could not start: every wait raises `error`."""
        work = cls(tracker, None, None, result)
        work._error = error
        return work

    def _wait_daemon(self, timeout, stream):
        """Waits, outside the lock, until the daemon answered (and, CUDA, `stream` waits on the
        GPU for the results); None, or the operation's error. Raises the caller's own timeout,
        after which the operation goes on."""
        work = self._work
        if work is None:
            return None
        lib = _lib.lib()
        try:
            if self._device >= 0:
                work._call_wait(lib.gs_work_wait_stream, ctypes.c_void_p(stream.cuda_stream), timeout=timeout)
            else:
                work._call_wait(lib.gs_work_wait, timeout=timeout)
            return None
        except _Timeout as e:
            try:
                done = work.is_completed()
            except Exception as failed:  # noqa: BLE001 (its error is the operation's)
                return failed
            if timeout is not None and not done:
                raise as_torch(e) from None  # the caller's limit: the operation goes on
            return self._wait_daemon(None, stream) if timeout is not None else e
        except Exception as e:  # noqa: BLE001 (every failure is the operation's)
            return e

    def _complete(self, timeout=None, stream=None):
        """Waits (at most `timeout` seconds; None: until the daemon answers) and finishes, once.
        CUDA: `stream` (None: the current one) waits for the results on the GPU and the copies
        into the caller's tensors are queued on it; the host waits only for the daemon's answer.
        Raises the operation's error, as torch raises its own, on every call after a failure."""
        if self._device >= 0 and stream is None:
            stream = torch.cuda.current_stream(self._device)
        if not self._done:
            deadline = None if timeout is None else time.monotonic() + timeout
            # A barrier: the collectives before it first; the first error among them is its.
            failed = None
            for earlier in self._after:
                try:
                    earlier._complete(_left(deadline))
                except Exception as e:  # noqa: BLE001
                    if isinstance(e, _Timeout) and not earlier._done:
                        raise  # the caller's limit
                    failed = failed or e
            failed = self._wait_daemon(_left(deadline), stream) or failed
            with self._lock:
                if not self._done:
                    self._finish_once(failed, stream)
        if self._error is not None:
            raise self._error
        if self._done_event is not None:
            # Finished on another stream or thread (the waiter's, an earlier wait): this stream
            # waits for the results too (a no-op on the stream that finished it).
            stream.wait_event(self._done_event)

    def _finish_once(self, failed, stream):
        """Under the lock, once: the library's finisher and `finish` on `stream`, the done event."""
        try:
            if failed is not None:
                raise failed
            with torch.no_grad():  # the outputs may be parameters (FSDP's, say)
                if self._device >= 0:
                    with torch.cuda.stream(stream):
                        value = self._work.wait_stream(stream) if self._work is not None else None
                        if self._finish is not None:
                            self._finish(value)
                        self._done_event = torch.cuda.Event()
                        self._done_event.record(stream)
                else:
                    # _wait_daemon waited already: only the library's finisher is left to run.
                    value = self._work._complete(None) if self._work is not None else None
                    if self._finish is not None:
                        self._finish(value)
        except Exception as e:  # noqa: BLE001 (every failure is the operation's)
            self._error = as_torch(e)
        self._done = True
        self._work = self._finish = None
        self._after = []
        self._tracker.completed(self)

    def _poll(self):
        """Whether the daemon has answered and the Works before it are done, without waiting or
        finishing anything (the Tracker's sweep)."""
        if self._done:
            return True
        work = self._work
        if work is not None:
            done = ctypes.c_int32(0)
            if _lib.lib().gs_work_is_completed(work._handle, ctypes.byref(done)) != 0 or not done.value:
                return bool(done.value)
        return all(earlier._poll() for earlier in self._after)

    # --- torch's Work -------------------------------------------------------------------------

    def wait(self, timeout=None):
        """Host tensors: blocks until the results are in place. CUDA tensors (as NCCL's Work):
        the caller's current stream waits for them, the host only for the daemon's answer."""
        self.waited.note()
        self._complete(_seconds(timeout))
        return True

    def is_completed(self):
        """True once the operation is done and its results are in the caller's tensors, as
        torch promises (then it counts as waited for: a program that polls and waits only when
        not done chooses staging sets as one that always waits). Never waits for the daemon:
        only, briefly, for another thread that is putting the same results in place. Device
        results are copied back on the current stream here, and True once the GPU is through."""
        if not self._poll():
            return False
        self.waited.note()
        try:
            self._complete()
        except Exception:  # noqa: BLE001 (done, failed: exception() and wait() have it)
            return True
        if self._device >= 0 and self._done_event is not None:
            return bool(self._done_event.query())
        return True

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.waited.note()
        self._complete()
        return _strong(self._result)

    def synchronize(self):
        self.waited.note()
        self._complete()

    def get_future(self):
        """A torch Future of the outputs, the same one on every call. CUDA: a device-aware
        future, completed on the stream that was current at the first call, as NCCL's are."""
        outputs = _strong(self._result)  # first: a Work whose outputs are gone raises here
        with self._lock:
            if self._future is not None:
                return self._future
            stream = None
            if self._device >= 0:
                future = torch.futures.Future(devices=[torch.device("cuda", self._device)])
                stream = torch.cuda.current_stream(self._device)
            else:
                future = torch.futures.Future()
            self._future = future
            done = self._done and self._error is None
        outcome = ddp._Outcome()
        # Counts as waited for at the end of the backward that asked (Slots), however it is
        # completed: whether the daemon was done already is timing, which differs by rank.
        _at_backward_end(outcome, self.waited)
        if done or self._tracker.inline_futures:
            # Done; or the group completes futures where they are asked for (inline_futures(),
            # for hooks that start collectives in callbacks): completed here.
            try:
                self._complete(stream=stream)
            except Exception as e:  # noqa: BLE001 (raised at the end of backward, and by the future)
                outcome.fail(future, e)
                return future
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():  # where it records
                    future.set_result(outputs)
            finally:
                outcome.done.set()  # the end of backward never waits for it, whatever set_result did
            return future
        self._tracker.waiter().queue.put((self, outputs, future, stream, outcome))
        return future


class Tracker:
    """Keeps the group's Works alive (see the module's note): every one in flight, the last
    `strong` completed ones with their outputs, and the `keep` before those holding their outputs
    by weak references only. Sweeps completed ones on each start, so that an async Work nobody
    waits for does not pile up."""

    def __init__(self, strong=64, keep=4096):
        self._lock = threading.Lock()
        self._in_flight = {}
        self._recent = collections.deque()
        self._strong = strong
        self._completed = collections.deque(maxlen=keep)
        self._waiter = None
        # get_future() completes the Work on the calling thread, blocking it until the daemon is
        # done, so that callbacks run there, in program order (inline_futures()).
        self.inline_futures = False

    def started(self, work):
        with self._lock:
            pending = list(self._in_flight.values())
            if not work._done:
                self._in_flight[id(work)] = work
        if work._done:
            self.completed(work)
        for earlier in pending:
            # Host Works the daemon is done with are finished (their copies back) and moved out;
            # device Works and barriers are left to their waits, which never block here.
            if earlier._device >= 0 or earlier._after or not earlier._poll() or earlier._lock.locked():
                continue
            try:
                earlier._complete()
            except Exception:  # noqa: BLE001 (its own wait() raises it; this call's Work is made)
                pass

    def completed(self, work):
        with self._lock:
            self._in_flight.pop(id(work), None)
            self._recent.append(work)
            if len(self._recent) > self._strong:
                old = self._recent.popleft()
                old._result = _weak(old._result)
                if old._future is not None and old._future.done():
                    old._future = None  # it holds the outputs too
                self._completed.append(old)

    def in_flight(self):
        """The Works in flight now, oldest first (a barrier finishes them)."""
        with self._lock:
            return list(self._in_flight.values())

    def waiter(self):
        with self._lock:
            if self._waiter is None:
                self._waiter = Waiter()
            return self._waiter

    def close(self):
        """The group is done with: its waiter thread completes the futures it was handed and
        ends (one thread per group would pile up in a program that makes groups in a loop)."""
        with self._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.stop()

    def __del__(self):
        self.close()


class Slots:
    """Which staging set of a layout a collective uses (the module's note): up to `count` per
    layout, chosen from program order only, so every rank chooses alike."""

    def __init__(self, count=4):
        self._count = count
        self._last = {}  # layout -> (slot, the _Waited of the Work that used it last)

    def slot(self, layout):
        """The slot for the next collective of `layout`; call note() with its Work."""
        slot, waited = self._last.get(layout, (0, None))
        if waited is not None and not waited.flag:
            slot = (slot + 1) % self._count
        return slot

    def note(self, layout, slot, work):
        self._last[layout] = (slot, work.waited)
