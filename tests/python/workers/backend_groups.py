"""dist.new_group with the gradsync backend: every rank makes the same groups, each of which
is a gradsync job of its own. Each is checked against a gloo group of the same ranks in the
same processes: all_reduce, broadcast from the group's last rank, all_gather, and DDP on a
group for 20 steps (parameters within 1e-6 relative).

The groups, for 4 ranks (2 per node when on two nodes):
  blocks   [0, 1] and [2, 3]   the ranks of one node (on two nodes), 2 local ranks each;
  strided  [0, 2] and [1, 3]   one rank of each node: a job across both nodes, 1 local rank;
  default  [1, 2, 3] on one node (a group of 3 of 4, made with no backend named: the default
           group's, gradsync); on two nodes, a group not node by node, made on every rank
           with a warning, whose collectives raise, naming its layout.
Then a group is destroyed (it says so when used) and one of the same ranks made again, which
works as the first did, and the destroyed groups' future waiter threads end. Every rank claims
the same host name, which must not matter: the groups' nodes come from the default group.
"""
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync.torch  # registers the backend
from backend import Model, same, side_by_side, tensors_for
from ops import exit_on_failures

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def exercise(name, ranks, ours, gloo, rank, seed):
    """The collectives on a gradsync group and on a gloo group of the same ranks, compared."""
    if rank not in ranks:
        check(ours == dist.GroupMember.NON_GROUP_MEMBER, f"{name}: rank {rank} is not in {ranks} but got a group")
        return
    check(dist.get_backend(ours) == "gradsync", f"{name}: its backend is {dist.get_backend(ours)}")
    check(dist.get_rank(ours) == ranks.index(rank), f"{name}: group rank {dist.get_rank(ours)}, "
                                                   f"not {ranks.index(rank)}")
    check(dist.get_world_size(ours) == len(ranks), f"{name}: group size {dist.get_world_size(ours)}")
    mine, theirs = tensors_for(rank, seed), tensors_for(rank, seed)
    dist.all_reduce(mine, group=ours)
    dist.all_reduce(theirs, group=gloo)
    same(f"{name} {ranks}: all_reduce", mine, theirs)
    want = sum(tensors_for(r, seed) for r in ranks)  # only the group's ranks are summed
    same(f"{name} {ranks}: all_reduce against the members' sum", mine, want)
    mine, theirs = tensors_for(rank, seed + 1, dtype=torch.float64), tensors_for(rank, seed + 1, dtype=torch.float64)
    dist.broadcast(mine, src=ranks[-1], group=ours)
    dist.broadcast(theirs, src=ranks[-1], group=gloo)
    same(f"{name} {ranks}: broadcast from rank {ranks[-1]}", mine, theirs)
    piece = tensors_for(rank, seed + 2, shape=(3,))
    mine = [torch.empty(3) for _ in ranks]
    theirs = [torch.empty(3) for _ in ranks]
    dist.all_gather(mine, piece, group=ours)
    dist.all_gather(theirs, piece, group=gloo)
    for i, (a, b) in enumerate(zip(mine, theirs)):
        same(f"{name} {ranks}: all_gather from group rank {i}", a, b)


def train(ranks, ours, gloo, rank, steps=20):
    """DDP on the gradsync group against DDP on the gloo group of the same ranks."""
    if rank not in ranks:
        return
    torch.manual_seed(7)
    reference, model = Model(), Model()
    model.load_state_dict(reference.state_dict())
    side_by_side([DDP(reference, process_group=gloo), DDP(model, process_group=ours)], rank, steps)
    for name, value in reference.state_dict().items():
        try:
            torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-6, atol=1e-7)
        except AssertionError as e:
            failures.append(f"DDP on {ranks}: after {steps} steps, {name} differs from DDP on gloo: "
                            f"{str(e).splitlines()[0]}")


def waiters_end(within=5.0):
    """Whether every group's future waiter thread ended (each group's ends when it is shut down)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name == "gradsync-pg-waiter"]:
            return True
        time.sleep(0.05)
    return False


def destroy(group):
    """destroy_process_group; torch 1.13's does not call the group's shutdown(): called here."""
    dist.destroy_process_group(group)
    if not hasattr(dist.ProcessGroup, "shutdown"):
        group.shutdown()


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", world))
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    # Every rank claims one and the same host and daemon, as clones of one machine image named
    # alike would: the groups' nodes come from the default group's layout, not from these.
    gradsync.torch.backend._node_of_this_rank = lambda: "host clone (daemon /run/gradsync/gradsync.sock)"
    blocks = [[0, 1], [2, 3]]
    strided = [[0, 2], [1, 3]]
    made = {}
    for name, groups in (("blocks", blocks), ("strided", strided)):
        for ranks in groups:  # every rank makes every group, in the same order
            made[(name, tuple(ranks))] = (dist.new_group(ranks, backend="gradsync"),
                                           dist.new_group(ranks, backend="gloo"))
    for seed, ((name, ranks), (ours, gloo)) in enumerate(made.items()):
        exercise(name, list(ranks), ours, gloo, rank, 10 * seed)
    for ranks in strided:
        train(ranks, *made[("strided", tuple(ranks))], rank)  # DDP: a future waiter thread per group

    # Destroyed, and made again: a new job of the same ranks. A destroyed group says so.
    ours, gloo = made.pop(("blocks", (0, 1)))
    if rank in (0, 1):
        destroy(ours)
        try:
            ours.allreduce([torch.ones(1)])  # the group's own (torch 2.x refuses it before, by its map)
            failures.append("an all_reduce on a destroyed group ran")
        except Exception as e:  # noqa: BLE001 (torch's type, gradsync's text)
            check("was destroyed" in str(e), f"an all_reduce on a destroyed group raised {type(e).__name__}: {e}")
    again = dist.new_group([0, 1], backend="gradsync")
    exercise("blocks made again", [0, 1], again, gloo, rank, 90)
    for ranks in strided:
        if rank in ranks:
            destroy(made[("strided", tuple(ranks))][0])
    check(waiters_end(), "the destroyed groups' future waiter threads are still running")

    if nodes == 1:
        three, gloo3 = dist.new_group([1, 2, 3]), dist.new_group([1, 2, 3], backend="gloo")
        exercise("default backend", [1, 2, 3], three, gloo3, rank, 100)
    else:
        # Two ranks on node 0 and one on node 1: not a gradsync job. new_group returns on every
        # rank (torch 1.13's barrier after it does not wait for the timeout), with a warning on
        # the members, and each collective on it raises, naming the layout by global ranks.
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            odd = dist.new_group([0, 1, 2], backend="gradsync")
        if rank in (0, 1, 2):
            check(any("not laid out as a gradsync job is" in str(w.message) for w in warned),
                  f"no warning at new_group: {[str(w.message) for w in warned]}")
            try:
                dist.all_reduce(torch.ones(1), group=odd)
                failures.append("a group of 2 ranks on one node and 1 on the other reduced")
            except NotImplementedError as e:
                check("node 0: ranks [0, 1]; node 1: ranks [2]" in str(e) and "backend='gloo'" in str(e),
                      f"the refusal says: {e}")
                print(f"rank {rank}: refused: {e}", flush=True)
        else:
            check(odd == dist.GroupMember.NON_GROUP_MEMBER, "rank 3 got a group of [0, 1, 2]")
    print(f"rank {rank}: group checks done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
