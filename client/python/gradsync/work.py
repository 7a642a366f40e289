"""Work: the handle of a submitted operation, like torch.distributed's Work."""
import ctypes
import threading
import time

from . import _lib
from .errors import InvalidArgumentError, TimeoutError, error_for

# How long one blocking call into the library waits when the caller set no timeout: short
# enough that Ctrl-C is seen between calls.
_SLICE_MS = 500


class Work:
    """An operation in flight.

    wait(timeout=None) blocks until it finished (forever by default; the daemon fails
    operations that cannot finish after the job's timeout) and returns its result: None for the
    in-place operations, one list of tensors per rank for all_gather_coalesced. It raises the
    operation's error (a gradsync.Error subclass), or gradsync.TimeoutError when `timeout`
    seconds passed first (the operation goes on). Operations on CUDA tensors also have
    wait_stream(stream=None): the stream (the current one by default) waits for the results on
    the GPU, and the host does not.
    """

    def __init__(self, client, handle, finish=None, device=-1):
        self._core = client._core  # keeps the library's client (and its memory) alive while the work is
        self._handle = handle
        self._finish = finish  # copies results back, or builds them; at most once
        self._device = device
        self._result = None
        self._done = False
        self._lock = threading.Lock()  # a DDP waiter thread and the trainer may both finish it
        # Held, not looked up at __del__: a Work freed at interpreter exit finds modules gone.
        self._free = _lib.lib().gs_work_free

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and hasattr(self, "_free"):
            self._free(handle)

    def _call_wait(self, fn, *args, timeout):
        completed = ctypes.c_int32(0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ms = _SLICE_MS
            if deadline is not None:
                ms = min(_SLICE_MS, max(0, int((deadline - time.monotonic()) * 1000)))
            status = fn(self._handle, *args, ms, ctypes.byref(completed))
            if status != 0:
                raise error_for(status, _lib.last_error())
            if completed.value:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"gradsync: the operation did not complete within {timeout} s "
                                   "(it is still running; wait again or let the job's timeout fail it)")

    def _complete(self, stream):
        with self._lock:
            if not self._done:
                if self._finish is not None:
                    self._result = self._finish(stream)  # if it raises, a later wait() tries again
                    self._finish = None
                self._done = True
        return self._result

    def wait(self, timeout=None):
        if self._done:
            return self._result
        self._call_wait(_lib.lib().gs_work_wait, timeout=timeout)
        return self._complete(None)

    def wait_stream(self, stream=None, timeout=None):
        """CUDA: makes `stream` (a torch.cuda.Stream; default: the current one) wait for the results
        without blocking the host. Host tensors: the same as wait()."""
        if self._device < 0:
            return self.wait(timeout)
        if self._done:
            return self._result
        import torch  # only CUDA work gets here, and it came from gradsync.torch

        if stream is None:
            stream = torch.cuda.current_stream(self._device)
        self._call_wait(_lib.lib().gs_work_wait_stream, ctypes.c_void_p(stream.cuda_stream), timeout=timeout)
        return self._complete(stream)

    def _health(self):
        if not self._done:
            raise InvalidArgumentError("gradsync: the operation has not completed; wait for it first")
        found, norm = ctypes.c_int32(0), ctypes.c_double(0)
        status = _lib.lib().gs_work_health(self._handle, ctypes.byref(found), ctypes.byref(norm))
        if status != 0:
            raise error_for(status, _lib.last_error())
        return bool(found.value), norm.value

    def found_inf(self):
        """After an allreduce_coalesced(..., health=True) that completed: whether the reduced
        result holds an inf or a NaN (mixed precision's overflow check), computed in the same pass
        as the reduction, the same on every rank."""
        return self._health()[0]

    def sq_norm(self):
        """After an allreduce_coalesced(..., health=True) that completed: the reduced result's sum
        of squares in float64 (sqrt of it is the global gradient norm), the same bits on every rank
        of its groups."""
        return self._health()[1]

    def is_completed(self):
        """True once the operation finished, successfully or not; never blocks. When it succeeded,
        the results are in place (copied back from the staging area, if it was used) on return."""
        if self._done:
            return True
        done = ctypes.c_int32(0)
        status = _lib.lib().gs_work_is_completed(self._handle, ctypes.byref(done))
        if status != 0:
            raise error_for(status, _lib.last_error())
        if not done.value:
            return False
        try:
            self.wait(0)
        except Exception:  # the error is wait()'s to raise
            pass
        return True
