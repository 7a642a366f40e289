"""init_process_group("gradsync", pg_options=gradsync.torch.Options(fallback="gloo")): the
operations the daemon does not offer (send, recv, all_to_all_single, scatter, gather) go through
a gloo group beside it, and give what torch's documentation says they give (all_to_all of
lists raises gloo's own error: gloo has none); the collectives the
daemon offers still go through the daemon. A group new_group makes without options inherits the
fallback, one made with Options() does not; pg_options of another type are refused naming it.
Under torch 2.x also DTensor over a 1-D mesh of the group: distribute_tensor (a scatter),
redistribution between shardings, a matmul, and full_tensor (an all_gather); at 4 ranks a 2-D
mesh too."""
import os
import sys
import time

import torch
import torch.distributed as dist

import gradsync
import gradsync.torch
from ops import exit_on_failures

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def equal(what, got, want):
    if not torch.equal(got, want):
        failures.append(f"{what}: got {got.flatten()[:8].tolist()}, want {want.flatten()[:8].tolist()}")


def point_to_point(rank, world):
    after, before = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(3)
    works = [dist.isend(torch.full((3,), float(rank)), after), dist.irecv(got, before)]
    for work in works:
        work.wait()
    equal("isend/irecv around the ring", got, torch.full((3,), float(before)))
    got = torch.zeros(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), 10.0 + rank), after), dist.P2POp(dist.irecv, got, before)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    equal("batch_isend_irecv", got, torch.full((2,), 10.0 + before))


def personalised(rank, world):
    # all_to_all_single, even: rank r sends 100 r + d to rank d and gets 100 s + r from each s.
    sent = torch.tensor([100.0 * rank + d for d in range(world)])
    got = torch.empty(world)
    dist.all_to_all_single(got, sent)
    equal("all_to_all_single", got, torch.tensor([100.0 * s + rank for s in range(world)]))
    # Uneven: rank r sends d + 1 elements to rank d, so it gets r + 1 from each.
    sent = torch.cat([torch.full((d + 1,), float(10 * rank + d)) for d in range(world)])
    got = torch.empty(world * (rank + 1))
    dist.all_to_all_single(got, sent, output_split_sizes=[rank + 1] * world,
                           input_split_sizes=[d + 1 for d in range(world)])
    equal("all_to_all_single with splits", got, torch.cat([torch.full((rank + 1,), float(10 * s + rank))
                                                           for s in range(world)]))
    try:  # the list form: gloo itself has none
        dist.all_to_all([torch.empty(2) for _ in range(world)], [torch.zeros(2) for _ in range(world)])
        failures.append("all_to_all of lists was accepted")
    except NotImplementedError as e:
        check("all_to_all of tensor lists is not offered" in str(e) and "all_to_all_single" in str(e),
              f"all_to_all of lists: unexpected message {e}")
    try:  # gloo's send takes a tensor's address as it is: CPU tensors only
        dist.send(torch.empty(2, device="meta"), (rank + 1) % world)
        failures.append("a send of a meta tensor was accepted")
    except NotImplementedError as e:
        check("send of a tensor on meta through the gloo fallback" in str(e), f"send of a meta tensor: {e}")
    # A barrier waits for what the fallback has in flight, as gloo's does.
    big = torch.full((world * (1 << 22),), float(rank))  # 16 MiB a rank
    out = torch.zeros_like(big)
    work = dist.all_to_all_single(out, big, async_op=True)
    dist.barrier()
    check(work.is_completed(), "a barrier returned while an all_to_all_single of the fallback was in flight")
    work.wait()
    check(out[-1].item() == float(world - 1), f"the all_to_all_single after the barrier ends with {out[-1].item()}")
    root = world - 1
    got = torch.empty(4)
    dist.scatter(got, [torch.full((4,), float(d) * 3) for d in range(world)] if rank == root else None, src=root)
    equal(f"scatter from rank {root}", got, torch.full((4,), float(rank) * 3))
    gathered = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank) + 0.5), gathered, dst=0)
    if rank == 0:
        for s in range(world):
            equal(f"gather from rank {s}", gathered[s], torch.full((2,), float(s) + 0.5))


def groups(rank, world):
    inherited = dist.new_group(list(range(world)))
    got = torch.empty(1)
    dist.scatter(got, [torch.full((1,), 7.0 + d) for d in range(world)] if rank == 0 else None, src=0,
                 group=inherited)
    equal("scatter on a group made without options (inherits the fallback)", got, torch.full((1,), 7.0 + rank))
    plain = dist.new_group(list(range(world)), pg_options=gradsync.torch.Options())
    try:
        dist.all_to_all_single(torch.empty(world), torch.zeros(world), group=plain)
        failures.append("all_to_all_single on a group made with Options() was accepted")
    except NotImplementedError as e:
        check("all_to_all_single is not offered" in str(e) and "fallback='gloo'" in str(e),
              f"all_to_all_single on a group without the fallback: unexpected message {e}")
    try:
        dist.new_group(list(range(world)), pg_options={"fallback": "gloo"})
        failures.append("pg_options of a dict was accepted")
    except ValueError as e:
        check("must be a gradsync.torch.Options, not a builtins.dict" in str(e), f"pg_options of a dict: {e}")
    try:
        gradsync.torch.Options(fallback="nccl")
        failures.append("Options(fallback='nccl') was accepted")
    except gradsync.InvalidArgumentError as e:
        check("fallback must be None or 'gloo', not 'nccl'" in str(e), f"Options(fallback='nccl'): {e}")


def through_the_daemon(rank, world):
    client = gradsync.torch.client_of()
    copies = client.staging_copies
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    equal("all_reduce", t, torch.full((5,), float(sum(range(1, world + 1)))))
    check(client.staging_copies > copies, "an all_reduce did not go through the daemon's staging")


def dtensors(rank, world):
    """torch 2.x's DTensor over a 1-D mesh of the gradsync group."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError as e:
        print(f"dtensor: not on this torch ({e})", flush=True)
        return
    mesh = init_device_mesh("cpu", (world,))
    check(isinstance(mesh.get_group(), gradsync.torch.backend.ProcessGroupGradsync),
          f"the mesh's group is a {type(mesh.get_group()).__name__}")
    whole = torch.arange(float(4 * world * 3)).reshape(4 * world, 3)  # the same on every rank
    rows = distribute_tensor(whole, mesh, [Shard(0)])
    equal("distribute_tensor, Shard(0): this rank's rows", rows.to_local(), whole.chunk(world)[rank])
    matrix = torch.arange(6.0).reshape(3, 2) - 2
    product = rows @ distribute_tensor(matrix, mesh, [Replicate()])
    equal("a matmul of DTensors, full_tensor", product.full_tensor(), whole @ matrix)
    resharded = rows.redistribute(mesh, [Shard(1)])  # all_to_all
    equal("redistribute Shard(0) -> Shard(1)", resharded.to_local(), whole.tensor_split(world, dim=1)[rank])
    equal("full_tensor after resharding", resharded.full_tensor(), whole)
    if world == 4:
        # A 2-D mesh: its groups (dp: ranks 0 and 2, 1 and 3; tp: 0 and 1, 2 and 3) are gradsync
        # groups made by new_group, which inherit the fallback; a tensor sharded on both. A mesh
        # whose dp groups are made with Options() of their own (backend_override) has none there.
        square = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        overridden = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"),
                                      backend_override={"dp": ("gradsync", gradsync.torch.Options())})
        try:
            dist.all_to_all_single(torch.empty(2), torch.zeros(2), group=overridden["dp"].get_group())
            failures.append("a backend_override with Options() kept the fallback")
        except NotImplementedError:
            pass
        dist.all_to_all_single(got := torch.empty(2), torch.full((2,), float(rank)), group=overridden["tp"].get_group())
        equal("all_to_all_single on the overridden mesh's tp group (the fallback inherited)", got,
              torch.tensor([float(rank - rank % 2), float(rank - rank % 2 + 1)]))
        check(all(isinstance(square[d].get_group(), gradsync.torch.backend.ProcessGroupGradsync) for d in ("dp", "tp")),
              "a 2-D mesh's groups are not gradsync groups")
        whole = torch.arange(64.0).reshape(8, 8)
        both = distribute_tensor(whole, square, [Shard(0), Shard(1)])
        dp, tp = divmod(rank, 2)
        equal("2-D mesh, Shard(0) x Shard(1): this rank's block", both.to_local(), whole[4 * dp:4 * dp + 4, 4 * tp:4 * tp + 4])
        equal("2-D mesh: redistribute to Replicate() x Shard(0)",
              both.redistribute(square, [Replicate(), Shard(0)]).to_local(), whole[4 * tp:4 * tp + 4])
        equal("2-D mesh: full_tensor", both.full_tensor(), whole)
    print(f"rank {rank}: dtensor checks done on torch {torch.__version__}", flush=True)


def gloo_default(rank, world):
    """The default group gloo's, a gradsync group made by new_group: it works, and inherits no
    fallback (torch 1.13's gloo group has `options` of its own, which are not gradsync's)."""
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    group = dist.new_group(backend="gradsync")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=group)
    equal("all_reduce on a gradsync group under a gloo default group", t, torch.full((3,), float(sum(range(1, world + 1)))))
    try:
        dist.all_to_all_single(torch.empty(world), torch.zeros(world), group=group)
        failures.append("a gradsync group under a gloo default group has a fallback it was not asked for")
    except NotImplementedError:
        pass
    print(f"rank {rank}: gloo default checks done", flush=True)


def _slow_reader():
    """This rank reads the agreement's answers 1.5 s late: the rank that hosts the store (0) has
    raised by then, and must not exit (taking the store's server along) before this rank has read
    them, or this rank fails with the store's "Connection reset by peer" instead of the reason."""
    made = dist.PrefixStore

    class Slow:
        def __init__(self, prefix, store):
            self._store = made(prefix, store)

        def __getattr__(self, name):
            return getattr(self._store, name)

        def get(self, key):
            time.sleep(1.5)
            return self._store.get(key)

    dist.PrefixStore = Slow


def bad_interface(rank, world):
    """Rank 1 cannot make gloo's device (no such interface): every rank fails at init, at once,
    naming rank 1 and gloo's reason, rather than the others waiting in gloo's connect."""
    if rank == 1:
        os.environ["GLOO_SOCKET_IFNAME"] = "nosuchif0"
        _slow_reader()
    started = time.monotonic()
    try:
        dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                                world_size=world, pg_options=gradsync.torch.Options(fallback="gloo"))
        failures.append("init_process_group succeeded with rank 1's gloo device missing")
    except Exception as e:  # noqa: BLE001 (torch's type with gradsync's text)
        check("the gloo fallback cannot be made on rank(s) 1: " in str(e) and "nosuchif0" in str(e),
              f"init with rank 1's gloo device missing: unexpected {type(e).__name__}: {e}")
        check(time.monotonic() - started < 20, f"init failed only after {time.monotonic() - started:.1f} s")
    print(f"rank {rank}: bad interface checks done", flush=True)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode = sys.argv[1] if len(sys.argv) > 1 else "fallback"
    if mode != "fallback":
        (gloo_default if mode == "gloo-default" else bad_interface)(rank, world)
        exit_on_failures(failures)
        return
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world, pg_options=gradsync.torch.Options(fallback="gloo"))
    point_to_point(rank, world)
    personalised(rank, world)
    groups(rank, world)
    through_the_daemon(rank, world)
    dtensors(rank, world)
    print(f"rank {rank}: fallback checks done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
