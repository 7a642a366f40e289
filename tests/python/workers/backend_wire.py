"""pg_options=gradsync.torch.Options(wire_dtype=...) on two nodes of two ranks each: what the
reductions carry between the nodes. With two nodes the cross-node stage is one combine, so each
result is known exactly: a node's sum p_n (float32, of its two ranks' inputs) rounded to the
wire dtype, the two added in float32 and rounded again, then stored in the tensor's dtype.

The rules (written here again, independently of the backend's _wire_for):
  None            every sum rounded once;
  "native"        float16 and bfloat16 tensors cross in their own type; float32 as float32;
  torch.bfloat16  float32 tensors cross as it, half tensors in their own type;
  "float16"       (a name) the same with float16;
  a half tensor never crosses as the other half type: a call mixing float32 with the other half
  type, or both half types, crosses as the default; float64 always does.

Checked for all_reduce, all_reduce_coalesced (one dtype, and mixed), reduce_scatter_tensor,
reduce, the DDP hook with HookState(client, group, wire_dtype) (the same rules), an avg near
float16's range (divided before the sum under a wire dtype, as NCCL's avg is), and a
new_group without options of its own, which inherits the default group's; each against the exact
expectation and against the default's, so that it shows the setting took effect."""
import copy
import os

import torch
import torch.distributed as dist

import gradsync
import gradsync.torch  # registers the backend
from ops import exit_on_failures

failures = []
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)
NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def wire_of(setting, dtypes):
    """The wire dtype a setting gives a call of tensors of `dtypes` (the rules above)."""
    setting = NAMES.get(setting, setting)
    if setting is None or any(d not in (torch.float32,) + HALVES for d in dtypes):
        return None
    halves = {d for d in dtypes if d in HALVES}
    if len(halves) > 1:
        return None
    if halves:
        (half,) = halves
        return half if all(d == half for d in dtypes) or setting == half else None
    return None if setting == "native" else setting


def inputs(rank, dtype, k=0, n=4096):
    g = torch.Generator().manual_seed(1000 + 10 * rank + k)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)


def expected(dtype, wire, world, k=0):
    """What every rank holds after a sum over the `world` ranks (two per node)."""
    xs = [inputs(r, dtype, k).to(torch.float64 if dtype == torch.float64 else torch.float32) for r in range(world)]
    nodes = [xs[0] + xs[1], xs[2] + xs[3]]  # each node's local stage (float32 for the half types)
    if wire is None:
        return (nodes[0] + nodes[1]).to(dtype)
    carried = [p.to(wire).float() for p in nodes]
    return (carried[0] + carried[1]).to(wire).to(dtype)


def compare(what, got, want):
    if not torch.equal(got, want):
        failures.append(f"{what}: {(got.double() - want.double()).abs().max()} from the expectation")


class _Bucket:
    """What allreduce_hook reads of a DDP bucket."""

    def __init__(self, tensor, index):
        self._tensor, self._index = tensor, index

    def buffer(self):
        return self._tensor

    def get_tensor(self):
        return self._tensor

    def index(self):
        return self._index


def run(setting, rank, world, group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    client = gradsync.torch.client_of(pg)
    for dtype in FLOATS:
        wire = wire_of(setting, [dtype])
        want, plain = expected(dtype, wire, world), expected(dtype, None, world)
        what = f"wire_dtype={setting} {dtype}"
        mine = inputs(rank, dtype)
        dist.all_reduce(mine, group=group)
        compare(what + " all_reduce", mine, want)
        # Took effect: rounding at each hop differs from rounding once in many elements.
        differs = int((want != plain).sum())
        if (differs > 100) != (wire is not None):
            failures.append(f"{what}: {differs} elements differ from the default's result")
        pair = [inputs(rank, dtype), inputs(rank, dtype)]
        dist.all_reduce_coalesced(pair, group=group)
        for k, t in enumerate(pair):
            compare(f"{what} all_reduce_coalesced tensor {k}", t, want)
        shard = torch.empty(want.numel() // world, dtype=dtype)
        if hasattr(dist, "reduce_scatter_tensor"):
            dist.reduce_scatter_tensor(shard, inputs(rank, dtype), group=group)
        else:
            dist._reduce_scatter_base(shard, inputs(rank, dtype), group=group)
        compare(what + " reduce_scatter_tensor", shard, want[rank * shard.numel():(rank + 1) * shard.numel()])
        # reduce to rank 1 (node 0): both nodes' sums cross in the wire dtype and combine once.
        mine = inputs(rank, dtype)
        dist.reduce(mine, dst=1, group=group)
        if rank == 1:
            compare(what + " reduce", mine, want)
        # The DDP hook with HookState's wire_dtype: an avg over 4 ranks, divided first under a
        # wire dtype; dividing by 4 is exact, so the expectation is the sum's over 4.
        state = gradsync.torch.HookState(client, None, setting)
        got = gradsync.torch.allreduce_hook(state, _Bucket(inputs(rank, dtype), FLOATS.index(dtype))).wait()
        compare(what + " allreduce_hook", got, (want.double() / world).to(dtype))
    # Mixed calls: one wire dtype per call, by the rules. torch's own all_reduce_coalesced refuses
    # mixed dtypes; the group's method (what torch 2.x's coalescing manager calls) takes them.
    for dtypes in ((torch.float32, torch.bfloat16), (torch.float32, torch.float16), (torch.float16, torch.bfloat16)):
        wire = wire_of(setting, dtypes)
        mixed = [inputs(rank, d, k) for k, d in enumerate(dtypes)]
        pg.allreduce_coalesced(mixed).wait()
        for k, (t, d) in enumerate(zip(mixed, dtypes)):
            compare(f"wire_dtype={setting} mixed {dtypes} tensor {k} (wire {wire})", t, expected(d, wire, world, k))
    # An avg of float16 near its range: 20000 on every rank. Divided after the sum, the node sums
    # (40000) would combine to 80000, inf in float16; divided first (under a wire dtype, as NCCL
    # does) every step is exact.
    big = torch.full((64,), 20000.0, dtype=torch.float16)
    dist.all_reduce(big, op=dist.ReduceOp.AVG, group=group)
    if not torch.equal(big, torch.full((64,), 20000.0, dtype=torch.float16)):
        failures.append(f"wire_dtype={setting} avg of float16 20000: {big[:4].tolist()}")
    big = torch.full((64,), 20000.0, dtype=torch.float16)
    dist.reduce(big, dst=1, op=dist.ReduceOp.AVG, group=group)
    if rank == 1 and not torch.equal(big, torch.full((64,), 20000.0, dtype=torch.float16)):
        failures.append(f"wire_dtype={setting} reduce avg of float16 20000: {big[:4].tolist()}")
    big = torch.full((64,), 20000.0, dtype=torch.float16)
    got = gradsync.torch.allreduce_hook(gradsync.torch.HookState(client, None, setting), _Bucket(big, 99)).wait()
    if not torch.equal(got, torch.full((64,), 20000.0, dtype=torch.float16)):
        failures.append(f"wire_dtype={setting} allreduce_hook of float16 20000: {got[:4].tolist()}")


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 4, "two nodes of two ranks"
    # The default group asks for "native"; a new_group without options inherits it.
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world, pg_options=gradsync.torch.Options(wire_dtype="native"))
    run("native", rank, world, None)
    inherited = dist.new_group(list(range(world)), backend="gradsync")
    run("native", rank, world, inherited)
    dist.destroy_process_group(inherited)
    for setting in (None, torch.bfloat16, "float16"):
        group = dist.new_group(list(range(world)), backend="gradsync",
                               pg_options=gradsync.torch.Options(wire_dtype=setting))
        run(setting, rank, world, group)
        dist.destroy_process_group(group)
    for bad in ("fp8", torch.float32, 3):
        try:
            gradsync.torch.Options(wire_dtype=bad)
            failures.append(f"Options(wire_dtype={bad!r}) was accepted")
        except gradsync.InvalidArgumentError as e:
            if "wire_dtype must be None, 'native', torch.bfloat16 or torch.float16" not in str(e):
                failures.append(f"Options(wire_dtype={bad!r}): {e}")
        try:
            gradsync.torch.HookState(gradsync.torch.client_of(), None, bad)
            failures.append(f"HookState(wire_dtype={bad!r}) was accepted")
        except gradsync.InvalidArgumentError as e:
            if "gradsync.torch.HookState: wire_dtype must be None" not in str(e):
                failures.append(f"HookState(wire_dtype={bad!r}): {e}")
    # HookState: copies keep the fields; a client that is not one, a torch group as the group and
    # a tuple state of the wrong length are refused, naming what is wrong.
    client = gradsync.torch.client_of()
    state = gradsync.torch.HookState(client, None, "bfloat16")
    copied = copy.copy(state)
    if (copied.client, copied.group, copied.wire_dtype) != (client, None, torch.bfloat16):
        failures.append(f"a copy of a HookState is {copied!r}")
    refusals = [(lambda: gradsync.torch.HookState("client"), "client must be a gradsync.Client"),
                (lambda: gradsync.torch.HookState(client, dist.distributed_c10d._get_default_group()),
                 "a torch ProcessGroup is not one"),
                (lambda: gradsync.torch.allreduce_hook((client, None, None, None), _Bucket(torch.ones(4), 0)),
                 "not a tuple of 4")]
    for make, text in refusals:
        try:
            make()
            failures.append(f"accepted, expected a refusal saying {text!r}")
        except gradsync.InvalidArgumentError as e:
            if text not in str(e):
                failures.append(f"refusal {e} does not say {text!r}")
    try:
        gradsync.torch.Options(wire_dtype="native").wire_dtype = torch.bfloat16
        failures.append("Options.wire_dtype could be changed after construction")
    except AttributeError:
        pass
    print(f"rank {rank}: wire checks done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
