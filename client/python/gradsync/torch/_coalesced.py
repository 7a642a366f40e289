"""The coalesced operations of gradsync.Client on torch tensors.

A list of tensors becomes a registered set the first time it is seen; the set is found again by
a key built from the tensors. Tensors that lie in the client's memory (GradBuffer, or memory from
Client.alloc) are registered as they are and reduced in place, copying nothing. Other tensors
(ordinary CPU or CUDA tensors) go through a staging area: one flat buffer in the client's memory
per (layout, device, group, bucket size), registered once, into which the tensors are copied
before the operation and from which the results are copied back (the seeds' flatten and
unflatten). On CUDA the copies and the operation are ordered on the current stream.
"""
import ctypes
import warnings

import torch

from .. import _lib
from ..errors import Error, InvalidArgumentError, error_for
from ..work import Work
from ._memory import align, carve, device_index, dtype_code, wrap

_OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3}

# Past this many sets a client warns once (each holds its staging memory and the daemon's
# mapping until the client closes, unless released: release_unused()).
_MANY_SETS = 64


def _check(status):
    if status != 0:
        raise error_for(status, _lib.last_error())


class RegisteredSet:
    """A registered set; with a staging area when the tensors it stands for are not the client's."""

    def __init__(self, handle, staging=None, views=None):
        self.handle = handle
        self._free = _lib.lib().gs_set_free  # held: a set freed at interpreter exit finds modules gone
        self.staging = staging  # the staging area (uint8 tensor), or None
        self.views = views      # the staging area's typed views, one per tensor
        self.in_flight = None   # the last Work that used the staging area or the gather output
        self.last_use = 0       # the client's operation count when it was last used (release_unused)
        self.copied_back = None  # CUDA: an event after the last copy out of the staging area
        # The mask tensor the set was registered with, held so that its memory, part of the set's
        # cache key, is not reused by another mask while the set lives.
        self.mask = None

    def take(self, device):
        """Waits until the last operation that used the set's staging area or gather output
        finished and its results were copied out: two operations in flight on one such set
        share it, so the second waits here. (Deterministic on every rank, unlike a pool that
        grows when an area is busy: sets must be registered in the same order everywhere.) On
        CUDA the current stream also waits for the last copy out, wherever it was queued."""
        work, self.in_flight = self.in_flight, None
        if work is not None and not work._done:
            work.wait()
        event, self.copied_back = self.copied_back, None
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)
        return event

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle and hasattr(self, "_free"):
            self._free(handle)


def register(client, tensors, device, group, bucket_bytes, allgather, label, reduce_scatter=False, mask=None):
    """Registers contiguous tensors in the client's memory as a set (a barrier across local ranks).
    `label` is what the user knows the set as ("DDP bucket 3"): every error about the set names
    it so, never by the set number the user never saw. `mask` (an int64 CPU tensor, checked by
    _mask_key) is the set's mask."""
    group_name = (group or "dp").encode()
    array = (_lib.Tensor * len(tensors))()
    for i, t in enumerate(tensors):
        array[i] = _lib.Tensor(t.data_ptr(), t.numel(), dtype_code(t.dtype), device, group_name)
    handle = ctypes.c_void_p()
    options = _lib.RegisterOptions(ctypes.sizeof(_lib.RegisterOptions), -1 if bucket_bytes is None else int(bucket_bytes),
                                   1 if allgather else 0, 1 if reduce_scatter else 0, _label_bytes(label),
                                   None if mask is None else mask.data_ptr(), 0 if mask is None else mask.numel())
    _check(_lib.lib().gs_register_ex(client._h(), array, len(tensors), ctypes.byref(options), ctypes.byref(handle)))
    return handle


def _validate(client, tensors, group):
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("gradsync: an operation needs at least one tensor")
    if group is not None and group not in client.groups:
        raise InvalidArgumentError(f"gradsync: unknown group {group!r}; declare it with "
                                   f"gradsync.connect(groups=...) (known: {sorted(client.groups)})")
    device = device_index(tensors[0])
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"gradsync: item {i} is a {type(t).__name__}, not a torch.Tensor")
        if device_index(t) != device:
            raise InvalidArgumentError(f"gradsync: tensor {i} is on {t.device} but tensor 0 on {tensors[0].device}; "
                                       "one operation takes tensors of one device")
        if t.numel() == 0:
            raise InvalidArgumentError(f"gradsync: tensor {i} is empty")
        dtype_code(t.dtype)
    return tensors, device


def _mask_key(mask):
    """What tells one mask from another in the set cache: the tensor's memory and its version
    counter (an in-place change makes a new set), without reading its indices each step. The
    set holds the tensor (RegisteredSet.mask), so no later mask can take its memory."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int64 or mask.device.type != "cpu" \
            or mask.dim() != 1 or not mask.is_contiguous():
        got = f"a {mask.dtype} tensor on {mask.device} of {mask.dim()} dimensions" if isinstance(mask, torch.Tensor) \
            else f"a {type(mask).__name__}"
        raise InvalidArgumentError(f"gradsync: mask must be a contiguous 1-D torch.int64 CPU tensor of the flat "
                                   f"indices to keep, not {got}")
    if mask.numel() == 0:
        raise InvalidArgumentError("gradsync: mask keeps no element; pass mask=None for none")
    return (mask.data_ptr(), mask.numel(), mask._version)


def set_for(client, tensors, device, group, bucket_bytes, allgather=False, tag=None, reduce_scatter=False, mask=None):
    """The registered set for these tensors: their own (zero-copy) when they all lie in the
    client's memory, else the staging set of their layout (and `tag`, which callers that keep
    several same-layout lists in flight use to tell them apart, e.g. DDP's bucket index)."""
    direct = all(t.is_contiguous() and client.reachable(t.data_ptr(), t.numel() * t.element_size(), device)
                 for t in tensors)
    if direct:
        key = ("direct", tuple((t.data_ptr(), t.numel(), t.dtype) for t in tensors), device, group, bucket_bytes,
               allgather, reduce_scatter, _mask_key(mask))
    else:
        key = ("staging", tuple((t.numel(), t.dtype) for t in tensors), device, group, bucket_bytes, allgather,
               reduce_scatter, tag, _mask_key(mask))
    found = client._sets.get(key)
    if found is not None:
        return found
    label = _label(tensors, group, tag)
    if len(client._sets) == _MANY_SETS and not (isinstance(tag, tuple) and tag[:1] == ("pg",)):
        warnings.warn(f"gradsync: this client registered {_MANY_SETS} sets; each new list layout registers one more, "
                      "and sets (with their staging memory) live until the client closes")
    if mask is not None and int(mask.min()) < 0:
        raise InvalidArgumentError(f"gradsync: mask holds a negative index ({int(mask.min())})")
    if direct:
        made = RegisteredSet(register(client, tensors, device, group, bucket_bytes, allgather, label, reduce_scatter,
                                      mask))
    else:
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total = align(total + t.numel() * t.element_size())
        buffer = _pooled(client, total, device)
        if buffer is None:
            buffer = wrap(client.alloc(total, device), total, device, client._core)
        views = [carve(buffer, off, t.dtype, (t.numel(),)) for off, t in zip(offsets, tensors)]
        made = RegisteredSet(register(client, views, device, group, bucket_bytes, allgather, label, reduce_scatter,
                                      mask), buffer, views)
    made.mask = mask
    client._sets[key] = made
    return made


def _pooled(client, nbytes, device):
    """The smallest staging area of a released set on `device` that holds `nbytes`, taken out of
    the client's pool; None when none does."""
    fits = [(b.numel(), i) for i, (b, d, _, _) in enumerate(client._staging_pool)
            if d == device and b.numel() >= nbytes]
    if not fits:
        return None
    buffer, _, copied_back, _ = client._staging_pool.pop(min(fits)[1])
    if copied_back is not None:
        torch.cuda.current_stream(device).wait_event(copied_back)
    return buffer


def release_unused(client, owner, older_than):
    """Releases the staging sets tagged (owner, ...) that no operation of the client used in its
    last `older_than` operations: the daemon drops each once every local rank released it, and
    its staging area goes to the client's pool, for the next staging set that fits. Decided by
    operation counts only, so every rank that runs the same collectives releases the same sets
    at the same point, and later registers the same ones again.

    Areas that stayed in the pool through a whole sweep (no later set took them) are freed:
    calls of ever-growing sizes would otherwise hold the sum of every size they made, not what
    they use. The memory goes back to the daemon only once it dropped the area's set (every
    local rank released it) and, for device memory, once its GPU is through the set and NCCL's
    registration of it is undone; an area it still holds waits for the next sweep."""
    client._sweeps += 1
    kept = []
    for entry in client._staging_pool:
        area, device, copied_back, pooled_in = entry
        if pooled_in < client._sweeps and _freed(client, area, copied_back):
            continue
        kept.append(entry)
    client._staging_pool = kept
    for key, registered in list(client._sets.items()):
        tag = key[7] if key[0] == "staging" else None
        if not (isinstance(tag, tuple) and tag[:1] == (owner,)) or client._operations - registered.last_use < older_than:
            continue
        device = key[2]
        # On CUDA the last copy out of the area is an event on some stream: kept with the area,
        # so that whichever stream next copies into it waits for it (_pooled), not only the
        # stream current now.
        # (The event take() consumed: a Work finished inside it records a newer one.)
        copied_back = registered.take(device)  # nothing of it in flight, its results copied out
        _check(_lib.lib().gs_set_release(client._h(), registered.handle))
        del client._sets[key]
        client._staging_pool.append((registered.staging, device, copied_back, client._sweeps))
        client._released_sets += 1
        registered.staging = registered.views = None


def _freed(client, area, copied_back):
    """Frees a pooled staging area: True, or False where the daemon still holds its set (it is
    then kept). On CUDA the last copy out of it finishes first."""
    if copied_back is not None:
        copied_back.synchronize()
    try:
        client.free(area.data_ptr())
    except Error:
        return False
    client._freed_staging += 1
    return True


def _label_bytes(label):
    """The label as the daemon takes it: UTF-8, at most 128 bytes, cut at a character (a cut
    inside one would be refused as not UTF-8), without control characters."""
    text = "".join(c if c.isprintable() else "?" for c in label)
    return text.encode()[:128].decode("utf-8", "ignore").encode()


def _label(tensors, group, tag):
    """What a user calls the tensors of a set made for them: "DDP bucket 3" for the comm hook's
    buckets, else the list's shape ("a list of 2 float32 tensors"), which is what every
    operation on that layout shares."""
    in_group = "" if group is None else f" in group {group!r}"
    if isinstance(tag, tuple) and len(tag) == 2 and tag[0] == "ddp":
        return f"DDP bucket {tag[1]}{in_group}"
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in tensors})
    noun = "tensor" if len(tensors) == 1 else "tensors"
    return f"a list of {len(tensors)} {'/'.join(dtypes)} {noun}{in_group}"


def _start(registered, work, gathers=False):
    if registered.staging is not None or gathers:
        registered.in_flight = work
    return work


def _order_on_current_stream(client, device):
    if device >= 0:
        _check(_lib.lib().gs_set_stream(client._h(), ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)))


def _copy_in(client, registered, tensors):
    with torch.no_grad():
        for view, t in zip(registered.views, tensors):
            view.copy_(t.reshape(-1))
    client.staging_copies += len(tensors)
    client.staging_bytes += sum(t.numel() * t.element_size() for t in tensors)


def _finisher(client, registered, tensors, device, copy_back):
    """What Work runs once the operation finished: copy the results back (staging only), on the
    stream given (wait_stream) or, for a host wait, on the current stream and synchronised."""
    if registered.staging is None or not copy_back:
        return None

    def finish(stream):
        # no_grad: the tensors may be parameters that require grad (a broadcast of them).
        with torch.no_grad():
            if device >= 0:
                target = stream if stream is not None else torch.cuda.current_stream(device)
                with torch.cuda.stream(target):
                    for view, t in zip(registered.views, tensors):
                        t.copy_(view.view(t.shape))
                    event = torch.cuda.Event()
                    event.record(target)
                registered.copied_back = event
                if stream is None:
                    target.synchronize()
            else:
                for view, t in zip(registered.views, tensors):
                    t.copy_(view.view(t.shape))
        client.staging_copies += len(tensors)
        return None

    return finish


_WIRE = {None: 0, torch.bfloat16: 4, torch.float16: 3, "bfloat16": 4, "float16": 3}


def _reduce_options(client, op, divisor, prescale, fp32_accumulate, health=False, wire_dtype=None):
    """The C API's gs_reduce_options and gs_op_options for these arguments."""
    if op not in _OPS:
        raise InvalidArgumentError(f"gradsync: op must be one of {sorted(_OPS)}, not {op!r}")
    if divisor is not None and op != "avg":
        raise InvalidArgumentError("gradsync: divisor applies to op='avg' only")
    if divisor is not None and not divisor > 0:
        raise InvalidArgumentError(f"gradsync: divisor must be positive, not {divisor!r}")
    if wire_dtype not in _WIRE:
        raise InvalidArgumentError(f"gradsync: wire_dtype must be None, torch.bfloat16 or torch.float16, "
                                   f"not {wire_dtype!r}")
    options = _lib.ReduceOptions(_OPS[op], 1 if prescale else 0, float(divisor or 0.0),
                                 1 if fp32_accumulate is None or fp32_accumulate else 0)
    extra = _lib.OpOptions(ctypes.sizeof(_lib.OpOptions), 1 if health else 0, _WIRE[wire_dtype])
    return options, extra


def _prepare(client, tensors, device, group, bucket_bytes, copy_in, allgather=False, tag=None, reduce_scatter=False,
             mask=None):
    """Every operation's start: its set, free of earlier work; the stream it is ordered on; and,
    for a staging set, the tensors copied in when this rank's inputs matter (`copy_in`)."""
    registered = set_for(client, tensors, device, group, bucket_bytes, allgather=allgather, tag=tag,
                         reduce_scatter=reduce_scatter, mask=mask)
    client._operations += 1
    registered.last_use = client._operations
    registered.take(device)
    _order_on_current_stream(client, device)
    if registered.staging is not None and copy_in:
        _copy_in(client, registered, tensors)
    return registered


def allreduce(client, tensors, op, divisor, prescale, fp32_accumulate, bucket_bytes, group, tag=None, health=False,
              wire_dtype=None, mask=None):
    tensors, device = _validate(client, tensors, group)
    options, extra = _reduce_options(client, op, divisor, prescale, fp32_accumulate, health, wire_dtype)
    registered = _prepare(client, tensors, device, group, bucket_bytes, True, tag=tag, mask=mask)
    handle = ctypes.c_void_p()
    _check(_lib.lib().gs_allreduce_ex(client._h(), registered.handle, ctypes.byref(options), ctypes.byref(extra),
                                      ctypes.byref(handle)))
    return _start(registered, Work(client, handle, _finisher(client, registered, tensors, device, True), device))


def broadcast(client, tensors, root, group, tag=None):
    tensors, device = _validate(client, tensors, group)
    _check_root(client, root, group)
    is_root = client.rank == root
    registered = _prepare(client, tensors, device, group, None, is_root, tag=tag)
    handle = ctypes.c_void_p()
    _check(_lib.lib().gs_broadcast(client._h(), registered.handle, int(root), ctypes.byref(handle)))
    return _start(registered, Work(client, handle, _finisher(client, registered, tensors, device, not is_root),
                                   device))


def reduce(client, tensors, root, op, group, mask=None, tag=None, prescale=False, wire_dtype=None):
    tensors, device = _validate(client, tensors, group)
    _check_root(client, root, group)
    options, extra = _reduce_options(client, op, None, prescale, None, wire_dtype=wire_dtype)
    registered = _prepare(client, tensors, device, group, None, True, mask=mask, tag=tag)
    handle = ctypes.c_void_p()
    _check(_lib.lib().gs_reduce_ex(client._h(), registered.handle, int(root), ctypes.byref(options),
                                   ctypes.byref(extra), ctypes.byref(handle)))
    return _start(registered, Work(client, handle, _finisher(client, registered, tensors, device,
                                                             client.rank == root), device))


def all_gather(client, tensors, group, tag=None):
    tensors, device = _validate(client, tensors, group)
    registered = _prepare(client, tensors, device, group, None, True, allgather=True, tag=tag)
    handle = ctypes.c_void_p()
    _check(_lib.lib().gs_allgather(client._h(), registered.handle, ctypes.byref(handle)))
    ranks = client.groups[group or "dp"]
    shapes = [(t.shape, t.dtype, t.numel() * t.element_size()) for t in tensors]

    def gathered(stream):
        # Copies, not views: the set's next allgather overwrites its outputs.
        out = []
        context = torch.cuda.stream(stream) if (device >= 0 and stream is not None) else _nothing()
        with context:
            for r in ranks:
                row = []
                for i, (shape, dtype, nbytes) in enumerate(shapes):
                    address = ctypes.c_void_p()
                    _check(_lib.lib().gs_set_gathered(registered.handle, r, i, ctypes.byref(address)))
                    row.append(wrap(address.value, nbytes, device, client._core).view(dtype).view(shape).clone())
                out.append(row)
        _mark_read(registered, device, stream)
        return out

    return _start(registered, Work(client, handle, gathered, device), gathers=True)


def _mark_read(registered, device, stream):
    """CUDA: the outputs were copied on `stream` (None: the current one, synchronised); the set's
    next operation waits for that copy (RegisteredSet.take), wherever it was queued, before the
    daemon may overwrite the outputs."""
    if device < 0:
        return
    target = stream if stream is not None else torch.cuda.current_stream(device)
    event = torch.cuda.Event()
    event.record(target)
    registered.copied_back = event
    if stream is None:
        target.synchronize()


def reduce_scatter(client, tensors, op, divisor, prescale, fp32_accumulate, bucket_bytes, group, wire_dtype=None,
                   tag=None):
    tensors, device = _validate(client, tensors, group)
    for i, t in enumerate(tensors):
        if t.dtype != tensors[0].dtype:
            raise InvalidArgumentError(f"gradsync: reduce_scatter: tensor {i} is {t.dtype} but tensor 0 is "
                                       f"{tensors[0].dtype}; one reduce-scatter takes tensors of one dtype")
    options, extra = _reduce_options(client, op, divisor, prescale, fp32_accumulate, wire_dtype=wire_dtype)
    registered = _prepare(client, tensors, device, group, bucket_bytes, True, reduce_scatter=True, tag=tag)
    handle = ctypes.c_void_p()
    _check(_lib.lib().gs_reduce_scatter(client._h(), registered.handle, ctypes.byref(options), ctypes.byref(extra),
                                        ctypes.byref(handle)))
    address, first, count = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_uint64()
    _check(_lib.lib().gs_set_shard(registered.handle, ctypes.byref(address), ctypes.byref(first), ctypes.byref(count)))
    dtype = tensors[0].dtype
    nbytes = count.value * tensors[0].element_size()

    def shard(stream):
        # A copy, not a view: the set's next reduce-scatter overwrites its output.
        if count.value == 0:
            return torch.empty(0, dtype=dtype, device=tensors[0].device)
        context = torch.cuda.stream(stream) if (device >= 0 and stream is not None) else _nothing()
        with context:
            out = wrap(address.value, nbytes, device, client._core).view(dtype).clone()
        _mark_read(registered, device, stream)
        return out

    work = Work(client, handle, shard, device)
    work.shard_first = first.value
    return _start(registered, work, gathers=True)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check_root(client, root, group):
    ranks = client.groups[group or "dp"]
    if root not in ranks:
        raise InvalidArgumentError(f"gradsync: root {root} is not a rank of group {group or 'dp'!r} ({ranks})")
