"""The threads that complete the futures of a gradsync process group's Works (get_future()).

One waiter thread per group waits for the group's Works, one after another, in the order their
futures were asked for (the order the daemon completes them in). It does not complete the
futures itself: completing a torch future runs its callbacks, and a callback may wait for a
*later* future of the same group (a chain of collectives, a hook that waits for the bucket
after it), which only this waiter could complete. So each future is completed on a callback
thread: normally one, so that callbacks run one after another, in order, as before; when the
running callback has not returned within _Callbacks.GRACE_S (it may be waiting for a later
future), another thread takes the next future, as gloo's futures complete on several threads.
At most _Callbacks.MOST callbacks can be running at once; past that, the next future waits for
one of them to return.

Every thread here is a daemon thread, so that a Work that never completes cannot hold the
interpreter's exit. But a daemon thread still running at the interpreter's end is killed when it
next takes the GIL, by a forced unwind through whatever C++ frames it is in (torch's Future
callbacks among them), which aborts the process ("terminate called without an active
exception"). So at exit they are told to stop and are joined, for a bounded time, before the
interpreter finalizes: a callback that outlived the main thread's last use of its result
finishes, and the threads leave.
"""
import atexit
import collections
import contextlib
import queue
import threading
import time
import weakref

import torch


class _Callbacks:
    """The callback threads of one waiter: run(job) starts `job` on an idle one, or on a new one
    when none is idle (at most MOST); jobs start in the order given."""

    MOST = 64
    GRACE_S = 0.02  # how long the next job waits for the running callback before another thread
    _IDLE_S = 30.0  # a spare idle thread leaves after this long; the last one stays

    def __init__(self):
        self._cond = threading.Condition()
        self._jobs = collections.deque()
        self._threads = []
        self._idle = 0
        self._stopping = False

    def run(self, job):
        """Hands `job` to a callback thread; waits at most GRACE_S for a busy one to take it."""
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()
            if not self._threads:
                self._start()
                return
            deadline = time.monotonic() + self.GRACE_S
            while job in self._jobs and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if job in self._jobs and self._idle < len(self._jobs) and len(self._threads) < self.MOST:
                self._start()

    def _start(self):
        thread = threading.Thread(target=self._serve, name="gradsync-pg-callbacks", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve(self):
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs and not self._stopping:
                    if not self._cond.wait(self._IDLE_S) and not self._jobs and len(self._threads) > 1:
                        break
                self._idle -= 1
                if not self._jobs:  # stopping, or a spare thread idle too long
                    self._threads.remove(threading.current_thread())
                    return
                job = self._jobs.popleft()
                self._cond.notify_all()  # run() may be waiting for this job to be taken
            job()
            job = None  # hold nothing between jobs

    def stop(self):
        """Threads leave once no job is left."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, deadline):
        with self._cond:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def _complete(future, outputs, stream, outcome):
    """Completes a Work's future, running its callbacks (on a callback thread)."""
    try:
        # The future records its events on this thread's current stream: make that the stream
        # the caller asked on.
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            future.set_result(outputs)
        outcome.done.set()
    except Exception as e:  # noqa: BLE001 (raised at the end of backward, and by the future)
        outcome.fail(future, e)


class Waiter:
    """The group's waiter thread and its callback threads (the module's note). queue takes
    (work, outputs, future, stream, outcome) items, or STOP."""

    STOP = None
    _EXIT_JOIN_S = 5.0

    def __init__(self):
        self.queue = queue.Queue()
        self.callbacks = _Callbacks()
        self.thread = threading.Thread(target=self._run, name="gradsync-pg-waiter", daemon=True)
        self.thread.start()
        atexit.register(Waiter._stop_at_exit, weakref.ref(self))

    def stop(self):
        """The waiter completes the items it was handed, then its threads leave."""
        self.queue.put(Waiter.STOP)

    @staticmethod
    def _stop_at_exit(ref):
        waiter = ref()
        if waiter is None:
            return
        deadline = time.monotonic() + Waiter._EXIT_JOIN_S
        if waiter.thread.is_alive():
            # Items not yet begun fail (the interpreter ends), so that the stop comes right
            # after the item in hand, and a callback waiting for one of their futures returns.
            try:
                while True:
                    item = waiter.queue.get_nowait()
                    if item is not Waiter.STOP:
                        _, _, future, _, outcome = item
                        outcome.fail(future, RuntimeError("gradsync backend: the interpreter exited before this "
                                                          "collective's future was completed"))
            except queue.Empty:
                pass
            waiter.queue.put(Waiter.STOP)
            waiter.thread.join(max(0.0, deadline - time.monotonic()))
        waiter.callbacks.stop()
        waiter.callbacks.join(deadline)

    def _run(self):
        while True:
            item = self.queue.get()
            if item is Waiter.STOP:
                self.callbacks.stop()
                return
            work, outputs, future, stream, outcome = item
            try:
                if stream is None:
                    work._complete()
                else:
                    with torch.cuda.stream(stream):
                        work._complete(stream=stream)
            except Exception as e:  # noqa: BLE001 (raised at the end of backward, and by the future)
                self.callbacks.run(lambda future=future, e=e, outcome=outcome: outcome.fail(future, e))
            else:
                self.callbacks.run(lambda args=(future, outputs, stream, outcome): _complete(*args))
            item = work = outputs = future = stream = outcome = None  # hold nothing between items
