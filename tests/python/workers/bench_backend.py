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


def paired_us(first, second, repeats):
    """Medians of `first` and `second` timed alternately, call by call (so drift and noise fall
    on both alike), and the median of their per-pair ratios."""
    for _ in range(min(20, repeats)):
        first()
        second()
    a, b, ratios = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        end = time.perf_counter()
        a.append((middle - start) * 1e6)
        b.append((end - middle) * 1e6)
        ratios.append(a[-1] / b[-1])
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


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
    backend_4k, client_4k, ratio_4k = paired_us(lambda: dist.all_reduce(tiny, op=top),
                                                lambda: client.allreduce_coalesced([tiny], op="max").wait(), small)
    backend_big, client_big, ratio_big = paired_us(lambda: dist.all_reduce(big, op=top),
                                                   lambda: client.allreduce_coalesced([big], op="max").wait(), large)
    rows = {
        "backend_4k_us": backend_4k,
        "gloo_4k_us": median_us(lambda: dist.all_reduce(tiny, op=top, group=gloo), small),
        "client_4k_us": client_4k,
        "ratio_4k": ratio_4k,
        "backend_100m_ms": backend_big / 1000,
        "gloo_100m_ms": median_us(lambda: dist.all_reduce(big, op=top, group=gloo), large) / 1000,
        "client_100m_ms": client_big / 1000,
        "ratio_100m": ratio_big,
    }
    if rank == 0:
        print("bench_backend: " + " ".join(f"{k}={v:.1f}" if k.endswith("us") else f"{k}={v:.3f}"
                                            for k, v in rows.items()))
    dist.barrier()


if __name__ == "__main__":
    main()
