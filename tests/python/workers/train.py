"""A small model trained for STEPS steps on two ranks, one of three ways:
  gloo        torch DDP on the gloo backend (the reference)
  hook        torch DDP with gradsync.torch.allreduce_hook
  gradbuffer  gradsync.torch.GradBuffer, no DDP
Saves the final parameters to OUT_rank.pt and prints the client's staging counters over the
training steps.
usage: train.py MODE OUT STEPS [cuda]"""
import copy
import os
import pickle
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync
import gradsync.torch


def model(device):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(device)


def batch(rank, step, device):
    g = torch.Generator().manual_seed(10_000 * rank + step)
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)
    return x.to(device), y.to(device)


def main():
    mode, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    device = "cuda:0" if len(sys.argv) > 4 and sys.argv[4] == "cuda" else "cpu"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    net = model(device)
    client = None
    if mode in ("gloo", "hook"):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                                world_size=world)
        net = DDP(net, bucket_cap_mb=0.002)  # about 2 KB: several buckets, reduced while backward runs
        if mode == "hook":
            client = gradsync.connect()
            net.register_comm_hook(client, gradsync.torch.allreduce_hook)
    else:
        client = gradsync.connect()
        gradsync.torch.sync_params(net, client)
        buffer = gradsync.torch.GradBuffer(net.parameters(), client, bucket_bytes=2048)  # several buckets
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    before = client.staging_copies if client is not None else 0  # sync_params stages; the steps are counted
    for step in range(steps):
        x, y = batch(rank, step, device)
        if mode == "gradbuffer":
            buffer.zero_grad()
        else:
            optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        if mode == "gradbuffer":
            buffer.wait()
        optimizer.step()
    if mode == "hook":
        # A deep copy of the DDP model (what torch.optim.swa_utils.AveragedModel makes): torch 2.x
        # copies the comm hook's state with it, the client, which copies as itself.
        twin = copy.deepcopy(net)
        if copy.deepcopy(client) is not client or copy.copy(client) is not client:
            raise AssertionError("a copy of the client is another object")
        for a, b in zip(twin.parameters(), net.parameters()):
            if not torch.equal(a, b):
                raise AssertionError("the deep copy's parameters differ")
        try:
            pickle.dumps(client)
            raise AssertionError("a client was pickled")
        except TypeError as e:
            if "cannot be pickled" not in str(e):
                raise
    module = net.module if isinstance(net, DDP) else net
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, f"{out}_{rank}.pt")
    if client is not None:
        extra = ""
        if mode == "gradbuffer":
            # Which hook marked the parameters ready (training_check.py checks it against torch's version).
            post = getattr(next(net.parameters()), "_post_accumulate_grad_hooks", None)
            path = "post-accumulate-grad" if post else "grad-accumulator" if buffer._accumulators else "none"
            extra = f" buffer copies {buffer.staging_copies} hook path {path}"
        print(f"rank {rank} {mode}: loss {loss.item():.6f} staging copies {client.staging_copies - before}{extra}")
    if mode in ("gloo", "hook"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
