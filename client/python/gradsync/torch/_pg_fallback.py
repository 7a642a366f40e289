"""What a gradsync process group may be asked at init, and the gloo group beside it that serves
the operations the daemon does not offer, when the user asks for that:

    dist.init_process_group("gradsync", pg_options=gradsync.torch.Options(fallback="gloo"))

The daemon reduces and moves whole registered sets; point-to-point and personalised operations
(send, recv, all_to_all, scatter, gather) are not among them. Without the option they raise
NotImplementedError naming the operation; with it they go, unchanged, to a gloo process group
of the same ranks that the gradsync group makes at init (gloo's Works, errors and timeout).
Never silently: the choice is the user's, made once at init, and a group made by
dist.new_group without options of its own inherits the default gradsync group's (DeviceMesh
makes its groups so).

Every rank of a group makes its gloo group at init, a full mesh of TCP connections: a rank that
cannot (no such GLOO_SOCKET_IFNAME interface, say) says so in the group's store first, and every
rank that asked fails at once naming it, instead of waiting in gloo's connect for the timeout.
"""
import datetime
import os

import torch.distributed as dist

from ..errors import Error, InvalidArgumentError
from . import _wire

_FALLBACKS = (None, "gloo")


class Options:
    """`pg_options` of a gradsync process group (init_process_group, new_group).

    fallback: None (the default): send, recv, all_to_all, scatter and gather raise
    NotImplementedError; "gloo": they go through a gloo group of the same ranks, made at init
    (one more TCP connection per pair of ranks; CPU tensors, and CUDA tensors where gloo takes
    them).

    wire_dtype: what the reductions (all_reduce, its coalesced forms, reduce, reduce_scatter)
    carry between nodes (gradsync.torch._wire; the DDP hook's HookState takes the same).
      None (the default): float16 and bfloat16 tensors as float32 sums, each rounded once (twice
        their bytes); every other dtype as itself.
      "native": float16 and bfloat16 tensors in their own type, at their own size, each combine
        rounded to it, as NCCL reduces them; float32 as itself.
      torch.bfloat16 or torch.float16 (or their names): float32 tensors compressed to it
        (Horovod's compression); float16 and bfloat16 ones in their own type.
    A half tensor never crosses as the other half type (bfloat16 rounds float16's 65504 up past
    its range; float16 overflows bfloat16's large values), so a call mixing float32 with the
    other half type, or both half types, crosses as the default; float64, integers and sparse
    tensors always do. With a wire dtype an avg divides before the sum, as NCCL's does, so half
    node sums stay in range. The error added is bounded in docs/how-it-works.md. Within a node
    nothing changes for CPU tensors; CUDA tensors' NCCL hops between a node's GPUs carry it too.
    barrier is never compressed, nor a CUDA reduce_scatter. Every rank of a group
    must ask the same: nodes compare it for CPU tensors, nothing does for CUDA ones."""

    def __init__(self, fallback=None, wire_dtype=None):
        if fallback not in _FALLBACKS:
            raise InvalidArgumentError(f"gradsync.torch.Options: fallback must be None or 'gloo', not {fallback!r}")
        self.fallback = fallback
        self._wire_dtype = _wire.setting(wire_dtype, "gradsync.torch.Options")
        # What torch's DeviceMesh reads of a backend_override's options (None: the mesh's own
        # timeout), so that init_device_mesh(..., backend_override={"dp": ("gradsync",
        # Options(...))}) takes these.
        self._timeout = None

    @property
    def wire_dtype(self):
        """None, "native", torch.bfloat16 or torch.float16 (fixed at construction: a group reads it
        at every call, and every rank must see the same)."""
        return self._wire_dtype

    def __repr__(self):
        return f"gradsync.torch.Options(fallback={self.fallback!r}, wire_dtype={self.wire_dtype!r})"


def options_of(pg_options, default_group):
    """The options of a group being made: its own `pg_options`, else the default group's when
    that is a gradsync group (new_group and DeviceMesh pass none), else the defaults. (Other
    groups have `options` of their own: torch 1.13's gloo group has.)"""
    if pg_options is None:
        inherited = getattr(default_group, "options", None)
        return inherited if isinstance(inherited, Options) else Options()
    if not isinstance(pg_options, Options):
        raise InvalidArgumentError(f"gradsync backend: pg_options must be a gradsync.torch.Options, not a "
                                   f"{type(pg_options).__module__}.{type(pg_options).__qualname__}")
    return pg_options


def _gloo_devices():
    """The devices gloo's constructor would make (GLOO_SOCKET_IFNAME's interfaces, else the
    host name's address): made here first, so that a rank that cannot says why."""
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if names:
        return [dist.ProcessGroupGloo.create_device(interface=n) for n in names]
    return [dist.ProcessGroupGloo.create_default_device()]


def _said(store, key):
    """Whether `key` is in the store now (torch 1.13's stores have no check())."""
    try:
        store.wait([key], datetime.timedelta(milliseconds=10))
        return True
    except Exception:  # noqa: BLE001 (the store's timeout)
        return False


def _all_read(store, rank, ranks, within_s=10.0):
    """Before ranks raise on a failed agreement: wait (bounded) until every rank has read the
    others' answers. The store's server lives in one of these ranks (rank 0's TCPStore), and a
    rank that raised first may exit and take it along while another rank is still reading, which
    then fails with the store's "Connection reset by peer" instead of the reason."""
    store.set(f"read/{rank}", "1")
    try:
        store.wait([f"read/{r}" for r in ranks], datetime.timedelta(seconds=within_s))
    except Exception:  # noqa: BLE001 (a rank that went away: the reason is still worth raising)
        pass


def fallback_group(options, store, prefix, rank, size, timeout, agree_within):
    """The gloo group beside a gradsync group of these ranks (None when not asked for): made by
    every rank of the group at init, its keys under `prefix` in the group's store. First each
    rank says in the store whether it can make gloo's device; all of them must, within
    `agree_within` seconds (a rank that never says did not ask for the fallback), or every
    rank that asked raises, naming the ranks and why."""
    if options.fallback is None:
        return None
    store = dist.PrefixStore(prefix, store)
    try:
        _gloo_devices()
        said = "ok"
    except Exception as e:  # noqa: BLE001 (whatever gloo raised is what the others are told)
        said = f"{type(e).__name__}: {e}"
    store.set(f"can/{rank}", said)
    keys = [f"can/{r}" for r in range(size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=agree_within))
    except Exception:  # noqa: BLE001 (the store's timeout: which ranks never said is what matters)
        missing = [r for r in range(size) if not _said(store, f"can/{r}")]
        # Briefly: a rank whose own wait ended just before (the missing one said it late) goes
        # on to gloo's connect and never says it read.
        _all_read(store, rank, [r for r in range(size) if r not in missing], within_s=min(2.0, agree_within))
        raise InvalidArgumentError(
            f"gradsync backend: rank(s) {missing} of this group did not make the gloo fallback within "
            f"{agree_within:g} s: every rank must pass the same pg_options (gradsync.torch.Options(fallback='gloo'))"
        ) from None
    failed = {r: v for r in range(size) if (v := store.get(f"can/{r}").decode()) != "ok"}
    if failed:
        _all_read(store, rank, range(size))
        raise Error("gradsync backend: the gloo fallback cannot be made on rank(s) " +
                    "; ".join(f"{r}: {why}" for r, why in sorted(failed.items())) +
                    " (GLOO_SOCKET_IFNAME names the interface gloo uses)")
    return dist.ProcessGroupGloo(store, rank, size, timeout)
