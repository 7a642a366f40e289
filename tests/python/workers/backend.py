"""The torch.distributed backend: init_process_group("gradsync") as the default group, and a
gloo group of the same ranks beside it as the reference. Every collective the backend offers,
on both groups, must give the same results; DDP without a hook on the gradsync group must train
as DDP on the gloo group (50 steps, parameters within 1e-6 relative); what the backend does not
offer raises NotImplementedError naming it."""
import inspect
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync.torch  # registers the backend
from ops import exit_on_failures

failures = []
# --cuda: the gradsync group's tensors on GPU 0 (both ranks share it), gloo's on the CPU (the
# values are small multiples of 1/4, so every sum is exact on both); the device check runs this.
DEVICE = "cuda:0" if "--cuda" in sys.argv else "cpu"


def on(t):
    """A tensor (or a list of them) on DEVICE, for the gradsync group."""
    return [on(x) for x in t] if isinstance(t, list) else t.to(DEVICE)


def check(condition, what):
    if not condition:
        failures.append(what)


def tensors_for(rank, seed, shape=(5, 3), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return (torch.randint(-8, 8, shape, generator=g).to(torch.float64) / 4).to(dtype)


def same(what, got, want):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        failures.append(f"{what}: gradsync gave {got.flatten()[:6].tolist()}..., gloo {want.flatten()[:6].tolist()}...")


def collectives(rank, world, gloo):
    seed = 0
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    for dtype in (torch.float32, torch.float64, torch.int32):
        for name, op in ops.items():
            seed += 1
            ours, theirs = on(tensors_for(rank, seed, dtype=dtype)), tensors_for(rank, seed, dtype=dtype)
            dist.all_reduce(ours, op=op)
            dist.all_reduce(theirs, op=op, group=gloo)
            same(f"all_reduce {name} {dtype}", ours, theirs)
    ours, theirs = on(tensors_for(rank, 40)), tensors_for(rank, 40)
    if hasattr(dist.ReduceOp, "AVG"):  # gloo has no AVG: the reference is a sum, divided
        dist.all_reduce(ours, op=dist.ReduceOp.AVG)
        dist.all_reduce(theirs, group=gloo)
        same("all_reduce avg", ours, theirs / world)
    if hasattr(dist, "all_reduce_coalesced"):
        theirs = [tensors_for(rank, 41), tensors_for(rank, 42, shape=(7,))]
        ours = on([t.clone() for t in theirs])
        dist.all_reduce_coalesced(ours)
        for t in theirs:
            dist.all_reduce(t, group=gloo)
        for i in range(2):
            same(f"all_reduce_coalesced tensor {i}", ours[i], theirs[i])
    if hasattr(dist, "all_gather_coalesced"):
        inputs = [tensors_for(rank, 43), tensors_for(rank, 44, shape=(2, 2))]
        ours = [[torch.empty_like(t, device=DEVICE) for t in inputs] for _ in range(world)]
        theirs = [[torch.empty_like(t) for t in inputs] for _ in range(world)]
        dist.all_gather_coalesced(ours, on(inputs))
        dist.all_gather_coalesced(theirs, inputs, group=gloo)
        for r in range(world):
            for i in range(2):
                same(f"all_gather_coalesced rank {r} tensor {i}", ours[r][i], theirs[r][i])
    # A second group of every rank, of the default backend (gradsync): a job of its own beside
    # the default group's, its collectives apart from the default group's.
    again = dist.new_group()
    ours, theirs = on(tensors_for(rank, 47)), tensors_for(rank, 47)
    dist.all_reduce(ours, group=again)
    dist.all_reduce(theirs, group=gloo)
    same("all_reduce on a second group of every rank", ours, theirs)
    check(gradsync.torch.client_of(again).job != gradsync.torch.client_of().job,
          "a second group of every rank joined the default group's job")
    # A sparse COO tensor (nn.Embedding(sparse=True)'s gradient): gloo sums sparse tensors too.
    if DEVICE == "cpu":
        g = torch.Generator().manual_seed(46 + rank)
        indices = torch.randint(0, 10, (1, 6), generator=g)
        values = (torch.randint(-8, 8, (6, 3), generator=g).to(torch.float32) / 4)
        ours = torch.sparse_coo_tensor(indices, values, (10, 3))
        theirs = torch.sparse_coo_tensor(indices, values, (10, 3))
        dist.all_reduce(ours)
        dist.all_reduce(theirs, group=gloo)
        same("all_reduce of a sparse tensor", ours.to_dense(), theirs.to_dense())
    # Tensors in the daemon's reach (gradsync.torch.empty on the group's client) are used in
    # place: nothing is staged.
    client = gradsync.torch.client_of()
    ours = gradsync.torch.empty(client, (5, 3), device=DEVICE)
    ours.copy_(tensors_for(rank, 45))
    theirs = tensors_for(rank, 45)
    copies = client.staging_copies
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    same("all_reduce of a gradsync.torch.empty tensor", ours, theirs)
    check(client.staging_copies == copies,
          f"an all_reduce of a gradsync.torch.empty tensor staged {client.staging_copies - copies} copies")
    # async_op: a Work whose wait() and get_future() work
    t = on(tensors_for(rank, 50))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check(work.is_completed(), "an all_reduce Work is not completed after wait()")
    check(torch.equal(work.get_future().wait()[0], t), "the Work's future does not hold the tensor")
    for root in range(world):
        ours, theirs = on(tensors_for(rank, 60 + root)), tensors_for(rank, 60 + root)
        dist.broadcast(ours, src=root)
        dist.broadcast(theirs, src=root, group=gloo)
        same(f"broadcast from {root}", ours, theirs)
        ours, theirs = on(tensors_for(rank, 70 + root)), tensors_for(rank, 70 + root)
        dist.reduce(ours, dst=root)
        dist.reduce(theirs, dst=root, group=gloo)
        if rank == root:  # gloo leaves the others' tensors unspecified
            same(f"reduce to {root}", ours, theirs)
    mine = tensors_for(rank, 80)
    ours = [torch.empty_like(mine, device=DEVICE) for _ in range(world)]
    theirs = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(ours, on(mine))
    dist.all_gather(theirs, mine, group=gloo)
    for r in range(world):
        same(f"all_gather rank {r}", ours[r], theirs[r])
    if hasattr(dist, "all_gather_into_tensor"):
        flat_ours = torch.empty(world * mine.numel(), device=DEVICE)
        dist.all_gather_into_tensor(flat_ours, on(mine.reshape(-1)))
        same("all_gather_into_tensor", flat_ours, torch.cat([t.reshape(-1) for t in theirs]))
    inputs = [tensors_for(rank, 90 + r) for r in range(world)]
    ours = torch.empty_like(inputs[0], device=DEVICE)
    dist.reduce_scatter(ours, on([t.clone() for t in inputs]))
    # gloo has no reduce_scatter on torch 1.13: the reference is an all_reduce of input `rank`.
    reference = [t.clone() for t in inputs]
    for t in reference:
        dist.all_reduce(t, group=gloo)
    same("reduce_scatter", ours, reference[rank])
    if hasattr(dist, "reduce_scatter_tensor"):
        flat = on(torch.cat([t.reshape(-1) for t in inputs]))
        out = torch.empty(inputs[0].numel(), device=DEVICE)
        dist.reduce_scatter_tensor(out, flat)
        same("reduce_scatter_tensor", out, reference[rank].reshape(-1))
    if "async_ops" in inspect.signature(getattr(dist, "_coalescing_manager", lambda: None)).parameters:
        coalescing_manager(rank, world, gloo)  # torch 2.x's; 1.13's takes requests, not ops
    dist.barrier()
    if DEVICE != "cpu":
        # The stream rule: a collective waits for what the caller's current stream queued
        # before it, and wait() makes that stream wait for the result (no host sync between).
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.full((1 << 20,), float(rank + 1), device=DEVICE)
            t.mul_(2).add_(1)  # queued on `side` before the collective
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            t.sub_(1)  # queued after wait(): sees the sum
        side.synchronize()
        want = float(sum(2 * (r + 1) + 1 for r in range(world)) - 1)
        check(torch.equal(t.cpu(), torch.full((1 << 20,), want)), f"stream-ordered all_reduce gave {t[0].item()}, not {want}")
    for what, call in (("send", lambda: dist.send(torch.ones(1), dst=(rank + 1) % world)),
                       ("all_to_all", lambda: dist.all_to_all([torch.ones(1)] * world, [torch.ones(1)] * world)),
                       ("scatter", lambda: dist.scatter(torch.ones(1), [torch.ones(1)] * world if rank == 0 else None,
                                                         src=0))):
        try:
            call()
            failures.append(f"{what} was accepted")
        except (NotImplementedError, RuntimeError) as e:
            if f"{what} is not offered" not in str(e) and f"{what} of tensor lists is not offered" not in str(e):
                failures.append(f"{what}: unexpected message {e}")
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PRODUCT)
        failures.append("a product all_reduce was accepted")
    except (NotImplementedError, RuntimeError) as e:
        if "is not offered" not in str(e):
            failures.append(f"product: unexpected message {e}")


def coalescing_manager(rank, world, gloo):
    """torch 2.x's dist._coalescing_manager: the all_reduce, all_gather_into_tensor or
    reduce_scatter_tensor calls made inside it are one call of the group's coalesced form
    (allreduce_coalesced, allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced)."""
    shapes = [(5, 3), (7,), (2, 2)]
    theirs = [tensors_for(rank, 100 + i, shape=shape) for i, shape in enumerate(shapes)]
    ours = on([t.clone() for t in theirs])
    with dist._coalescing_manager():
        for t in ours:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    for i, t in enumerate(theirs):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        same(f"coalescing manager: all_reduce max of tensor {i}", ours[i], t)
    inputs = [tensors_for(rank, 110 + i, shape=shape).reshape(-1) for i, shape in enumerate(shapes)]
    outputs = [torch.empty(world * t.numel(), device=DEVICE) for t in inputs]
    with dist._coalescing_manager(async_ops=True) as cm:
        for output, mine in zip(outputs, on(inputs)):
            dist.all_gather_into_tensor(output, mine)
    cm.wait()
    for i, t in enumerate(inputs):
        gathered = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(gathered, t, group=gloo)
        same(f"coalescing manager: all_gather_into_tensor of tensor {i}", outputs[i], torch.cat(gathered))
    # Inputs of 6, 1 and 4 elements a rank (and an empty one): each rank's outputs are its
    # chunks of the reduced inputs, as if each were reduce-scattered alone.
    inputs = [tensors_for(rank, 120 + i, shape=(world * n,)) for i, n in enumerate((6, 1, 0, 4))]
    outputs = [torch.full((t.numel() // world,), -1.0, device=DEVICE) for t in inputs]
    with dist._coalescing_manager():
        for output, mine in zip(outputs, on(inputs)):
            dist.reduce_scatter_tensor(output, mine, op=dist.ReduceOp.SUM)
    for i, t in enumerate(inputs):
        dist.all_reduce(t, group=gloo)
        same(f"coalescing manager: reduce_scatter_tensor of tensor {i}", outputs[i], t.chunk(world)[rank]
             if t.numel() else t)
    try:
        with dist._coalescing_manager():
            dist.reduce_scatter_tensor(torch.empty(2, device=DEVICE), torch.ones(2 * world, device=DEVICE))
            dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.float64, device=DEVICE),
                                       torch.ones(2 * world, dtype=torch.float64, device=DEVICE))
        failures.append("a coalesced reduce_scatter_tensor of two dtypes was accepted")
    except ValueError as e:
        check("of several dtypes (torch.float32, torch.float64)" in str(e),
              f"a coalesced reduce_scatter_tensor of two dtypes: unexpected message {e}")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def side_by_side(nets, rank, steps, device="cpu"):
    """`steps` steps of SGD on each of `nets` (wrapped copies of one model), on the same data."""
    optimizers = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(8, 16, generator=g).to(device), torch.randn(8, 4, generator=g).to(device)
        for net, optimizer in zip(nets, optimizers):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()


def train(rank, gloo, steps=50):
    torch.manual_seed(5)
    reference, ours = Model().to(DEVICE), Model().to(DEVICE)  # gloo takes CUDA tensors too
    ours.load_state_dict(reference.state_dict())
    # ours: the default group, gradsync
    side_by_side([DDP(reference, process_group=gloo), DDP(ours)], rank, steps, DEVICE)
    for name, value in reference.state_dict().items():
        try:
            torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-6, atol=1e-7)
        except AssertionError as e:
            failures.append(f"after {steps} steps, {name} differs from DDP on gloo: {str(e).splitlines()[0]}")
    if torch.equal(reference.net[0].weight.cpu(), Model().net[0].weight):
        failures.append("the model did not train")


def releases(rank, world):
    """Layouts that come and go (all_gather_object's way): their staging sets, host or CUDA,
    are released once unused and their memory reused, every result staying right."""
    pg = dist.distributed_c10d._get_default_group()
    client = gradsync.torch.client_of()
    before, pg.release_after = pg.release_after, 20
    allocations, released = len(client._allocations), client._released_sets
    for i in range(160):
        n = 1 + (i * 37) % 50
        t = on(torch.full((n,), float(rank + i)))
        dist.all_reduce(t)
        same(f"all_reduce {i} of {n} elements among released sets", t,
             torch.full((n,), float(sum(r + i for r in range(world)))))
        if i % 3 == 0:  # allgathers too: their outputs (the client library's, on the GPU for CUDA) are reused
            out = [on(torch.empty(n)) for _ in range(world)]
            dist.all_gather(out, on(torch.full((n,), float(rank * 1000 + i))))
            for r in range(world):
                same(f"all_gather {i} of {n} elements among released sets, rank {r}'s part", out[r],
                     torch.full((n,), float(r * 1000 + i)))
    check(client._released_sets > released, f"no {DEVICE} staging set was released")
    layouts = len({1 + (i * 37) % 50 for i in range(160)}) + len({1 + (i * 37) % 50 for i in range(0, 160, 3)})
    check(len(client._allocations) - allocations < 0.9 * layouts,
          f"{len(client._allocations) - allocations} staging allocations for {layouts} layouts: released memory "
          "was not reused")
    # Ever-growing sizes: areas no later set took go back to the daemon (on CUDA, once its GPU is
    # through them and NCCL's registration of them is undone) two sweeps (128 collectives) after
    # their last use, so memory does not grow with the sum of every size made (backend_errors.py's
    # `growing` bounds what is held, on the CPU); here, that areas on DEVICE are freed at all.
    freed = client._freed_staging
    sizes = [1024 * i for i in range(1, 161)]  # floats: 4 KiB to 640 KiB, 50 MiB in all
    for i, n in enumerate(sizes):
        t = on(torch.full((n,), float(rank + i)))
        dist.all_reduce(t)
        want = float(sum(r + i for r in range(world)))
        check(t[0].item() == want and t[-1].item() == want,
              f"all_reduce {i} of {n} growing elements gave {t[0].item()}, not {want}")
    device = -1 if DEVICE == "cpu" else 0
    held = sum(nbytes for _, nbytes, d in client._allocations if d == device)
    print(f"growing on {DEVICE}: {client._freed_staging - freed} staging areas freed, {held >> 10} KiB held after "
          f"{len(sizes)} calls of {4 * sum(sizes) >> 10} KiB in all", flush=True)
    check(client._freed_staging > freed, f"no {DEVICE} staging area was freed")
    pg.release_after = before


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    check(dist.get_backend() == "gradsync", f"the default group's backend is {dist.get_backend()}")
    gloo = dist.new_group(backend="gloo")
    collectives(rank, world, gloo)
    releases(rank, world)
    if "--collectives-only" not in sys.argv:
        train(rank, gloo)
    print(f"rank {rank}: backend checks done")
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
