"""Rank side of tests/python/bench_backend.py: the torch.distributed backend's cost beside the
gloo backend and the gradsync client's own calls, in the same processes and run. Rank 0 prints
one line of medians (us for the small operations, ms for the large)."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import gradsync.torch  # noqa: F401 (registers the backend)


def median_us(call, repeats):
    for _ in range(min(20, repeats)):
        call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    small, large = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    gloo = dist.new_group(backend="gloo")
    client = dist.distributed_c10d._get_default_group()._client
    tiny = torch.ones(1024)  # 4 KiB
    big = torch.ones(25 << 20)  # 100 MiB
    # max, not sum: the values stay ones however many times they are reduced in place.
    top = dist.ReduceOp.MAX
    rows = {
        "backend_4k_us": median_us(lambda: dist.all_reduce(tiny, op=top), small),
        "gloo_4k_us": median_us(lambda: dist.all_reduce(tiny, op=top, group=gloo), small),
        "client_4k_us": median_us(lambda: client.allreduce_coalesced([tiny], op="max").wait(), small),
        "backend_100m_ms": median_us(lambda: dist.all_reduce(big, op=top), large) / 1000,
        "gloo_100m_ms": median_us(lambda: dist.all_reduce(big, op=top, group=gloo), large) / 1000,
        "client_100m_ms": median_us(lambda: client.allreduce_coalesced([big], op="max").wait(), large) / 1000,
    }
    if rank == 0:
        print("bench_backend: " + " ".join(f"{k}={v:.1f}" if k.endswith("us") else f"{k}={v:.2f}"
                                            for k, v in rows.items()))
    dist.barrier()


if __name__ == "__main__":
    main()
