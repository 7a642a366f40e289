"""A trainer whose step fails: trains a tiny model until a step raises (the test SIGKILLs a rank,
or stops the daemon), then prints "raised CLASS: MESSAGE" and "raised at T in PHASE after N
steps" (T: time.time(); PHASE: where the step was) and lets the exception go uncaught, as a
trainer would: the process must still exit.
  hook        torch DDP with gradsync.torch.allreduce_hook (several buckets)
  gradbuffer  gradsync.torch.GradBuffer (several buckets)
Prints "training" once the first step is done. $JOB_TIMEOUT: the job's timeout in seconds;
$TEST_PORT: the gloo rendezvous port (hook).
usage: killed_rank.py MODE"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync
import gradsync.torch


class SlowBackward(torch.autograd.Function):
    """The identity, whose backward takes 60 ms: between the last layer's gradients (their
    bucket already submitted) and the earlier layers', so that a kill often lands while the
    survivor is inside backward with gradient hooks still to run (the daemon takes some 10-20
    ms to see a rank die), and as often while it waits for the reduction."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.06)
        return grad


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.c(SlowBackward.apply(torch.tanh(self.b(torch.tanh(self.a(x))))))


def main():
    mode = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(7)
    net = Net()
    client = gradsync.connect(timeout=float(os.environ["JOB_TIMEOUT"]))
    if mode == "hook":
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                                world_size=world)
        net = DDP(net, bucket_cap_mb=0.002)  # about 2 KB: several buckets, reduced while backward runs
        net.register_comm_hook(client, gradsync.torch.allreduce_hook)
    else:
        buffer = gradsync.torch.GradBuffer(net.parameters(), client, bucket_bytes=2048)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    deadline = time.monotonic() + 60
    step = 0
    phase = "start"
    try:
        while time.monotonic() < deadline:
            phase = "zero_grad"
            if mode == "gradbuffer":
                buffer.zero_grad()
            else:
                optimizer.zero_grad(set_to_none=False)
            phase = "forward"
            loss = torch.nn.functional.mse_loss(net(x), y)
            phase = "backward"
            loss.backward()
            phase = "wait"
            if mode == "gradbuffer":
                buffer.wait()
            phase = "step"
            optimizer.step()
            if step == 0:
                print("training", flush=True)
            step += 1
    except BaseException as e:
        print(f"raised {type(e).__name__}: {e}\nraised at {time.time():.3f} in {phase} after {step} steps", flush=True)
        raise
    print(f"no error in {step} steps", flush=True)


if __name__ == "__main__":
    main()
