"""reduce_scatter_coalesced on every dtype and reduce mode, on ordinary tensors (the staging path)
and on tensors in the client's memory (direct), against torch: each rank combines every rank's
inputs (seeded by rank) in rank order, flattens them and takes its shard of ceil(N / W)."""

import torch

import gradsync
import gradsync.torch
from ops import DTYPES, Direct, combine, exit_on_failures, expect, inputs

failures = []


def main():
    client = gradsync.connect()
    rank, world = client.rank, client.world_size
    direct = Direct(client)
    case = 0
    for path in ("staging", "direct"):
        place = (lambda ts: [t.clone() for t in ts]) if path == "staging" else direct.like
        for dtype in DTYPES:
            modes = [("sum", {}), ("min", {}), ("max", {})]
            if dtype.is_floating_point:
                modes += [("avg", {}), ("avg", {"prescale": True}), ("avg", {"divisor": 3.0})]
            for op, kwargs in modes:
                case += 1
                everyone = [inputs(r, dtype, case) for r in range(world)]
                mine = place(everyone[rank])
                work = client.reduce_scatter_coalesced(mine, op=op, **kwargs)
                shard = work.wait(60)
                flat = torch.cat([combine([e[i] for e in everyone], op, dtype, kwargs.get("divisor", world),
                                          kwargs.get("prescale", False)) for i in range(len(mine))])
                size = -(-flat.numel() // world)
                first = min(flat.numel(), rank * size)
                want = flat[first:first + size]
                what = f"{path} reduce_scatter {op} {kwargs} {dtype}"
                if work.shard_first != first:
                    failures.append(f"{what}: shard_first {work.shard_first}, want {first}")
                # sum, min and max are exact in any order of rank-ordered float32 accumulation;
                # avg's division is compared with torch's tolerance.
                expect(failures, what, shard, want, exact=op != "avg")
                for i, t in enumerate(mine):
                    expect(failures, f"{what}: input {i} after", t, everyone[rank][i], exact=True)
    # A list of mixed dtypes is refused before anything is registered.
    try:
        client.reduce_scatter_coalesced([torch.zeros(4), torch.zeros(4, dtype=torch.float64)], op="sum")
        failures.append("a mixed-dtype reduce_scatter was accepted")
    except gradsync.InvalidArgumentError as e:
        if "one reduce-scatter takes tensors of one dtype" not in str(e):
            failures.append(f"mixed dtypes: unexpected message {e}")
    print(f"rank {rank}: {case} cases")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
