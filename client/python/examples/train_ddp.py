"""Data-parallel training with gradsync, under torchrun, against the node's running gradsyncd.

    torchrun --standalone --nproc-per-node 2 client/python/examples/train_ddp.py [--grad-buffer] [--steps 100]

(PyTorch before 2.0 spells it --nproc_per_node.)

By default the model is wrapped in DDP (on a gloo process group, which DDP needs for its own
bookkeeping) and its gradient averaging goes through gradsync's comm hook. With --grad-buffer
there is no DDP at all: gradsync.torch.GradBuffer puts every gradient in memory gradsyncd
reduces in place, and buckets reduce while backward still runs. gradsync.connect() takes the
job, ranks and rendezvous from torchrun's environment, and the socket from $GRADSYNC_SOCKET
(default /run/gradsync/gradsync.sock). Add --cuda to train on each rank's GPU (LOCAL_RANK).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync
import gradsync.torch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--grad-buffer", action="store_true", help="GradBuffer instead of DDP with the comm hook")
    parser.add_argument("--cuda", action="store_true", help="train on GPU LOCAL_RANK")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    client = gradsync.connect()  # torchrun's RANK, WORLD_SIZE, LOCAL_RANK, ... and $GRADSYNC_SOCKET
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)

    if args.grad_buffer:
        gradsync.torch.sync_params(model, client)  # every rank starts from rank 0's parameters
        buffer = gradsync.torch.GradBuffer(model.parameters(), client)
        net = model
    else:
        dist.init_process_group("gloo")
        net = DDP(model)
        net.register_comm_hook(client, gradsync.torch.allreduce_hook)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(client.rank)
    copies = client.staging_copies  # sync_params staged the parameters; count the steps' copies
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(32, 256, generator=generator).to(device)
        y = torch.randint(0, 10, (32,), generator=generator).to(device)
        if args.grad_buffer:
            buffer.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        if args.grad_buffer:
            buffer.wait()  # the step's reduction is done (on CUDA: the current stream waits for it)
        optimizer.step()
        if client.rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    if args.cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if client.rank == 0:
        mode = "GradBuffer" if args.grad_buffer else "DDP + gradsync comm hook"
        print(f"{mode}: {args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.2f} ms/step), "
              f"staging copies during the steps {client.staging_copies - copies}")
    if not args.grad_buffer:
        dist.destroy_process_group()
    client.close()


if __name__ == "__main__":
    main()
