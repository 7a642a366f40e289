"""allreduce_coalesced and reduce_coalesced with a mask on every dtype and reduce mode, on
ordinary tensors (the staging path) and on tensors in the client's memory (direct), against
torch: the kept elements hold every rank's inputs combined in rank order, the others zero (the
seeds' S09: flat[mask] reduced, scattered into zeros). Bad masks are refused, naming why."""
import ctypes

import torch

import gradsync
import gradsync.torch
from gradsync import _lib
from gradsync.torch._memory import dtype_code
from ops import DTYPES, SIZES, Direct, combine, exit_on_failures, expect, inputs

failures = []


def masked(flat, mask):
    out = torch.zeros_like(flat)
    out[mask] = flat[mask]
    return out


def main():
    client = gradsync.connect()
    rank, world = client.rank, client.world_size
    direct = Direct(client)
    total = sum(SIZES)
    # The same on every rank: about a third of the elements, the first and the last.
    g = torch.Generator().manual_seed(11)
    mask = torch.nonzero(torch.rand(total, generator=g) < 0.3).flatten()
    mask = torch.unique(torch.cat([mask, torch.tensor([0, total - 1])]))
    case = 0
    for path in ("staging", "direct"):
        place = (lambda ts: [t.clone() for t in ts]) if path == "staging" else direct.like
        for dtype in DTYPES:
            modes = [("sum", {}), ("min", {}), ("max", {})]
            if dtype.is_floating_point:
                modes += [("avg", {}), ("avg", {"prescale": True})]
            for op, kwargs in modes:
                case += 1
                everyone = [inputs(r, dtype, case) for r in range(world)]
                flat = torch.cat([combine([e[i] for e in everyone], op, dtype, world, kwargs.get("prescale", False))
                                  for i in range(len(SIZES))])
                want = masked(flat, mask)
                mine = place(everyone[rank])
                before = len(client._sets)
                client.allreduce_coalesced(mine, op=op, mask=mask, **kwargs).wait(60)
                what = f"{path} masked allreduce {op} {kwargs} {dtype}"
                expect(failures, what, torch.cat(mine), want, exact=op != "avg")
                # The same tensors and mask again find the same set.
                for m, e in zip(mine, everyone[rank]):
                    m.copy_(e)
                client.allreduce_coalesced(mine, op=op, mask=mask, **kwargs).wait(60)
                expect(failures, what + " (again)", torch.cat(mine), want, exact=op != "avg")
                if len(client._sets) > before + 1:
                    failures.append(f"{what}: the same tensors and mask registered {len(client._sets) - before} sets")
            # A reduce to rank 1 with the mask: the root's other elements are zero, the others'
            # tensors unchanged.
            case += 1
            everyone = [inputs(r, dtype, case) for r in range(world)]
            mine = place(everyone[rank])
            client.reduce_coalesced(mine, root=1, op="sum", mask=mask).wait(60)
            flat = torch.cat([combine([e[i] for e in everyone], "sum", dtype) for i in range(len(SIZES))])
            want = masked(flat, mask) if rank == 1 else torch.cat(everyone[rank])
            expect(failures, f"{path} masked reduce {dtype}", torch.cat(mine), want, exact=True)
    # A new mask with the count of a dropped one is honoured, wherever torch puts it (the set
    # of the dropped one holds it, so its memory cannot come back as the new mask's).
    for generation in range(20):
        keep = torch.tensor([generation % 7, 7 + generation % 5])
        ones = [torch.ones(7), torch.ones(5)]
        client.allreduce_coalesced(ones, op="sum", mask=keep).wait(60)
        want = torch.zeros(12)
        want[keep] = float(world)
        expect(failures, f"mask generation {generation}", torch.cat(ones), want, exact=True)
        del keep
    tensors = [torch.ones(4), torch.ones(3)]
    refusals = [
        (torch.tensor([0.0, 1.0]), "mask must be a contiguous 1-D torch.int64 CPU tensor"),
        ([0, 1], "mask must be a contiguous 1-D torch.int64 CPU tensor"),
        (torch.tensor([], dtype=torch.int64), "mask keeps no element"),
        (torch.tensor([-1, 2]), "mask holds a negative index (-1)"),
        (torch.tensor([3, 2]), "mask: index 1 (2) does not follow index 0 (3)"),
        (torch.tensor([1, 7]), "mask: index 1 is 7, past the set's 7 elements"),
    ]
    for bad, needle in refusals:
        try:
            client.allreduce_coalesced(tensors, op="sum", mask=bad).wait(60)
            failures.append(f"mask {bad!r} was accepted")
        except gradsync.InvalidArgumentError as e:
            if needle not in str(e):
                failures.append(f"mask {bad!r}: unexpected message {e}")
    # A caller built against a newer header, setting a field this library does not know, is
    # refused rather than silently served without it.
    class Newer(ctypes.Structure):
        _fields_ = [("base", _lib.RegisterOptions), ("future", ctypes.c_uint64)]

    newer = Newer()
    newer.base.size = ctypes.sizeof(Newer)
    newer.base.bucket_cap_bytes = -1
    newer.future = 1
    ones = direct.like([torch.ones(4)])[0]
    array = (_lib.Tensor * 1)()
    array[0] = _lib.Tensor(ones.data_ptr(), 4, dtype_code(torch.float32), -1, b"dp")
    handle = ctypes.c_void_p()
    status = _lib.lib().gs_register_ex(client._h(), array, 1, ctypes.cast(ctypes.pointer(newer),
                                       ctypes.POINTER(_lib.RegisterOptions)), ctypes.byref(handle))
    if status == 0 or "fields past the" not in _lib.last_error():
        failures.append(f"a newer gs_register_options with an unknown field set: status {status}, "
                        f"{_lib.last_error()!r}")
    print(f"rank {rank}: {case} cases")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
