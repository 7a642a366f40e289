"""allreduce_hook's futures: a callback on one bucket's future that waits for a *later*
bucket's future (rank 1 comes 1 s late, so the callback runs where the future is completed, not
inline) finishes, with the right value, and the hook's later futures still complete in order."""
import threading
import time

import torch

import gradsync
import gradsync.torch
from ops import exit_on_failures

failures = []


class Bucket:
    """What the hook reads of DDP's GradBucket."""

    def __init__(self, index, tensor):
        self._index, self._tensor = index, tensor

    def index(self):
        return self._index

    def buffer(self):
        return self._tensor


def hook(client, index, tensor):
    return gradsync.torch.allreduce_hook(client, Bucket(index, tensor))


def main():
    client = gradsync.connect()
    rank, world = client.rank, client.world_size
    # Each bucket's staging set registered first (a registration waits for every local rank,
    # which would complete the first future before its callback is added).
    hook(client, 0, torch.zeros(3)).wait()
    hook(client, 1, torch.zeros(4)).wait()
    if rank == 1:
        time.sleep(1.0)
    first = hook(client, 0, torch.full((3,), float(rank)))
    second = hook(client, 1, torch.full((4,), float(rank + 10)))
    if rank == 0 and first.done():
        failures.append("the first future was done before its callback was added")
    chained = first.then(lambda _: second.wait() + 1)
    done = threading.Event()
    threading.Thread(target=lambda: (chained.wait(), done.set()), daemon=True).start()
    if not done.wait(20):
        failures.append("a hook future's callback that waits for a later bucket's future never finished")
        exit_on_failures(failures)  # its threads are stuck: the process must not wait for them
    mean = lambda f: float(sum(f(r) for r in range(world))) / world  # noqa: E731
    if not torch.equal(chained.value(), torch.full((4,), mean(lambda r: r + 10) + 1)):
        failures.append(f"the chained value is {chained.value().tolist()}")
    if not torch.equal(first.value(), torch.full((3,), mean(lambda r: r))):
        failures.append(f"the first bucket is {first.value().tolist()}")
    for step in range(3):
        got = hook(client, 0, torch.full((3,), float(rank + step))).wait()
        if not torch.equal(got, torch.full((3,), mean(lambda r: r + step))):
            failures.append(f"step {step}: {got.tolist()}")
    print(f"rank {rank}: hook callback checks done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
