import os, sys, time, datetime
import torch, torch.distributed as dist
import gradsync, gradsync.torch

def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    which = sys.argv[1]
    dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                            world_size=world, pg_options=gradsync.torch.Options(fallback="gloo"),
                            timeout=datetime.timedelta(seconds=float(os.environ.get("REVIEW_TIMEOUT", "60"))))
    def out(*a):
        print(f"rank {rank}:", *a, flush=True)
    def trial(name, fn):
        try:
            fn()
        except Exception as e:
            out(f"{name}: EXC {type(e).__name__}: {str(e)[:400]}")
    if which == "objects":
        def go():
            objs = [None]
            dist.scatter_object_list(objs, [{"to": d} for d in range(world)] if rank == 0 else None, src=0)
            out("scatter_object_list", objs)
        trial("scatter_object_list", go)
        def go():
            g = [None] * world if rank == 0 else None
            dist.gather_object({"from": rank}, g, dst=0)
            out("gather_object", g)
        trial("gather_object", go)
        def go():
            if rank == 0:
                dist.send_object_list([{"hello": 1}], dst=1)
            elif rank == 1:
                l = [None]; dist.recv_object_list(l, src=0); out("recv_object_list", l)
        trial("send/recv_object_list", go)
        def go():
            sub = dist.new_group([0, 2])
            if rank in (0, 2):
                t = torch.full((2,), float(rank))
                if rank == 0:
                    dist.send(t, dst=2, group=sub)
                else:
                    dist.recv(t, src=0, group=sub); out("subgroup recv from global 0:", t.tolist())
                r = torch.empty(2)
                dist.all_to_all_single(r, torch.full((2,), float(rank)), group=sub); out("subgroup a2a", r.tolist())
        trial("subgroup [0,2]", go)
    elif which == "many":
        def nthreads():
            return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))
        out("before", nthreads())
        t0 = time.monotonic()
        groups = [dist.new_group(list(range(world))) for _ in range(int(os.environ.get("NGROUPS", "20")))]
        out(f"after {len(groups)} new_group: threads, fds =", nthreads(), f"{time.monotonic() - t0:.2f}s")
        for g in groups:
            dist.destroy_process_group(g)
        del groups
        import gc; gc.collect()
        out("after destroy:", nthreads())
    elif which == "recreate":
        for i in range(3):
            def go():
                g = dist.new_group([0, 1], use_local_synchronization=True)
                if rank in (0, 1):
                    r = torch.empty(2)
                    dist.all_to_all_single(r, torch.full((2,), float(rank + 10 * i)), group=g)
                    out(f"recreate {i}: a2a", r.tolist())
                    t = torch.ones(1); dist.all_reduce(t, group=g); out(f"recreate {i}: allreduce", t.tolist())
                    dist.destroy_process_group(g)
            trial(f"recreate {i}", go)
    elif which == "pending_destroy":
        t = torch.zeros(2)
        if rank == 0:
            w = dist.irecv(t, src=1)
            out("irecv posted; destroying")
            t0 = time.monotonic()
            dist.destroy_process_group()
            out(f"destroyed in {time.monotonic()-t0:.2f}s")
            try:
                w.wait(); out("wait returned", t.tolist())
            except Exception as e:
                out("wait raised", type(e).__name__, str(e)[:200])
        else:
            time.sleep(3)
            dist.destroy_process_group()
        out("end")
        return
    elif which == "pending_scatter":
        got = torch.zeros(2)
        if rank == 0:
            w = dist.scatter(got, [torch.ones(2)] * world, src=0, async_op=True)
            out("scatter started; destroying")
            t0 = time.monotonic()
            dist.destroy_process_group()
            out(f"destroyed in {time.monotonic()-t0:.2f}s")
        else:
            time.sleep(5)
            out("peer exits without scatter")
            os._exit(0)
        out("end")
        return
    elif which == "gloo_fail":
        pass
    dist.barrier()
    dist.destroy_process_group()
    out("done")

main()
