"""pg_options=gradsync.torch.Options(wire_dtype=...) on two nodes of two ranks each: what the
reductions carry between the nodes. With two nodes the cross-node stage is one combine, so each
result is known exactly: a node's sum p_n (float32, of its two ranks' inputs) rounded to the
wire dtype, the two added in float32 and rounded again, then stored in the tensor's dtype.

  "native"        float16 and bfloat16 tensors cross in their own type; float32 as float32;
  torch.bfloat16  float32 and bfloat16 tensors cross as bfloat16, float16 ones as float16 (bfloat16
                  would overflow their largest values); float64 as itself;
  None            (the default) every sum rounded once.

Checked for all_reduce, all_reduce_coalesced and reduce_scatter_tensor, each against the exact
expectation and against the default's (so that it shows it took effect); a bad wire_dtype is
refused naming it."""
import os

import torch
import torch.distributed as dist

import gradsync
import gradsync.torch  # registers the backend
from ops import exit_on_failures

failures = []
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def inputs(rank, dtype, n=4096):
    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)


def expected(dtype, wire, world):
    """What every rank holds after a sum over the `world` ranks (two per node)."""
    xs = [inputs(r, dtype).to(torch.float64 if dtype == torch.float64 else torch.float32) for r in range(world)]
    nodes = [xs[0] + xs[1], xs[2] + xs[3]]  # each node's local stage (float32 for the half types)
    if wire is None:
        return (nodes[0] + nodes[1]).to(dtype)
    carried = [p.to(wire).float() for p in nodes]
    return (carried[0] + carried[1]).to(wire).to(dtype)


def wire_of(setting, dtype):
    """The wire dtype a setting gives a tensor of `dtype` (Options' rules)."""
    if setting == "native":
        return dtype if dtype in (torch.float16, torch.bfloat16) else None
    if setting is None or dtype == torch.float64:
        return None
    return torch.float16 if dtype == torch.float16 else setting  # float16 never crosses as bfloat16


def run(setting, rank, world):
    group = dist.new_group(list(range(world)), backend="gradsync", pg_options=gradsync.torch.Options(wire_dtype=setting))
    for dtype in DTYPES:
        want = expected(dtype, wire_of(setting, dtype), world)
        plain = expected(dtype, None, world)
        what = f"wire_dtype={setting} {dtype}"
        mine = inputs(rank, dtype)
        dist.all_reduce(mine, group=group)
        if not torch.equal(mine, want):
            failures.append(f"{what} all_reduce: {(mine.double() - want.double()).abs().max()} from the expectation")
        # Took effect: the rounding at each hop differs from rounding once in many elements.
        differs = int((want != plain).sum())
        if (differs > 100) != (wire_of(setting, dtype) is not None):
            failures.append(f"{what}: {differs} elements differ from the default's result")
        pair = [inputs(rank, dtype), inputs(rank, dtype)]
        dist.all_reduce_coalesced(pair, group=group)
        for k, t in enumerate(pair):
            if not torch.equal(t, want):
                failures.append(f"{what} all_reduce_coalesced tensor {k}: {(t.double() - want.double()).abs().max()}")
        shard = torch.empty(want.numel() // world, dtype=dtype)
        dist.reduce_scatter_tensor(shard, inputs(rank, dtype), group=group) if hasattr(dist, "reduce_scatter_tensor") \
            else dist._reduce_scatter_base(shard, inputs(rank, dtype), group=group)
        mine_part = want[rank * shard.numel():(rank + 1) * shard.numel()]
        if not torch.equal(shard, mine_part):
            failures.append(f"{what} reduce_scatter_tensor: {(shard.double() - mine_part.double()).abs().max()}")
    dist.destroy_process_group(group)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 4, "two nodes of two ranks"
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    for setting in (None, "native", torch.bfloat16):
        run(setting, rank, world)
    for bad in ("fp8", torch.float32, "bfloat16"):
        try:
            gradsync.torch.Options(wire_dtype=bad)
            failures.append(f"Options(wire_dtype={bad!r}) was accepted")
        except gradsync.InvalidArgumentError as e:
            if "wire_dtype must be None, 'native', torch.bfloat16 or torch.float16" not in str(e):
                failures.append(f"Options(wire_dtype={bad!r}): {e}")
    print(f"rank {rank}: wire checks done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
