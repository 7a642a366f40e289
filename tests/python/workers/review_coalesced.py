import os, sys, traceback
import torch, torch.distributed as dist
import gradsync, gradsync.torch

def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world)
    gloo = dist.new_group(backend="gloo")
    def report(name, ok, extra=""):
        print(f"rank {rank}: {name}: {'OK' if ok else 'FAIL'} {extra}", flush=True)
    def trial(name, fn):
        try:
            fn()
        except Exception as e:
            print(f"rank {rank}: {name}: EXC {type(e).__name__}: {str(e)[:300]}", flush=True)
    g = torch.Generator().manual_seed(rank)
    # 1. reduce_scatter_tensor_coalesced, AVG, non-contiguous input, world 3, mixed sizes + empty
    def rs_avg():
        ins = [torch.randn(world * 4, 3, generator=g).t(),  # non-contiguous, 3 x 4W -> numel 12W
               torch.randn(world * 5, generator=g), torch.empty(0), torch.randn(world, 2, generator=g)]
        outs = [torch.full((i.numel() // world,), -7.0) for i in ins]
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.AVG)
        for k, (o, i) in enumerate(zip(outs, ins)):
            ref = torch.empty_like(o)
            if i.numel():
                dist.reduce_scatter_tensor(ref, i.reshape(-1).contiguous(), op=dist.ReduceOp.SUM, group=gloo)
                ref /= world
            report(f"rs coalesced avg [{k}]", torch.allclose(o, ref, atol=1e-6), f"{o[:4].tolist()} vs {ref[:4].tolist()}")
    trial("rs_avg", rs_avg)
    # 2. reduce_scatter_tensor_coalesced with output aliasing input (in-place, FSDP-like)
    def rs_alias():
        bufs = [torch.randn(world * 6, generator=g), torch.randn(world * 2, generator=g)]
        refs_in = [b.clone() for b in bufs]
        outs = [b.chunk(world)[rank] for b in bufs]
        with dist._coalescing_manager():
            for o, i in zip(outs, bufs):
                dist.reduce_scatter_tensor(o, i)
        for k, (o, i) in enumerate(zip(outs, refs_in)):
            ref = torch.empty_like(o)
            dist.reduce_scatter_tensor(ref, i, group=gloo)
            report(f"rs coalesced aliasing [{k}]", torch.allclose(o, ref, atol=1e-6))
    trial("rs_alias", rs_alias)
    # 3. allgather_into_tensor_coalesced: mixed dtypes, bool, input is a view of output, non-contiguous input
    def ag_mixed():
        outs = [torch.empty(world * 4), torch.empty(world * 3, dtype=torch.bfloat16), torch.empty(world * 5, dtype=torch.bool),
                torch.empty(world * 2, 3), torch.zeros(world * 2, dtype=torch.int64)]
        ins = [outs[0].chunk(world)[rank].copy_(torch.arange(4.) + 10 * rank),  # aliasing view
               (torch.arange(3.) + rank).to(torch.bfloat16), torch.tensor([rank % 2 == 0, True, False, rank == 1, True]),
               torch.randn(3, 2, generator=g).t(), torch.empty(0, dtype=torch.int64)]
        ins[4] = torch.tensor([rank, -rank])
        saved = [i.clone() for i in ins]
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        for k, (o, i) in enumerate(zip(outs, saved)):
            parts = [torch.empty_like(i) for _ in range(world)]
            src = i if i.dtype != torch.bool else i.to(torch.uint8)
            parts = [torch.empty_like(src) for _ in range(world)]
            dist.all_gather(parts, src.contiguous(), group=gloo)
            ref = torch.cat([p.reshape(-1) for p in parts]).to(i.dtype).reshape(o.shape)
            report(f"ag coalesced [{k}] {i.dtype}", torch.equal(o, ref), f"{o.flatten()[:6].tolist()} vs {ref.flatten()[:6].tolist()}")
    trial("ag_mixed", ag_mixed)
    # 4. allreduce coalesced via manager with AVG on ints? and mixed dtypes
    def ar_mixed():
        ts = [torch.full((3,), float(rank)), torch.full((2,), rank, dtype=torch.float64)]
        with dist._coalescing_manager():
            for t in ts:
                dist.all_reduce(t)
        report("ar coalesced mixed dtypes", all(torch.equal(t, torch.full_like(t, sum(range(world)))) for t in ts), str([t.tolist() for t in ts]))
    trial("ar_mixed", ar_mixed)
    # 5. functional collectives coalesced
    def funcol():
        import torch.distributed._functional_collectives as fc
        a = [torch.full((2,), float(rank)), torch.full((3,), float(rank) + 1)]
        out = fc.all_gather_into_tensor_coalesced(a, dist.group.WORLD)
        out = [o.wait() if hasattr(o, "wait") else o for o in out]
        report("funcol all_gather_into_tensor_coalesced", True, str([o.tolist() for o in out]))
    trial("funcol_ag_coalesced", funcol)
    def funcol_rs():
        import torch.distributed._functional_collectives as fc
        a = [torch.arange(world * 2.) + rank, torch.arange(world * 1.)]
        out = fc.reduce_scatter_tensor_coalesced(a, "sum", [0, 0], dist.group.WORLD)
        out = [o.wait() if hasattr(o, "wait") else o for o in out]
        report("funcol reduce_scatter_tensor_coalesced", True, str([torch.as_tensor(o).tolist() for o in out]))
    trial("funcol_rs_coalesced", funcol_rs)
    def funcol_ar():
        import torch.distributed._functional_collectives as fc
        a = [torch.full((2,), float(rank)), torch.full((3,), 1.0)]
        out = fc.all_reduce_coalesced(a, "sum", dist.group.WORLD)
        out = [o.wait() if hasattr(o, "wait") else o for o in out]
        report("funcol all_reduce_coalesced", True, str([torch.as_tensor(o).tolist() for o in out]))
    trial("funcol_ar_coalesced", funcol_ar)
    def funcol_rs_avg():
        import torch.distributed._functional_collectives as fc
        o = fc.reduce_scatter_tensor(torch.arange(world * 2.) + rank, "avg", 0, dist.group.WORLD)
        report("funcol reduce_scatter avg", True, str(torch.as_tensor(o).tolist()))
    trial("funcol_rs_avg", funcol_rs_avg)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)

main()
