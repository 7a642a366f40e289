"""Memory of the client's (gs_alloc) as torch tensors, without a copy, and torch dtypes as the C API's."""
import atexit
import ctypes
import functools
import weakref

import torch

from ..errors import NotSupportedError

DTYPE_CODES = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
    torch.int32: 5,
    torch.int64: 6,
    torch.uint8: 7,
}

# Every tensor carved out of gradsync memory starts at a multiple of this: the element size of
# every dtype, and 16 bytes for the daemon's vector loads on the GPU.
ALIGN = 64


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def dtype_code(dtype):
    code = DTYPE_CODES.get(dtype)
    if code is None:
        raise NotSupportedError(f"gradsync: dtype {dtype} is not supported (supported: "
                                + ", ".join(str(d) for d in DTYPE_CODES) + ")")
    return code


def device_index(tensor):
    """-1 for a CPU tensor, the CUDA ordinal for a CUDA tensor."""
    if tensor.device.type == "cpu":
        return -1
    if tensor.device.type == "cuda":
        return tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    raise NotSupportedError(f"gradsync: tensors on {tensor.device} are not supported (CPU and CUDA only)")


class _CudaMemory:
    """Just enough of __cuda_array_interface__ for torch.as_tensor to view device memory."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 2}


def wrap(address, nbytes, device, owner):
    """A uint8 tensor over [address, address + nbytes) of the client's memory; no copy. The
    object torch keeps alive for the tensor holds `owner` (the client's core), so the memory
    stays mapped while any view of it lives."""
    if device < 0:
        memory = (ctypes.c_uint8 * nbytes).from_address(address)
        memory.owner = owner
        return torch.frombuffer(memory, dtype=torch.uint8)
    memory = _CudaMemory(address, nbytes)
    memory.owner = owner
    with torch.cuda.device(device):
        return torch.as_tensor(memory, device=f"cuda:{device}")


def carve(buffer, offset, dtype, shape):
    """A typed view of `buffer` (uint8) at `offset` with `shape`."""
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return buffer[offset:offset + nbytes].view(dtype).view(shape)


def empty(client, size, dtype=torch.float32, device="cpu"):
    """A zero-filled tensor in memory the daemon reaches (the client's), so the coalesced
    operations reduce it in place without a staging copy. It lives as long as any view of it."""
    shape = (size,) if isinstance(size, int) else tuple(size)
    index = -1 if torch.device(device).type == "cpu" else torch.device(device).index or 0
    numel = 1
    for d in shape:
        numel *= d
    nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
    buffer = wrap(client.alloc(align(nbytes), index), align(nbytes), index, client._core)
    return carve(buffer, 0, dtype, shape)


# Exit: torch frees a wrapped tensor's memory by releasing the Python object above, and takes
# the GIL to do it. Whatever the autograd engine still holds when Python has shut down is
# freed later, by the main thread's thread-local destructors in exit(): the nodes a failed
# backward() left in that thread's ready queue (a gradient hook raised, e.g. GradBuffer's with
# gradsync.PeerLostError), and through them the parameters and their .grad. A .grad that
# views this memory then waits for the GIL forever, and the process never exits. So, while
# Python still runs (atexit), parameters give up the gradients that view gradsync memory: only
# Python holds those then, and Python frees them.
_grad_memory = []  # (address, nbytes) of the buffers that gradients view (GradBuffer's)
_grad_holders = {}  # id -> weak reference, of parameters whose .grad (or .main_grad) may view one


def drop_grads_at_exit(params, buffer):
    """At interpreter exit, `params` drop .grad and .main_grad where they view `buffer`, a
    tensor from wrap() (or any buffer registered here before)."""
    _grad_memory.append((buffer.data_ptr(), buffer.numel() * buffer.element_size()))
    for p in params:  # (not a WeakSet: it would compare tensors with ==)
        _grad_holders[id(p)] = weakref.ref(p, functools.partial(_forget, id(p)))


def _forget(key, ref):
    if _grad_holders.get(key) is ref:
        del _grad_holders[key]


def _in_wrapped(tensor):
    if not isinstance(tensor, torch.Tensor):
        return False
    try:
        address = tensor.data_ptr()
    except RuntimeError:
        return False
    return any(base <= address < base + size for base, size in _grad_memory)


@atexit.register
def _drop_grads():
    for ref in list(_grad_holders.values()):
        p = ref()
        if p is None:
            continue
        try:
            if _in_wrapped(p.grad):
                p.grad = None
            if _in_wrapped(getattr(p, "main_grad", None)):
                del p.main_grad
        except Exception:  # exiting: nothing to report it to
            pass
