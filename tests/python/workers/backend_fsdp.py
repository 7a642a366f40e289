"""FSDP over init_process_group("gradsync") on the CPU, against DDP on a gloo group of the same
ranks: 50 steps of the same model and data, parameters within 1e-6 relative; then FSDP2
(fully_shard) where torch has it. FSDP averages a
gradient as g0/2 + g1/2 and DDP as (g0 + g1)/2, which at 2 ranks round alike (halving is
exact), so the two trainings should stay together.

Prints "fsdp: not on this torch: WHY" and exits 0 where torch cannot import FSDP or run it on the
CPU (Debian's torch 1.13 under Python 3.11 cannot import torch.distributed.fsdp at all); the
test then skips. The device check runs it under the GPU machine's torch.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync.torch  # noqa: F401 (registers the backend)
from backend import Model, side_by_side  # the same model and steps as the backend's DDP check
from ops import exit_on_failures

failures = []


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except Exception as e:  # noqa: BLE001 (whatever stops the import)
        print(f"fsdp: not on this torch: importing torch.distributed.fsdp failed: {type(e).__name__}: {e}")
        return
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(5)
    reference, ours = Model(), Model()
    ours.load_state_dict(reference.state_dict())
    try:
        sharded = FSDP(ours, device_id=torch.device("cpu"), use_orig_params=True)
    except Exception as e:  # noqa: BLE001 (an FSDP that wants a GPU)
        print(f"fsdp: not on this torch: FSDP on the CPU failed: {type(e).__name__}: {e}")
        return
    side_by_side([DDP(reference, process_group=gloo), sharded], rank, 50)
    with FSDP.summon_full_params(sharded):
        for name, value in reference.state_dict().items():
            try:
                torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-6, atol=1e-7)
            except AssertionError as e:
                failures.append(f"after 50 steps, FSDP's {name} differs from DDP on gloo: {str(e).splitlines()[0]}")
    print(f"rank {rank}: fsdp checks done on torch {torch.__version__}", flush=True)
    fully_sharded(rank, world, gloo)
    exit_on_failures(failures)


def fully_sharded(rank, world, gloo):
    """torch 2.x's FSDP2 (fully_shard over a 1-D DeviceMesh of the gradsync group), each Linear
    a unit of its own: its all_gather_into_tensor and reduce_scatter_tensor go through the
    daemon; after 50 steps its parameters (gathered by DTensor's full_tensor) match DDP's."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        print(f"fsdp2: not on this torch ({e})", flush=True)
        return
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(6)
    reference, ours = Model(), Model()
    ours.load_state_dict(reference.state_dict())
    for layer in ours.net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(ours, mesh=mesh)
    side_by_side([DDP(reference, process_group=gloo), ours], rank, 50)
    mine = {name: value.full_tensor() for name, value in ours.state_dict().items()}
    for name, value in reference.state_dict().items():
        try:
            torch.testing.assert_close(mine[name], value, rtol=1e-6, atol=1e-7)
        except AssertionError as e:
            failures.append(f"after 50 steps, FSDP2's {name} differs from DDP on gloo: {str(e).splitlines()[0]}")
    print(f"rank {rank}: fsdp2 checks done on torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
