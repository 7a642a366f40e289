"""Every coalesced operation, dtype and scaling mode, on ordinary tensors (the staging path)
and on tensors in the client's memory (zero-copy), against torch's results computed here from
every rank's inputs (each rank can make any rank's inputs: they are seeded by rank)."""
import sys

import torch

import gradsync
import gradsync.torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
SIZES = [1, 7, 1000, 33]


def inputs(rank, dtype, case):
    g = torch.Generator().manual_seed(case * 100 + rank)
    if dtype.is_floating_point:
        return [(torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2).to(dtype) for n in SIZES]
    low = 0 if dtype == torch.uint8 else -100
    return [torch.randint(low, 100, (n,), generator=g, dtype=torch.int64).to(dtype) for n in SIZES]


def combine(parts, op, dtype, divisor=None, prescale=False, fp32=True):
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) and fp32 else dtype
    xs = [p.to(acc) for p in parts]
    if op == "avg" and prescale:
        xs = [x / divisor for x in xs]
    out = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg"):
            out = out + x
        elif op == "min":
            out = torch.minimum(out, x)
        else:
            out = torch.maximum(out, x)
    if op == "avg" and not prescale:
        out = out / divisor
    return out.to(dtype)


def expect(failures, what, got, want, exact):
    """Records in `failures` how `got` differs from `want`: its dtype or shape, any element
    (exact), or beyond torch's tolerance."""
    if got.shape != want.shape or got.dtype != want.dtype:
        failures.append(f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
        return
    if exact:
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            failures.append(f"{what}: {bad.numel()} elements differ, the first at {bad[0].tolist()}")
        return
    try:
        torch.testing.assert_close(got, want)
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0]}")


def exit_on_failures(failures):
    """A worker's end: the first 40 failures and their count, and exit status 1, if any."""
    if failures:
        print("\n".join(failures[:40]))
        print(f"{len(failures)} failures")
        sys.exit(1)


failures = []


def check(what, got, want):
    try:
        torch.testing.assert_close(got, want, rtol=None if got.dtype.is_floating_point else 0,
                                   atol=None if got.dtype.is_floating_point else 0)
    except AssertionError as e:
        failures.append(f"{what}: {str(e).splitlines()[0]}")


class Direct:
    """Tensors in the client's memory: registered as they are, reduced in place."""

    def __init__(self, client):
        self.client = client

    def like(self, tensors):
        out = []
        for t in tensors:
            mine = gradsync.torch.empty(self.client, t.shape, t.dtype)
            mine.copy_(t)
            out.append(mine)
        return out


def main():
    client = gradsync.connect()
    rank, world = client.rank, client.world_size
    direct = Direct(client)
    case = 0
    for path in ("staging", "direct"):
        place = (lambda ts: [t.clone() for t in ts]) if path == "staging" else direct.like
        for dtype in DTYPES:
            floating = dtype.is_floating_point
            modes = [("sum", {}), ("min", {}), ("max", {})]
            if floating:
                modes += [("avg", {}), ("avg", {"prescale": True}), ("avg", {"divisor": 3.0}),
                          ("avg", {"divisor": 3.0, "prescale": True})]
                if dtype in (torch.float16, torch.bfloat16):
                    modes += [("sum", {"fp32_accumulate": False}), ("avg", {"fp32_accumulate": False})]
            for op, kwargs in modes:
                case += 1
                everyone = [inputs(r, dtype, case) for r in range(world)]
                mine = place(everyone[rank])
                client.allreduce_coalesced(mine, op=op, **kwargs).wait(60)
                divisor = kwargs.get("divisor", world)
                for i, t in enumerate(mine):
                    want = combine([e[i] for e in everyone], op, dtype, divisor, kwargs.get("prescale", False),
                                   kwargs.get("fp32_accumulate", True))
                    check(f"{path} allreduce {op} {kwargs} {dtype} tensor {i}", t, want)
            case += 1
            everyone = [inputs(r, dtype, case) for r in range(world)]
            for root in range(world):
                mine = place(everyone[rank])
                client.broadcast_coalesced(mine, root=root).wait(60)
                for i, t in enumerate(mine):
                    check(f"{path} broadcast root {root} {dtype} tensor {i}", t, everyone[root][i])
            for op in ("sum", "max"):
                root = world - 1
                mine = place(everyone[rank])
                client.reduce_coalesced(mine, root=root, op=op).wait(60)
                for i, t in enumerate(mine):
                    want = combine([e[i] for e in everyone], op, dtype) if rank == root else everyone[rank][i]
                    check(f"{path} reduce {op} to {root} {dtype} tensor {i}", t, want)
            mine = place(everyone[rank])
            gathered = client.all_gather_coalesced(mine).wait(60)
            if len(gathered) != world:
                failures.append(f"{path} all_gather {dtype}: {len(gathered)} lists for {world} ranks")
            for r, row in enumerate(gathered):
                for i, t in enumerate(row):
                    check(f"{path} all_gather {dtype} rank {r} tensor {i}", t, everyone[r][i])
    # The same list again reuses its set; the staging path copied, the direct one did not.
    print(f"rank {rank}: {case} cases, {len(client._sets)} sets, staging copies {client.staging_copies}")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
