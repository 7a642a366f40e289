"""The wire setting of the torch layer: what a reduction carries between nodes, for the backend's
Options(wire_dtype=...) and the DDP hook's HookState(wire_dtype=...) alike.

A setting is None (the default: float16 and bfloat16 as float32 sums, each rounded once),
"native" (half tensors in their own type, as NCCL reduces them; float32 as itself), or
torch.bfloat16 / torch.float16 (float32 compressed to it, Horovod's compression; half tensors
in their own type). A half tensor never crosses as the other half type: bfloat16 rounds
float16's 65504 up past its range, and float16 overflows bfloat16's large values.
"""
import torch

from ..errors import InvalidArgumentError

# What a setting may be given as, and what it is kept as (the strings the client takes too).
_NAMES = {"native": "native", "bfloat16": torch.bfloat16, "float16": torch.float16}
_HALVES = (torch.float16, torch.bfloat16)
_COMPRESSIBLE = (torch.float32, torch.float16, torch.bfloat16)


def setting(value, who):
    """`value` as kept (None, "native", torch.bfloat16 or torch.float16); an InvalidArgumentError
    naming `who` for anything else."""
    if value is None or value is torch.bfloat16 or value is torch.float16:
        return value
    if isinstance(value, str) and value in _NAMES:
        return _NAMES[value]
    raise InvalidArgumentError(f"{who}: wire_dtype must be None, 'native', torch.bfloat16 or torch.float16 "
                               f"(or 'bfloat16', 'float16'), not {value!r}")


def wire_for(kept, tensors):
    """The wire dtype a reduction of `tensors` gets under the setting `kept`: None where it does
    not apply. It depends on the setting and the tensors' dtypes only, which every rank passes
    alike, so every rank agrees."""
    if kept is None or not all(t.dtype in _COMPRESSIBLE for t in tensors):
        return None
    halves = {t.dtype for t in tensors if t.dtype in _HALVES}
    if len(halves) > 1:
        return None  # one wire dtype per call, and a half tensor crosses only as itself
    if halves:
        (half,) = halves
        if all(t.dtype == half for t in tensors):
            return half  # "native", or a compressing setting: their own type
        return half if kept == half else None  # with float32: only where the setting is that type
    return None if kept == "native" else kept


def avg_prescaled(op, wire):
    """Whether an avg divides before the sum: with a wire dtype, as NCCL's avg does, so that half
    node sums stay in range where the average does."""
    return op == "avg" and wire is not None
