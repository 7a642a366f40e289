"""The torch.distributed backend "gradsync" (gradsync/torch/backend.py): init_process_group("gradsync")
as the default group, checked against a gloo group of the same ranks in the same processes
(workers/backend.py): every offered collective, DDP without a hook for 50 steps, and the refusals."""
import subprocess
import sys

from conftest import assert_all_ok, run_ranks
from harness import free_port


def test_backend_two_ranks_matches_gloo(daemon):
    results = run_ranks("backend.py", 2, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    for _, out in results:
        assert "backend checks done" in out, out


def test_backend_three_ranks_matches_gloo(daemon):
    assert_all_ok(run_ranks("backend.py", 3, daemon, env={"TEST_PORT": str(free_port())}), daemon)


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
