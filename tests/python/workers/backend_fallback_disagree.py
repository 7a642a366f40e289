"""Rank 0 asks for the gloo fallback, rank 1 does not: rank 0 fails at init within the job's
timeout (5 s here), naming rank 1 and the option, instead of waiting in gloo's connect."""
import datetime
import os
import time

import torch.distributed as dist

import gradsync.torch

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
started = time.monotonic()
try:
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=5),
                            pg_options=gradsync.torch.Options(fallback="gloo") if rank == 0 else None)
    print(f"rank {rank}: init done", flush=True)
except Exception as e:  # noqa: BLE001 (what is printed is checked)
    print(f"rank {rank}: init failed after {time.monotonic() - started:.1f} s: {type(e).__name__}: {e}", flush=True)
