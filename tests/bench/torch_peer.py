"""The benchmark's peer: torch.distributed all-reduce over Gloo between WORLD local processes.

    python3 torch_peer.py WORLD BYTES STEPS

Each rank all-reduces a float32 tensor of BYTES bytes (sum, then divides by WORLD, as gradsync's
average does) STEPS times after 2 warm-up steps; rank 0 prints "sample <ms>" per step. Large
tensors line the ranks up with a barrier before each timed step, as the gradsync trainers do;
small ones run back to back, as gradsync's latency trainers do.
"""
import ctypes
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, numel, steps, port, parent):
    # A rank ends with the parent that spawned it (killed by the bench's timeout or its
    # supervisor) instead of running on alone. 1 is PR_SET_PDEATHSIG; a parent that died
    # before this line ran is caught by the check after it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = torch.ones(numel, dtype=torch.float32)
    barrier = numel * 4 >= (1 << 20)
    warmup = 2 if barrier else 200
    for step in range(warmup + steps):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(data)
        data.div_(world)
        elapsed = (time.perf_counter() - start) * 1e3
        if rank == 0 and step >= warmup:
            print(f"sample {elapsed:.4f}", flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: torch_peer.py WORLD BYTES STEPS")
    world, nbytes, steps = (int(a) for a in sys.argv[1:])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, nbytes // 4, steps, port, os.getpid()), nprocs=world, join=True)


if __name__ == "__main__":
    main()
