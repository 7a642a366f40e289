"""GradBuffer: every parameter's gradient as a view of one buffer the daemon reaches.

Like Megatron's grad buffer or DDP's gradient_as_bucket_view: one contiguous buffer in the
client's memory (a sealed memfd for CPU parameters, a CUDA VMM allocation for CUDA ones, wrapped
as a torch tensor without a copy) is registered once, and each param.grad is a view into it, so
autograd accumulates straight into memory the daemon reduces in place: no staging copy.

Parameters are laid out in reverse order, as backward produces their gradients, so buckets fill
in order. A hook on each parameter (post-accumulate-grad; on PyTorch before 2.1, the
grad-accumulator hook DDP used) marks it ready, and each bucket is reduced as soon as every
local rank marked all of its tensors, while backward still runs. wait() ends the step.
"""
import contextlib
import ctypes
import warnings
import weakref

import torch

from .. import _lib
from ..errors import InvalidArgumentError
from ..work import Work
from . import _coalesced
from ._memory import align, carve, device_index, drop_grads_at_exit, dtype_code, wrap


class GradBuffer:
    """GradBuffer(params, client, dtype=None, bucket_bytes=None, op="avg", group=None)

    dtype: the gradients' dtype; by default each parameter's own. With another dtype (fp32
    gradients of bf16 parameters), gradients go to param.main_grad (Megatron's convention):
    the hook adds param.grad into it and frees param.grad.
    Each step: zero_grad(), forward, backward, wait(), optimizer step. Call zero_grad() on
    the GradBuffer rather than optimizer.zero_grad(set_to_none=True), which would detach
    param.grad from the buffer (the hook then copies it back, and counts a staging copy).
    Parameters whose gradient was not produced in a step are reduced with the value in the
    buffer (zero after zero_grad()), like DDP's find_unused_parameters.
    The hooks go with the GradBuffer: once it is dropped (or after remove_hooks()), a new
    GradBuffer over the same parameters is the only one that sees their gradients.
    A step whose job failed raises gradsync's error (gradsync.PeerLostError when a rank was
    lost, ...) from backward() (a hook marking a gradient ready) or from wait(). Either way the
    trainer's process can exit: at interpreter exit the parameters drop the gradients that view
    the buffer (see _memory.drop_grads_at_exit).
    """

    def __init__(self, params, client, dtype=None, bucket_bytes=None, op="avg", group=None):
        self.client = client
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise InvalidArgumentError("gradsync: GradBuffer needs at least one parameter that requires grad")
        self.device = device_index(self.params[0])
        for p in self.params:
            if device_index(p) != self.device:
                raise InvalidArgumentError(f"gradsync: GradBuffer parameters must share one device; found "
                                           f"{self.params[0].device} and {p.device}")
            if p.numel() == 0:
                raise InvalidArgumentError("gradsync: GradBuffer parameters must not be empty")
        if group is not None and group not in client.groups:
            raise InvalidArgumentError(f"gradsync: unknown group {group!r}; declare it with "
                                       f"gradsync.connect(groups=...) (known: {sorted(client.groups)})")
        self._options, _ = _coalesced._reduce_options(client, op, None, False, None)
        self._order = list(reversed(self.params))
        self._main_grad = [dtype is not None and dtype != p.dtype for p in self._order]
        dtypes = [dtype or p.dtype for p in self._order]
        for d in dtypes:
            dtype_code(d)
        offsets, total = [], 0
        for p, d in zip(self._order, dtypes):
            offsets.append(total)
            total = align(total + p.numel() * torch.empty((), dtype=d).element_size())
        self.buffer = wrap(client.alloc(total, self.device), total, self.device, client._core)
        self.grads = [carve(self.buffer, off, d, p.shape) for off, d, p in zip(offsets, dtypes, self._order)]
        for p, g, main in zip(self._order, self.grads, self._main_grad):
            if main:
                p.main_grad = g
            else:
                p.grad = g
        drop_grads_at_exit(self._order, self.buffer)  # else a failed backward() can hang the process's exit
        flat = [g.view(-1) for g in self.grads]
        self._set = _coalesced.RegisteredSet(
            _coalesced.register(client, flat, self.device, group, bucket_bytes, False,
                                f"the GradBuffer of {len(self._order)} parameters"
                                + ("" if group is None else f" in group {group!r}")))
        self.staging_copies = 0  # gradients copied into the buffer because param.grad was replaced
        self._work = None
        self._marked = [False] * len(self._order)
        self._syncing = True
        self._hooks = []
        self._accumulators = []  # grad accumulators whose hooks we hold (PyTorch < 2.1)
        with torch.enable_grad():  # the accumulators exist only where autograd records
            for i, p in enumerate(self._order):
                self._hook(i, p)
        # The hooks go with the GradBuffer, on every PyTorch: a post-accumulate-grad hook lives
        # on the parameter, and would outlive a dropped GradBuffer (and its memory), marking its
        # old set and taking param.grad back from the next GradBuffer of the same parameters.
        weakref.finalize(self, _remove, self._hooks, self._accumulators)

    def _hook(self, i, p):
        me = weakref.ref(self)  # the hooks must not keep the GradBuffer alive

        def ready(*_):
            buffer = me()
            if buffer is not None:
                buffer._ready(i)

        if hasattr(p, "register_post_accumulate_grad_hook"):
            self._hooks.append(p.register_post_accumulate_grad_hook(ready))
        else:
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._accumulators.append(accumulator)
            self._hooks.append(accumulator.register_hook(ready))

    def _ready(self, i):
        p, g = self._order[i], self.grads[i]
        if self._syncing and self._marked[i]:
            # Its first part is being reduced already: a second one would race with that, and
            # ranks would end up with different gradients. DDP refuses this the same way.
            raise InvalidArgumentError(
                f"gradsync.GradBuffer: the gradient of parameter {len(self._order) - 1 - i} (shape "
                f"{tuple(p.shape)}) was produced twice before wait(): a second backward, or reentrant "
                "checkpointing of a parameter also used outside it. Use no_sync() for all but the last "
                "micro-batch, and torch.utils.checkpoint with use_reentrant=False")
        if self._main_grad[i]:
            # Every micro-batch, syncing or not, accumulates into main_grad in its dtype.
            if p.grad is not None:
                g.add_(p.grad)
                p.grad = None
        if not self._syncing:
            return
        if not self._main_grad[i] and (p.grad is None or p.grad.data_ptr() != g.data_ptr()):
            if p.grad is not None:
                g.copy_(p.grad)
            p.grad = g
            self.staging_copies += 1
            if self.staging_copies == 1:
                warnings.warn("gradsync.GradBuffer: param.grad was replaced (optimizer.zero_grad(set_to_none=True)?); "
                              "its gradient is copied into the buffer. Use GradBuffer.zero_grad() instead.")
        self._open()
        self._marked[i] = True
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device >= 0 else None
        _coalesced._check(_lib.lib().gs_mark_ready(self.client._h(), self._set.handle, i,
                                                   1 if self.device >= 0 else 0, ctypes.c_void_p(stream)))

    def _open(self):
        if self._work is None:
            handle = ctypes.c_void_p()
            _coalesced._order_on_current_stream(self.client, self.device)
            _coalesced._check(_lib.lib().gs_allreduce_deferred(self.client._h(), self._set.handle,
                                                               ctypes.byref(self._options), ctypes.byref(handle)))
            self._work = Work(self.client, handle, None, self.device)

    def zero_grad(self):
        """Zeroes every gradient (the whole buffer) and points param.grad back at its view."""
        self.buffer.zero_()
        for p, g, main in zip(self._order, self.grads, self._main_grad):
            if not main:
                p.grad = g

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes inside accumulate without reducing (DDP's no_sync)."""
        previous, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = previous

    def wait(self, timeout=None):
        """Ends the step: marks what backward did not reach, and waits for the reduction (on CUDA the
        current stream waits, the host does not)."""
        if self._work is None:
            self._open()
        for i, marked in enumerate(self._marked):
            if not marked:
                self._marked[i] = True
                _coalesced._order_on_current_stream(self.client, self.device)
                _coalesced._check(_lib.lib().gs_mark_ready(self.client._h(), self._set.handle, i, 0, None))
        # On a timeout the step stays open: waiting again waits for the same reduction.
        if self.device >= 0:
            self._work.wait_stream(None, timeout)
        else:
            self._work.wait(timeout)
        self._work = None
        self._marked = [False] * len(self._order)

    def remove_hooks(self):
        """Stops marking parameters ready (also done when the GradBuffer is garbage collected)."""
        _remove(self._hooks, self._accumulators)


def _remove(hooks, accumulators):
    for h in hooks:
        h.remove()
    hooks.clear()
    accumulators.clear()
