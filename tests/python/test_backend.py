"""The torch.distributed backend "gradsync" (gradsync/torch/backend.py): init_process_group("gradsync")
as the default group, checked against a gloo group of the same ranks in the same processes
(workers/backend.py): every offered collective, DDP without a hook for 50 steps, and the refusals."""
import os
import shutil
import subprocess
import sys
import tempfile
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


def test_backend_two_nodes_on_loopback_match_gloo():
    # Two daemons ("nodes") of one cluster, two ranks on each: the cross-node path (Gloo between
    # the daemons) under the backend, every collective and DDP against torch's gloo.
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
            processes.append(subprocess.Popen([sys.executable, os.path.join(HERE, "workers", "backend.py")], env=env,
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
        assert all("backend checks done" in out for _, out in results), results
        assert "world size 4, node 1 of 2" in nodes[1].log(), nodes[1].log()  # the job spanned both
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(token_dir, ignore_errors=True)


def test_importing_gradsync_does_not_import_torch_but_gradsync_torch_registers_the_backend():
    code = ("import sys, gradsync; assert 'torch' not in sys.modules, 'gradsync imported torch'; "
            "import gradsync.torch, torch.distributed as dist; assert dist.Backend.GRADSYNC; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_a_group_smaller_than_the_world_is_refused_by_name():
    # What dist.new_group(ranks=[0, 1]) with the gradsync backend reaches on a member rank of a
    # 3-rank job (run in one process: in a real job the non-members would wait for the members
    # in torch's store barrier).
    code = ("import datetime, os; os.environ['WORLD_SIZE'] = '3'; import gradsync.torch.backend as b\n"
            "try:\n    b.ProcessGroupGradsync(None, 0, 2, datetime.timedelta(seconds=5))\n"
            "except NotImplementedError as e:\n    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: gradsync backend: a group of 2 of the 3 ranks is not offered yet" in out.stdout, \
        out.stdout + out.stderr


def test_local_ranks_come_from_the_hosts_ranks_publish_in_the_store():
    # Without $LOCAL_RANK/$LOCAL_WORLD_SIZE each rank publishes its host name; the ranks on this
    # rank's host, in global order, are its local ranks. Rank 2 of 4 shares a host with rank 0.
    code = ("import socket; import gradsync.torch.backend as b\n"
            "class Store(dict):\n"
            "    def set(self, k, v): self[k] = v.encode()\n"
            "    def get(self, k): return self[k]\n"
            "here, there = socket.gethostname(), socket.gethostname() + '-other'\n"
            "s = Store({'gradsync/host/0': here.encode(), 'gradsync/host/1': there.encode(), "
            "'gradsync/host/3': there.encode()})\n"
            "print('local', b._local_ranks(s, 2, 4))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "local (1, 2)" in out.stdout, out.stdout + out.stderr


def _scenario(daemon, name, world=2, **env_extra):
    env = {"TEST_PORT": str(free_port()), "GRADSYNCD_PID": str(daemon.process.pid), "TEST_DIR": daemon.dir,
           **env_extra}
    results = run_ranks("backend_errors.py", world, daemon, args=(name,), env=env, timeout=120)
    assert_all_ok(results, daemon)
    for rank, (_, out) in enumerate(results):
        if not (name.endswith("killed-peer") and rank == 1):
            assert f"{name} done" in out, out
    return results


def test_async_op_returns_at_once_and_waits_with_a_timeout(daemon):
    _scenario(daemon, "async")


def test_the_timeout_of_init_process_group_bounds_an_operation(daemon):
    _scenario(daemon, "timeout")


def test_a_layout_mismatch_raises_torchs_type_with_gradsyncs_text(daemon):
    _scenario(daemon, "layout")


def test_a_killed_rank_fails_the_next_operation_naming_it(daemon):
    _scenario(daemon, "killed-peer")


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


def test_a_future_callback_may_wait_for_a_collective(daemon):
    _scenario(daemon, "callback-waits")


def test_a_future_callback_running_at_exit_finishes_and_the_process_exits_cleanly(daemon):
    for rank, (_, out) in enumerate(_scenario(daemon, "callback-outlives-main")):
        assert f"rank {rank}: the callback finished" in out, out


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
