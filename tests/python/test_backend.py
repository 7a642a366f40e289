"""The torch.distributed backend "gradsync" (gradsync/torch/backend.py): init_process_group("gradsync")
as the default group, checked against a gloo group of the same ranks in the same processes
(workers/backend.py): every offered collective, DDP without a hook for 50 steps, and the refusals."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import torch

from conftest import HERE, Daemon, assert_all_ok, run_ranks
from harness import cluster_token, free_port


def test_backend_two_ranks_matches_gloo(daemon):
    results = run_ranks("backend.py", 2, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    for _, out in results:
        assert "backend checks done" in out, out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_backend_cuda_tensors_match_gloo(daemon):
    # Both ranks' tensors on GPU 0, staged through VMM buffers there, ordered on the current
    # stream; gloo's reference on the CPU (and DDP's on GPU 0).
    results = run_ranks("backend.py", 2, daemon, args=("--cuda",), env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)


def test_backend_three_ranks_matches_gloo(daemon):
    assert_all_ok(run_ranks("backend.py", 3, daemon, env={"TEST_PORT": str(free_port())}), daemon)


def _on_two_nodes(worker, done):
    """Runs `worker` as 4 ranks on two daemons ("nodes") of one cluster, two ranks on each, and
    checks every rank printed `done`; returns the two daemons' logs."""
    token_dir = tempfile.mkdtemp(prefix="gradsync-token-")
    peer_port = free_port()
    nodes = [Daemon("--peer-token-file", cluster_token(token_dir), peer_listen=f"127.0.0.1:{peer_port}")]
    nodes.append(Daemon("--peer-token-file", os.path.join(token_dir, "cluster.token")))
    try:
        job, port, processes = "py-" + uuid.uuid4().hex[:10], str(free_port()), []
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2",
                       TORCHELASTIC_RUN_ID=job, OMP_NUM_THREADS="1", GRADSYNC_SOCKET=nodes[rank // 2].socket,
                       GRADSYNC_RENDEZVOUS=f"127.0.0.1:{peer_port}", TEST_PORT=port)
            processes.append(subprocess.Popen([sys.executable, os.path.join(HERE, "workers", worker)], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = []
        for p in processes:
            try:
                out, _ = p.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0] + "\n[killed: timed out]"
            results.append((p.returncode, out))
        assert_all_ok(results, nodes[1])
        assert all(done in out for _, out in results), results
        return [node.log() for node in nodes]
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(token_dir, ignore_errors=True)


def test_backend_two_nodes_on_loopback_match_gloo():
    # The cross-node path (Gloo between the daemons) under the backend, every collective and DDP
    # against torch's gloo.
    logs = _on_two_nodes("backend.py", "backend checks done")
    assert "world size 4, node 1 of 2" in logs[1], logs[1]  # the job spanned both


def test_the_wire_dtype_option_carries_half_tensors_in_their_own_type_or_compresses_between_nodes():
    # Options(wire_dtype=None, "native", torch.bfloat16) on two nodes: all_reduce, its coalesced
    # form and reduce_scatter_tensor against the exact two-node expectation of each.
    _on_two_nodes("backend_wire.py", "wire checks done")


def test_new_group_makes_a_gradsync_job_of_its_ranks(daemon):
    # 4 ranks on one daemon: groups of 2 and of 3 ranks (one made with no backend named), each
    # a job of its own, against gloo groups of the same ranks; one destroyed and made again.
    results = run_ranks("backend_groups.py", 4, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    assert all("group checks done" in out for _, out in results), results
    # The daemon ran each group as a job named after the default group's, with its own size.
    log = daemon.log()
    assert re.search(r"job=[\w.-]+\.g[0-9a-f]{12} .*: formed \(.*world size 3,", log), log
    assert len(set(re.findall(r"job=([\w.-]+\.g[0-9a-f]{12}) .*: formed", log))) == 6, log


def test_new_group_across_two_nodes_and_a_group_not_node_by_node_is_refused():
    # Two daemons, two ranks each: groups of one node's ranks, groups of one rank per node (a
    # job across both daemons, one local rank), DDP on those; [0, 1, 2] refused by its members.
    logs = _on_two_nodes("backend_groups.py", "group checks done")
    assert re.search(r"job=[\w.-]+\.g[0-9a-f]{12} .*: formed \(.*world size 2, node 1 of 2", logs[1]), logs[1]


def test_importing_gradsync_does_not_import_torch_but_gradsync_torch_registers_the_backend():
    code = ("import sys, gradsync; assert 'torch' not in sys.modules, 'gradsync imported torch'; "
            "import gradsync.torch, torch.distributed as dist; assert dist.Backend.GRADSYNC; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_local_ranks_come_from_the_nodes_ranks_publish_in_the_store():
    # Without $LOCAL_RANK/$LOCAL_WORLD_SIZE (and for a dist.new_group group when the default
    # group is not gradsync's) each rank publishes its node, its host and its daemon's socket,
    # under keys that carry the group's global ranks; the ranks on this rank's node, in group
    # order, are its local ranks. Rank 1 of 4 shares a node with rank 0.
    code = ("import gradsync.torch.backend as b\n"
            "class Store(dict):\n"
            "    def set(self, k, v): self[k] = v.encode()\n"
            "    def get(self, k): return self[k]\n"
            "key = b._scoped('gradsync/host', [4, 5, 6, 7])\n"
            "s = Store({key + '/0': b._node_of_this_rank().encode(), key + '/2': b'host other (daemon d)', "
            "key + '/3': b'host other (daemon d)'})\n"
            "nodes = b._published_nodes(s, 1, 4, [4, 5, 6, 7])\n"
            "print('local', b._node_layout(nodes, 1, [4, 5, 6, 7], grouped=True), 'other group', "
            "b._scoped('gradsync/host', [4, 5]) != key, 'default', b._scoped('gradsync/host', []))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "local (1, 2) other group True default gradsync/host" in out.stdout, out.stdout + out.stderr


def test_ranks_not_node_by_node_are_refused_naming_the_global_ranks_by_node():
    # Ranks 0 and 2 on one node, 1 and 3 on another (not node-major), and 2 ranks on one node
    # with 1 on another (unequal): a gradsync job cannot be either; refused, naming the group's
    # global ranks by node.
    for nodes, ranks, layout in ((["a", "b", "a", "b"], [0, 1, 2, 3], "a: ranks [0, 2]; b: ranks [1, 3]"),
                                 (["a", "a", "b"], [1, 2, 5], "a: ranks [1, 2]; b: ranks [5]")):
        code = ("import gradsync.torch.backend as b\n"
                "try:\n"
                f"    b._node_layout({nodes!r}, 0, {ranks!r}, grouped=True)\n"
                "except NotImplementedError as e:\n"
                "    print('refused:', e)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert "refused: gradsync backend: this group's ranks are not laid out as a gradsync job is" in out.stdout, \
            out.stdout + out.stderr
        assert layout in out.stdout and "backend='gloo'" in out.stdout, out.stdout


def _scenario(daemon, name, world=2, extra_args=(), **env_extra):
    env = {"TEST_PORT": str(free_port()), "GRADSYNCD_PID": str(daemon.process.pid), "TEST_DIR": daemon.dir,
           **env_extra}
    results = run_ranks("backend_errors.py", world, daemon, args=(name, *extra_args), env=env, timeout=120)
    assert_all_ok(results, daemon)
    for rank, (_, out) in enumerate(results):
        if not (name.endswith("killed-peer") and rank == 1):
            assert f"{name} done" in out, out
    return results


def test_async_op_returns_at_once_and_waits_with_a_timeout(daemon):
    _scenario(daemon, "async")


def test_the_timeout_of_init_process_group_bounds_an_operation(daemon):
    _scenario(daemon, "timeout")


def test_a_timeout_past_the_daemons_maximum_is_cut_to_it_with_a_warning_and_torchs_default_gets_it(daemon):
    _scenario(daemon, "long-timeout")


def test_bool_int8_int16_tensors_move_as_bytes_empty_tensors_are_no_ops_and_ddp_takes_a_bool_buffer(daemon):
    _scenario(daemon, "byte-dtypes")


def test_a_layout_mismatch_raises_torchs_type_with_gradsyncs_text(daemon):
    _scenario(daemon, "layout")


def test_a_killed_rank_fails_the_next_operation_naming_it(daemon):
    _scenario(daemon, "killed-peer")


def test_an_aborted_group_fails_its_collective_in_flight_at_once_and_the_other_rank_names_it(daemon):
    _scenario(daemon, "abort")


def test_an_aborted_group_ends_a_barrier_waiting_for_the_gloo_fallback(daemon):
    _scenario(daemon, "abort-fallback")


def test_a_dead_daemon_fails_every_rank_as_torchs_type(daemon):
    _scenario(daemon, "dead-daemon")


def test_ddp_backward_raises_when_a_rank_dies(daemon):
    _scenario(daemon, "ddp-killed-peer")


def test_a_rank_that_never_arrives_fails_after_the_timeout(daemon):
    # One process, told it is rank 0 of 2 ranks on this node.
    _scenario(daemon, "never-arrives", world=1, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")


def test_staging_sets_of_layouts_no_longer_used_are_released(daemon):
    _scenario(daemon, "release")
    assert "released by every local rank" in daemon.log()


def test_staging_memory_of_ever_growing_sizes_goes_back_to_the_daemon(daemon):
    _scenario(daemon, "growing")


def test_a_work_waited_on_another_thread_does_not_steer_the_next_collectives_staging_set(daemon):
    _scenario(daemon, "comm-thread")


def test_is_completed_means_the_results_are_in_the_tensors(daemon):
    _scenario(daemon, "is-completed")


def test_a_future_callback_may_wait_for_a_collective(daemon):
    _scenario(daemon, "callback-waits")


def test_a_future_callback_may_wait_for_a_later_future_of_the_group(daemon):
    _scenario(daemon, "callback-waits-later")


def test_callback_threads_keep_order_and_start_another_only_when_a_callback_runs_long():
    import threading
    import time
    from gradsync.torch._pg_waiter import _Callbacks
    callbacks, order, done = _Callbacks(), [], threading.Event()

    def job(name, seconds=0.0):
        def run():
            time.sleep(seconds)
            order.append(name)
            if name == "last":
                done.set()
        return run

    # Short callbacks: one thread, in order, however many.
    for i in range(20):
        callbacks.run(job(i, 0.001))
    callbacks.run(job("last"))
    assert done.wait(10)
    assert order == list(range(20)) + ["last"]
    assert len(callbacks._threads) == 1
    # One that runs long (waiting for a later future, say): the next ones go on without it.
    order.clear()
    done.clear()
    blocked = threading.Event()
    callbacks.run(lambda: (blocked.wait(10), order.append("blocked")))
    callbacks.run(job(1))
    callbacks.run(job("last"))
    assert done.wait(5), order
    assert order == [1, "last"]
    blocked.set()
    callbacks.stop()


def test_a_barrier_waiting_for_the_fallbacks_work_keeps_the_callers_limit():
    import gradsync
    from gradsync.torch._pg_work import ForeignWork

    class Gloo:  # a gloo Work in flight, then done
        done, waits = False, 0

        def is_completed(self):
            return self.done

        def wait(self, timeout=None):
            assert timeout is None, "gloo's own wait(timeout) would fail the work at the caller's limit"
            self.waits += 1

    gloo = Gloo()
    work = ForeignWork(gloo)
    with pytest.raises(gradsync.TimeoutError, match="did not complete within 0.05 s"):
        work._complete(0.05)
    assert not work._done and gloo.waits == 0  # the caller's limit: the work goes on
    gloo.done = True
    work._complete(0.0)  # zero is no time left, not "no limit"
    assert work._done and gloo.waits == 1


def test_a_future_callback_running_at_exit_finishes_and_the_process_exits_cleanly(daemon):
    for rank, (_, out) in enumerate(_scenario(daemon, "callback-outlives-main")):
        assert f"rank {rank}: the callback finished" in out, out


def test_futures_pending_at_exit_fail_and_their_callbacks_run(daemon):
    start = time.monotonic()
    _, out = _scenario(daemon, "exit-pending")[0]
    assert "rank 0: the second future failed: gradsync backend: the interpreter exited before this collective's " \
           "future was completed" in out, out
    assert time.monotonic() - start < 25, f"took {time.monotonic() - start:.1f} s (the job's timeout is 20 s)"


def test_newer_torchs_subclass_check_accepts_the_group():
    # pytorch main refuses a ProcessGroup subclass whose body defines a method and its
    # deprecated alias (all_gather_single and _allgather_base): that check, installed here.
    code = ("import torch.distributed as dist\n"
            "pairs = [('all_gather_single', '_allgather_base'), ('reduce_scatter_single', '_reduce_scatter_base')]\n"
            "def check(cls, **kw):\n"
            "    for a, b in pairs:\n"
            "        if a in cls.__dict__ and b in cls.__dict__:\n"
            "            raise TypeError(f'{cls.__name__} overrides both {a} and its alias {b}')\n"
            "dist.ProcessGroup.__init_subclass__ = classmethod(check)\n"
            "import gradsync.torch.backend as b\n"
            "g = b.ProcessGroupGradsync\n"
            "assert g.all_gather_single is g._allgather_base and g.reduce_scatter_single is g._reduce_scatter_base\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_ddp_buckets_overlap(daemon):
    _scenario(daemon, "ddp-overlap")


def test_ddp_backward_raises_through_the_futures_when_a_rank_stalls(daemon):
    _scenario(daemon, "ddp-stalled-peer")


def test_fsdp_on_the_cpu_matches_ddp_on_gloo(daemon):
    results = run_ranks("backend_fsdp.py", 2, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    if any("fsdp: not on this torch" in out for _, out in results):
        pytest.skip(next(line for line in results[0][1].splitlines() if line.startswith("fsdp:")))
    assert all("fsdp checks done" in out for _, out in results), results
    assert all("fsdp2 checks done" in out or "fsdp2: not on this torch" in out for _, out in results), results


@pytest.mark.parametrize("world", [2, 4])
def test_the_gloo_fallback_asked_for_at_init_serves_what_the_daemon_does_not_and_dtensor_runs(daemon, world):
    results = run_ranks("backend_fallback.py", world, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    for rank, (_, out) in enumerate(results):
        assert f"rank {rank}: fallback checks done" in out, out
        # torch 2.x: DTensor over a mesh of the group (1.13 has none, and says so).
        assert f"rank {rank}: dtensor checks done" in out or "dtensor: not on this torch" in out, out
        # Nothing the library holds fails as the interpreter exits with groups torch still holds.
        assert "Exception ignored" not in out, out


@pytest.mark.parametrize("mode", ["gloo-default", "bad-interface"])
def test_the_gloo_fallback_under_a_gloo_default_group_and_a_rank_that_cannot_make_it(daemon, mode):
    results = run_ranks("backend_fallback.py", 2, daemon, args=(mode,), env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    for rank, (_, out) in enumerate(results):
        assert f"rank {rank}: {mode.replace('-', ' ')} checks done" in out, out


def test_a_rank_that_did_not_ask_for_the_gloo_fallback_is_named_by_the_one_that_did(daemon):
    results = run_ranks("backend_fallback_disagree.py", 2, daemon, timeout=60, env={"TEST_PORT": str(free_port())})
    out = results[0][1]
    assert "rank 0: init failed after" in out and "rank(s) [1] of this group did not make the gloo fallback" in out \
        and "pg_options" in out, results
    assert float(re.search(r"init failed after ([0-9.]+) s", out).group(1)) < 30, out


def test_ddp_with_powersgd_under_inline_futures_keeps_every_rank_alike(daemon):
    # torch's PowerSGD hook starts collectives in future callbacks; rank 1 comes late to every
    # one of 6 buckets. Under inline_futures() every rank's parameters stay equal.
    for rank, (_, out) in enumerate(_scenario(daemon, "powersgd")):
        assert f"rank {rank}: PowerSGD with inline_futures went through 6 steps of 6 buckets" in out, out


def test_ddp_with_powersgd_without_inline_futures_fails_as_a_layout_mismatch(daemon):
    # The same run without it: rank 1's callbacks start their collectives before its next
    # bucket's, rank 0's after all of its buckets', and the daemon refuses the different orders
    # (this is what the test above would see without inline_futures()).
    results = _scenario(daemon, "powersgd", extra_args=("unordered",))
    failed = [out for _, out in results if "PowerSGD without inline_futures failed" in out]
    assert failed, results
    assert any("LayoutMismatch" in out for out in failed), failed
