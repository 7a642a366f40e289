"""The torch.distributed backend's async Works and its failures, one scenario per run (argv[1]):

  async         rank 1 arrives 1 s late: rank 0's async_op all_reduce (of a layout used
                before) returns at once (three at once too), not
                completed; wait(timeout) raises a timeout and the operation goes on; wait()
                then gives the sum, and so does get_future()
  timeout       init_process_group(timeout=3 s); rank 1 never calls a second all_reduce: rank
                0's fails within that bound with gradsync's error, raised as torch's type
  layout        ranks all_reduce tensors of different lengths: both fail with gradsync's
                LayoutMismatchError, raised as torch's type
  killed-peer   rank 1 dies after a first all_reduce: rank 0's next one fails, naming rank 1
  dead-daemon   the daemon is killed (SIGKILL, $GRADSYNCD_PID) after a first all_reduce: every
                rank's next one fails, as torch's type
  never-arrives run alone as rank 0 of 2: init_process_group, or the first all_reduce, fails
                after its 3 s timeout as torch's type
  release       400 all_reduces (and 134 all_gathers) of ever-new sizes: unused staging sets
                are released and their memory reused, the results right
  growing       all_reduces of ever-growing sizes: pooled staging areas no later set took are
                freed (the client holds what its recent calls use, not the sum)
  callback-waits  a future's callback starts a collective and waits for it (PowerSGD's way):
                no deadlock, both results right
  callback-waits-later  a future's callback waits for a later future of the group: no
                deadlock, the chained value right, later futures still complete
  ddp-overlap   DDP with no hook and several buckets: the buckets' all_reduces overlap
  powersgd      DDP with torch's PowerSGD hook (collectives started in future callbacks) and
                6 buckets, rank 1 late to every bucket, under inline_futures(): 6 steps, every
                rank's parameters the same after each (with argv[2] "unordered", without
                inline_futures(): what happened is printed; the job fails)
  comm-thread   a communication thread waits for the async Works the training thread starts,
                1 s later on rank 1: the next collective of the layout still picks the same
                staging set on every rank (only waits on the starting thread count)
  is-completed  is_completed() polled while the waiter thread copies a large result back:
                once it says True, the result is in the tensor, every time
  byte-dtypes   bool, int8 and int16 tensors broadcast and all-gathered (as their bytes), empty
                tensors in every collective, and DDP of a model with a bool buffer (which it
                broadcasts at construction)
  long-timeout  init_process_group(timeout=1 hour): a warning, and operations bounded by the
                daemon's maximum (600 s) instead of a refusal; a new_group with torch's default
                timeout gets that maximum too, without a warning
  abort         rank 0's group is aborted from another thread while its async all_reduce waits
                for rank 1 (2 s late): wait() raises gradsync's AbortedError as torch's type
                within 1 s of the abort; rank 1's all_reduce then fails naming rank 0
  abort-fallback  as abort, with the gloo fallback: rank 0's barrier, which waits for the
                fallback's barrier too (rank 1 is 3 s late), raises AbortedError within 1.5 s
                of the abort, and abort() itself returns at once (it takes no lock and drops
                no gloo group)
  exit-pending  the main thread ends with two futures pending (rank 1 never comes): the one not
                yet begun fails ("the interpreter exited") and its callback runs
  ddp-stalled-peer  DDP; rank 1 stalls past the 3 s timeout: rank 0's backward raises
                gradsync's TimeoutError, as torch's type, through the futures
  ddp-killed-peer  DDP with no hook; rank 1 dies after 3 steps: rank 0's backward raises
                gradsync's error, as torch's type, within the job's timeout

torch's type: RuntimeError on torch 1.13, torch.distributed.DistBackendError on 2.x.
"""
import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync
import gradsync.torch  # noqa: F401 (registers the backend)
from ops import exit_on_failures

TORCH_ERROR = getattr(dist, "DistBackendError", RuntimeError)
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def expect_failure(what, call, gradsync_type, within, text=None, torch_type=True):
    """`call` must raise an error that is both gradsync_type and torch's own type, within
    `within` seconds, its message holding `text`."""
    start = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 (checked below)
        took = time.monotonic() - start
        print(f"{what}: {type(e).__name__} after {took:.2f} s: {e}", flush=True)
        check(isinstance(e, gradsync_type), f"{what}: raised {type(e).__mro__}, not a {gradsync_type.__name__}")
        check(not torch_type or isinstance(e, TORCH_ERROR),
              f"{what}: raised {type(e).__mro__}, not torch's {TORCH_ERROR.__name__}")
        check(not isinstance(e, NotImplementedError), f"{what}: raised NotImplementedError: {e}")
        check(took <= within, f"{what}: took {took:.2f} s, more than {within} s")
        check(text is None or text in str(e), f"{what}: the message does not say {text!r}: {e}")
        return
    failures.append(f"{what}: nothing was raised")


def async_works(rank, world):
    t = torch.full((4,), float(rank + 1))
    # The first call of a layout registers its staging set, which every local rank must reach
    # (registration is a barrier): warm it up first.
    dist.all_reduce(torch.zeros(4))
    if rank == 1:
        time.sleep(1.0)
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    returned = time.monotonic() - start
    future = work.get_future()  # before wait(timeout): the waiter thread waits too
    if rank == 0:
        check(returned < 0.5, f"async_op all_reduce took {returned:.2f} s to return")
        check(not work.is_completed(), "the Work was completed before rank 1 arrived")
        start = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=200))
            failures.append("wait(200 ms) returned before rank 1 arrived")
        except Exception as e:  # noqa: BLE001
            took = time.monotonic() - start
            check(took < 0.6, f"wait(200 ms) took {took:.2f} s (after get_future())")
            check(isinstance(e, TimeoutError), f"wait(200 ms) raised {type(e).__mro__}, not a TimeoutError")
            check(isinstance(e, TORCH_ERROR), f"wait(200 ms) raised {type(e).__mro__}, not torch's type")
    check(work.wait(), "wait() did not return True")
    check(work.is_completed() and work.is_success(), "the Work is not completed and successful after wait()")
    want = torch.full((4,), float(sum(range(1, world + 1))))
    check(torch.equal(t, want), f"the async all_reduce gave {t.tolist()}, not {want.tolist()}")
    check(torch.equal(future.wait()[0], want), "the Work's future does not hold the result")
    check(work.get_future() is future, "get_future() gave another future on its second call")
    # Several of one layout in flight at once (each on a staging set of its own), returned at
    # once while rank 1 is late, waited in reverse order: each its own result.
    for x in [torch.zeros(3) for _ in range(4)]:  # registers the layout's staging sets
        dist.all_reduce(x, async_op=True)
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)
    tensors = [torch.full((3,), float(rank + i)) for i in range(8)]
    start = time.monotonic()
    works = [dist.all_reduce(x, async_op=True) for x in tensors[:3]]
    returned = time.monotonic() - start
    if rank == 0:
        check(returned < 0.5, f"3 async all_reduces of one layout took {returned:.2f} s to return")
    works += [dist.all_reduce(x, async_op=True) for x in tensors[3:]]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(tensors):
        want = float(sum(r + i for r in range(world)))
        check(torch.equal(x, torch.full((3,), want)), f"in-flight all_reduce {i} gave {x.tolist()}, not {want}")
    # A barrier finishes the collectives started before it: their results are in place after it.
    x = torch.full((5,), float(rank))
    dist.all_reduce(x, async_op=True)  # never waited
    dist.barrier()
    check(torch.equal(x, torch.full((5,), float(sum(range(world))))), f"after a barrier, x is {x.tolist()}")
    # The outputs of a completed Work stay reachable through it while it is recent.
    w = dist.all_reduce(torch.ones(2), async_op=True)
    w.wait()
    check(torch.equal(w.get_future().value()[0], torch.full((2,), float(world))), "a late get_future() lost the result")
    check(torch.equal(w.result()[0], torch.full((2,), float(world))), "result() lost the result")


def releases(rank, world):
    """Ever-new layouts (all_gather_object's way): staging sets unused for release_after
    collectives are released, their memory reused, and every result stays right."""
    pg = dist.distributed_c10d._get_default_group()
    pg.release_after = 100
    client = gradsync.torch.client_of()
    for i in range(400):
        n = 1 + (i * 37) % 200
        t = torch.full((n,), float(rank + i))
        dist.all_reduce(t)
        want = float(sum(r + i for r in range(world)))
        if not torch.equal(t, torch.full((n,), want)):
            failures.append(f"all_reduce {i} of {n} elements gave {t[:3].tolist()}..., not {want}")
        if i % 3 == 0:  # allgathers too: their outputs (the client library's) are reused
            out = [torch.empty(n) for _ in range(world)]
            dist.all_gather(out, torch.full((n,), float(rank * 1000 + i)))
            for r in range(world):
                if not torch.equal(out[r], torch.full((n,), float(r * 1000 + i))):
                    failures.append(f"all_gather {i} of {n} elements: rank {r}'s part is {out[r][:3].tolist()}...")
    sets, allocations = len(client._sets), len(client._allocations)
    print(f"release: {sets} sets registered, {allocations} staging allocations after 534 collectives", flush=True)
    check(sets <= 100 + 64 + 4, f"{sets} sets still registered: unused ones were not released")
    check(allocations < 300, f"{allocations} staging allocations: released sets' memory was not reused")


def growing(rank, world):
    """all_reduces of ever-growing sizes (4 KiB to 1 MiB, 256 calls, 128 MiB in all): staging
    areas that no later set took are freed, so the client holds about what its recent calls
    use, not the sum of every size it made."""
    pg = dist.distributed_c10d._get_default_group()
    pg.release_after = 20
    client = gradsync.torch.client_of()
    sizes = [1024 * i for i in range(1, 257)]  # floats
    for i, n in enumerate(sizes):
        t = torch.full((n,), float(rank + i))
        dist.all_reduce(t)
        want = float(sum(r + i for r in range(world)))
        if t[0].item() != want or t[-1].item() != want:
            failures.append(f"all_reduce {i} of {n} elements gave {t[0].item()}, not {want}")
    held = sum(nbytes for _, nbytes, _ in client._allocations)
    recent = 4 * sum(sizes[-128:])  # what the last 128 calls' staging sets hold
    print(f"growing: {held >> 20} MiB of client memory held, {client._freed_staging} staging areas freed; "
          f"the last 128 calls use {recent >> 20} MiB, all 256 {4 * sum(sizes) >> 20} MiB", flush=True)
    check(client._freed_staging > 0, "no staging area was freed")
    check(held <= recent, f"the client holds {held} bytes, more than the last 128 calls' staging ({recent})")


def callback_waits(rank, world):
    """A future's callback that starts a collective and waits for it (as torch's PowerSGD hook
    does): the waiter thread that runs the callback must not wait for itself."""
    a, b = torch.full((3,), float(rank)), torch.full((3,), float(rank + 10))

    def then(_):
        dist.all_reduce(b, async_op=True).get_future().wait()
        return b

    chained = dist.all_reduce(a, async_op=True).get_future().then(then)
    done = threading.Event()
    helper = threading.Thread(target=lambda: (chained.wait(), done.set()), daemon=True)
    helper.start()
    check(done.wait(20), "a callback that waits for a collective never finished")
    helper.join(20)
    check(torch.equal(a, torch.full((3,), float(sum(range(world))))), f"a is {a.tolist()}")
    check(torch.equal(b, torch.full((3,), float(sum(r + 10 for r in range(world))))), f"b is {b.tolist()}")


def callback_waits_later(rank, world):
    """A future's callback that waits for a *later* future of the group (rank 1 comes 1 s late,
    so the callback runs where the future is completed, not inline): the future that completes
    the later one must not be held up behind the callback. Then DDP-like traffic goes on."""
    a, b = torch.full((3,), float(rank)), torch.full((4,), float(rank + 10))
    # Each layout's staging set registered first (a registration waits for every local rank,
    # which would complete the first Work before its callback is added).
    dist.all_reduce(torch.zeros(3))
    dist.all_reduce(torch.zeros(4))
    if rank == 1:
        time.sleep(1.0)
    first = dist.all_reduce(a, async_op=True).get_future()
    second = dist.all_reduce(b, async_op=True).get_future()
    check(rank == 1 or not first.done(), "the first future was done before its callback was added")
    chained = first.then(lambda _: second.wait()[0] + 1)
    done = threading.Event()
    helper = threading.Thread(target=lambda: (chained.wait(), done.set()), daemon=True)
    helper.start()
    if not done.wait(20):
        failures.append("a callback that waits for a later future never finished")
        exit_on_failures(failures)  # its threads are stuck: the process must not wait for them
    check(torch.equal(chained.value(), torch.full((4,), float(sum(r + 10 for r in range(world)) + 1))),
          f"the chained value is {chained.value().tolist()}")
    check(torch.equal(a, torch.full((3,), float(sum(range(world))))), f"a is {a.tolist()}")
    for step in range(3):
        t = torch.full((2,), float(rank + step))
        check(torch.equal(dist.all_reduce(t, async_op=True).get_future().wait()[0],
                          torch.full((2,), float(sum(r + step for r in range(world))))),
              f"a future after the chain, step {step}, gave the wrong sum")


def callback_outlives_main(rank):
    """A future's callback still running when the main thread ends: the interpreter's exit waits
    for it (bounded) instead of killing the waiter thread inside torch's C++ frames, which
    aborts the process ("terminate called without an active exception")."""
    started = threading.Event()

    def slow(_):
        started.set()
        time.sleep(1.0)
        print(f"rank {rank}: the callback finished", flush=True)

    dist.all_reduce(torch.ones(3), async_op=True).get_future().then(slow)
    check(started.wait(20), "the callback never started")


def exit_pending(rank):
    """The main thread ends with two futures pending, rank 1 never coming to their all_reduces
    (it sleeps, then leaves): the waiter thread is blocked in the first, and the second, not yet
    begun, fails at exit ("the interpreter exited"), so its callback runs and says so; the
    process exits within the waiter's bounded join, not at the job's timeout."""
    dist.all_reduce(torch.zeros(3))
    dist.all_reduce(torch.zeros(4))  # both layouts' staging sets registered by both ranks
    if rank == 1:
        time.sleep(8.0)
        return
    first = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    second = dist.all_reduce(torch.ones(4), async_op=True).get_future()

    def said(future):
        try:
            future.wait()
            print("rank 0: the second future completed", flush=True)
        except Exception as e:  # noqa: BLE001 (printed for the test)
            print(f"rank 0: the second future failed: {e}", flush=True)

    second.then(said)
    check(not first.done() and not second.done(), "a future was done before rank 1 came")
    print(f"rank 0: main ends at {time.monotonic():.3f}", flush=True)


def ddp_overlaps(rank):
    """DDP without a hook and several buckets: a bucket's all_reduce starts while earlier ones are
    still in flight (rank 1 is late, so nothing completes meanwhile)."""
    pg = dist.distributed_c10d._get_default_group()
    in_flight, started = [], pg.allreduce

    def counting(tensors, opts=None):
        work = started(tensors, opts)
        in_flight.append(len(pg._tracker.in_flight()))
        return work

    pg.allreduce = counting
    # DDP's first bucket holds 1 MiB, the others bucket_cap_mb; it re-buckets after step 0.
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), bucket_cap_mb=0.25)
    for step in range(3):
        if rank == 1 and step == 2:
            time.sleep(1.0)
        in_flight.clear()
        model(torch.randn(4, 256)).sum().backward()
    if rank == 0:
        check(len(in_flight) >= 3, f"DDP made {len(in_flight)} buckets, not several")
        check(max(in_flight) >= 2, f"DDP's buckets never overlapped: in flight at each start {in_flight}")
        print(f"ddp buckets in flight at each start: {in_flight}", flush=True)
    # Each bucket's Works count as waited for at the end of the backward that asked for their
    # futures, so later steps reuse its staging set: one per bucket (or per layout slot within a
    # step), not a new one each step up to the four slots. And a barrier has sets of its own.
    client = gradsync.torch.client_of()
    pg_sets = [key for key in client._sets if key[0] == "staging" and key[7][:2] == ("pg", "allreduce")]
    # Step 0 had one bucket of its own layout (DDP re-buckets after it).
    check(len(pg_sets) <= len(in_flight) + 1,
          f"{len(pg_sets)} staging sets for DDP's {len(in_flight)} buckets after 3 steps")
    dist.barrier()
    kinds = {key[7][1] for key in client._sets if key[0] == "staging" and key[7][:1] == ("pg",)}
    check("barrier" in kinds, f"the barrier used no staging set of its own: kinds {sorted(kinds)}")


class SixLayers(torch.nn.Module):
    """Six Linear(64, 32) side by side on one input, their outputs summed."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 32) for _ in range(6))

    def forward(self, x):
        return sum(layer(x) for layer in self.layers)


def powersgd(rank, ordered=True):
    """torch's PowerSGD DDP hook starts its P and Q all_reduces inside future callbacks. Rank 1
    comes 100 ms late to every bucket's hook, so without inline_futures() its callbacks'
    collectives start before its next bucket's while rank 0's start after all of its buckets':
    the orders differ from the first PowerSGD step on."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd_hook

    if ordered:
        gradsync.torch.inline_futures()
    torch.manual_seed(0)
    # Six buckets of one layer (8,320 bytes) each: torch 1.13's DDP caps its first bucket at
    # _DEFAULT_FIRST_BUCKET_BYTES (1 MiB) whatever bucket_cap_mb says; the model is 50 KB. A
    # bucket's three all_reduces have three layouts (the bias: 32 floats; P: 32 x 2; Q: 64 x 2),
    # so collectives started in different orders differ in layout, not only in staging set.
    first_bucket, dist._DEFAULT_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES, 8_000
    try:
        model = DDP(SixLayers(), bucket_cap_mb=0.0079)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    state = powersgd_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    calls = []

    def late_on_rank_1(state, bucket):
        calls[-1] += 1
        if rank == 1:
            time.sleep(0.1)
        return powersgd_hook.powerSGD_hook(state, bucket)

    model.register_comm_hook(state, late_on_rank_1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    try:
        for step in range(6):
            calls.append(0)
            optimizer.zero_grad()
            model(torch.randn(8, 64, generator=generator)).square().sum().backward()
            optimizer.step()
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            high, low = flat.clone(), flat.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            check(torch.equal(high, low), f"step {step}: the ranks' parameters differ by up to "
                                          f"{(high - low).abs().max().item()}")
    except Exception as e:  # noqa: BLE001
        if ordered:
            raise
        print(f"rank {rank}: PowerSGD without inline_futures failed: {type(e).__name__}: {e}", flush=True)
        print(f"rank {rank}: powersgd done", flush=True)
        os._exit(0)  # the job failed: nothing of it to wait for at exit
    check(min(calls[1:]) >= 3, f"DDP called the hook {calls} times per step: too few buckets to race")
    if not ordered:
        print(f"rank {rank}: PowerSGD without inline_futures did not fail", flush=True)
    print(f"rank {rank}: PowerSGD {'with' if ordered else 'without'} inline_futures went through "
          f"{len(calls)} steps of {calls[-1]} buckets", flush=True)


def comm_thread(rank, world):
    """A Work waited on another thread than the one that started it: that wait comes before or
    after the next collective as timing has it, differently on each rank, so it must not steer
    which staging set the next collective of the layout uses."""
    import queue

    works = queue.Queue()

    def waiter():
        while True:
            w = works.get()
            if w is None:
                return
            if rank == 1:
                time.sleep(1.0)
            w.wait()

    thread = threading.Thread(target=waiter)
    thread.start()
    dist.all_reduce(torch.ones(4))  # the layout's first staging set
    x = torch.full((4,), float(rank + 1))
    works.put(dist.all_reduce(x, async_op=True))
    time.sleep(0.5)  # rank 0's thread has waited by now, rank 1's not
    z = torch.full((4,), float(rank + 10))
    try:
        dist.all_reduce(z)
    except Exception as e:  # noqa: BLE001
        failures.append(f"the all_reduce after another thread's wait failed: {e}")
    works.put(None)
    thread.join()
    want = float(sum(range(1, world + 1)))
    check(torch.equal(x, torch.full((4,), want)), f"the async all_reduce gave {x.tolist()}, not {want}")
    want = float(sum(r + 10 for r in range(world)))
    check(torch.equal(z, torch.full((4,), want)), f"the next all_reduce gave {z.tolist()}, not {want}")


def is_completed_means_in_place(rank, world):
    """torch's contract: once is_completed() is True the results are in the output tensors. The
    waiter thread (get_future()) may be copying them back at that moment."""
    n = 8 * 1024 * 1024
    want = float(sum(range(1, world + 1)))
    for step in range(6):
        big = torch.full((n,), float(rank + 1))
        work = dist.all_reduce(big, async_op=True)
        future = work.get_future()
        while not work.is_completed():
            pass
        first, last = big[0].item(), big[-1].item()
        check(first == want and last == want,
              f"step {step}: is_completed() said True with big[0]={first} big[-1]={last}, not {want}")
        future.wait()


def byte_dtypes(rank, world):
    """Dtypes the daemon does not reduce still move, as gloo moves them; empty tensors are no-ops."""
    for dtype in (torch.bool, torch.int8, torch.int16):
        x = (torch.arange(6) % (rank + 2)).to(dtype)
        dist.broadcast(x, src=1)
        want = (torch.arange(6) % 3).to(dtype)
        check(torch.equal(x, want), f"broadcast of {dtype} gave {x.tolist()}, not {want.tolist()}")
        mine = torch.full((2, 3), rank + 1).to(dtype)
        outs = [torch.zeros(2, 3, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, mine)
        for r, out in enumerate(outs):
            check(torch.equal(out, torch.full((2, 3), r + 1).to(dtype)), f"all_gather of {dtype}: rank {r}'s part {out.tolist()}")
        flat = torch.zeros(world * 3, dtype=dtype)
        dist.all_gather_into_tensor(flat, torch.full((3,), rank + 1).to(dtype)) if hasattr(dist, "all_gather_into_tensor") \
            else dist._all_gather_base(flat, torch.full((3,), rank + 1).to(dtype))
        want = torch.cat([torch.full((3,), r + 1) for r in range(world)]).to(dtype)
        check(torch.equal(flat, want), f"all_gather_into_tensor of {dtype} gave {flat.tolist()}")
    empty = torch.ones(0)
    dist.all_reduce(empty)
    dist.broadcast(empty, src=0)
    dist.reduce(empty, dst=0)
    outs = [torch.ones(0) for _ in range(world)]
    dist.all_gather(outs, empty)
    check(all(o.numel() == 0 for o in outs), "an empty all_gather made elements")

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)
            self.register_buffer("keep", torch.tensor([rank == 0, rank != 0, True]))

        def forward(self, x):
            return self.linear(x)

    model = DDP(Masked())  # broadcasts the buffers from rank 0 at construction
    check(torch.equal(model.module.keep, torch.tensor([True, False, True])),
          f"DDP's broadcast of a bool buffer left {model.module.keep.tolist()}")
    model(torch.ones(3, 4)).sum().backward()


def never_arrives():
    """Run alone, as rank 0 of 2 (WORLD_SIZE=2 LOCAL_WORLD_SIZE=2): init_process_group or the
    first collective fails after the 3 s timeout, not before, as torch's type, and nothing is
    left waiting."""
    store = os.path.join(os.environ["TEST_DIR"], "store")
    start = time.monotonic()

    def init_and_reduce():
        dist.init_process_group("gradsync", init_method="file://" + store, rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=3))
        dist.all_reduce(torch.ones(2))

    expect_failure("init_process_group and all_reduce without rank 1", init_and_reduce, RuntimeError, within=10)
    took = time.monotonic() - start
    check(took >= 2.5, f"it failed after {took:.2f} s, before the 3 s timeout: not for the missing rank")


def abort_group():
    """What a watchdog calls: torch 2.x's _abort_process_group() (every group's abort()); torch
    1.13 has none, so the default group's abort() directly."""
    if hasattr(dist.distributed_c10d, "_abort_process_group"):
        dist.distributed_c10d._abort_process_group()
    else:
        dist.distributed_c10d._get_default_group().abort()


def aborted(rank):
    dist.all_reduce(torch.zeros(4))  # the layout's staging set registered by both ranks
    if rank == 1:
        time.sleep(2.0)
        expect_failure("rank 1's all_reduce after rank 0's abort", lambda: dist.all_reduce(torch.ones(4)),
                       gradsync.Error, within=10, text="rank 0")
        return
    work = dist.all_reduce(torch.ones(4), async_op=True)
    at = []
    watchdog = threading.Thread(target=lambda: (time.sleep(0.3), at.append(time.monotonic()), abort_group()))
    watchdog.start()
    expect_failure("an all_reduce waited on while its group is aborted", work.wait, gradsync.AbortedError,
                   within=3, text="was aborted (ProcessGroup.abort) on rank 0")
    watchdog.join()
    check(at and time.monotonic() - at[0] < 1.5, "wait() returned more than 1.5 s after the abort")


def aborted_barrier(rank):
    dist.barrier()  # the barrier's staging set registered by both ranks
    if rank == 1:
        time.sleep(3.0)
        expect_failure("rank 1's barrier after rank 0's abort", dist.barrier, gradsync.Error, within=10, text="rank 0")
        return
    at, returned = [], []
    watchdog = threading.Thread(target=lambda: (time.sleep(0.3), at.append(time.monotonic()), abort_group(),
                                                returned.append(time.monotonic())))
    watchdog.start()
    expect_failure("a barrier (gradsync's and the gloo fallback's) while its group is aborted", dist.barrier,
                   gradsync.AbortedError, within=3, text="was aborted (ProcessGroup.abort) on rank 0")
    watchdog.join()
    check(at and time.monotonic() - at[0] < 1.5, "the barrier returned more than 1.5 s after the abort")
    check(returned and returned[0] - at[0] < 0.5, "abort() itself took more than 0.5 s")


def main():
    scenario = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if scenario == "never-arrives":
        never_arrives()
        print(f"rank {rank}: {scenario} done", flush=True)
        exit_on_failures(failures)
        return
    timeout = datetime.timedelta(seconds=3 if scenario in ("timeout", "ddp-killed-peer", "ddp-stalled-peer") else 20)
    if scenario == "long-timeout":
        timeout = datetime.timedelta(hours=1)
    import warnings
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        dist.init_process_group("gradsync", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                                world_size=world, timeout=timeout,
                                pg_options=gradsync.torch.Options(fallback="gloo" if scenario == "abort-fallback" else None))
    if scenario == "long-timeout":
        said = [str(w.message) for w in warned if "more than this gradsyncd allows" in str(w.message)]
        check(len(said) == 1, f"init_process_group(timeout=1 hour) warned {said}")
        check(said and "its maximum, 600 s (gradsyncd --max-timeout-ms)" in said[0], f"the warning says {said}")
        check(gradsync.torch.client_of().job_timeout == 600.0,
              f"the job's timeout is {gradsync.torch.client_of().job_timeout} s, not the daemon's maximum 600 s")
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            group = dist.new_group(ranks=list(range(world)))
        check(not [w for w in warned if "gradsyncd allows" in str(w.message)], "torch's default timeout warned")
        check(gradsync.torch.client_of(group).job_timeout == 600.0,
              f"a group of torch's default timeout has {gradsync.torch.client_of(group).job_timeout} s, not 600 s")
        x = torch.ones(3)
        dist.all_reduce(x, group=group)
        check(torch.equal(x, torch.full((3,), float(world))), f"the group's all_reduce gave {x.tolist()}")
    if scenario == "async":
        async_works(rank, world)
    elif scenario == "timeout":
        dist.all_reduce(torch.ones(4))  # registers the set: what follows times out in the operation
        if rank == 0:
            expect_failure("an all_reduce rank 1 never joins", lambda: dist.all_reduce(torch.ones(4)),
                           gradsync.TimeoutError, within=8, text="rank")
        else:
            time.sleep(6)  # past rank 0's failure; the job has failed by now
            expect_failure("rank 1's late all_reduce", lambda: dist.all_reduce(torch.ones(4)), gradsync.Error,
                           within=8)
    elif scenario == "layout":
        expect_failure("all_reduce of different lengths", lambda: dist.all_reduce(torch.ones(3 + rank)),
                       gradsync.LayoutMismatchError, within=5)
    elif scenario == "killed-peer":
        dist.all_reduce(torch.ones(4))
        if rank == 1:
            os._exit(0)
        expect_failure("an all_reduce after rank 1 died", lambda: dist.all_reduce(torch.ones(4)), gradsync.Error,
                       within=25, text="rank 1")
    elif scenario == "dead-daemon":
        dist.all_reduce(torch.ones(4))
        dist.barrier()
        if rank == 0:
            os.kill(int(os.environ["GRADSYNCD_PID"]), signal.SIGKILL)
        time.sleep(0.5)
        expect_failure("an all_reduce after the daemon died", lambda: dist.all_reduce(torch.ones(4)),
                       gradsync.Error, within=25)
    elif scenario == "abort":
        aborted(rank)
    elif scenario == "abort-fallback":
        aborted_barrier(rank)
    elif scenario == "release":
        releases(rank, world)
    elif scenario == "comm-thread":
        comm_thread(rank, world)
    elif scenario == "is-completed":
        is_completed_means_in_place(rank, world)
    elif scenario == "callback-waits":
        callback_waits(rank, world)
    elif scenario == "growing":
        growing(rank, world)
    elif scenario == "callback-waits-later":
        callback_waits_later(rank, world)
    elif scenario == "exit-pending":
        exit_pending(rank)
    elif scenario == "callback-outlives-main":
        callback_outlives_main(rank)
    elif scenario == "ddp-overlap":
        ddp_overlaps(rank)
    elif scenario == "powersgd":
        powersgd(rank, ordered=sys.argv[2:3] != ["unordered"])
    elif scenario == "ddp-stalled-peer":
        # Rank 1 stalls past the job's timeout before a backward: rank 0's buckets were all
        # submitted, so their failure reaches backward() through the futures, raised at its end.
        model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), bucket_cap_mb=0.25)

        def steps():
            # By step 6 every bucket's staging sets are registered (4 slots per layout: Slots),
            # so nothing waits for rank 1 in a registration.
            for step in range(8):
                if step == 6 and rank == 1:
                    time.sleep(6)
                model(torch.randn(4, 256)).sum().backward()

        if rank == 0:
            expect_failure("DDP's backward while rank 1 stalls", steps, gradsync.TimeoutError, within=10)
        else:
            try:
                steps()
            except Exception:  # noqa: BLE001 (the job failed while it slept)
                pass
    elif scenario == "ddp-killed-peer":
        model = DDP(torch.nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def steps():
            for step in range(10):
                if step == 3 and rank == 1:
                    os._exit(0)
                optimizer.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()

        if rank == 0:
            expect_failure("DDP's backward after rank 1 died", steps, gradsync.Error, within=10)
    elif scenario == "long-timeout":
        pass  # checked right after init_process_group
    elif scenario == "byte-dtypes":
        byte_dtypes(rank, world)
    else:
        failures.append(f"unknown scenario {scenario}")
    print(f"rank {rank}: {scenario} done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
