"""Clear errors: no daemon, torchrun's variables missing, the daemon killed mid-step, bad input."""
import os
import select
import subprocess
import sys
import time

from conftest import HERE, assert_all_ok, run_ranks


def lines(output):
    return [l for l in output.splitlines() if l.startswith("raised ")]


def test_no_daemon_names_the_socket():
    [(code, out)] = run_ranks("errors.py", 1, None, args=("absent",))
    assert code == 0, out
    [line] = lines(out)
    assert line.startswith("raised PeerLostError") or line.startswith("raised NotFoundError"), line
    assert "/nonexistent/gradsync.sock" in line and "GRADSYNC_SOCKET" in line, line


def test_missing_torchrun_variables_are_named():
    [(code, out)] = run_ranks("errors.py", 1, None, args=("missing-env",))
    assert code == 0, out
    missing, rendezvous, garbage = lines(out)
    assert missing.startswith("raised InvalidArgumentError") and "rank" in missing and "$RANK" in missing, missing
    assert "rendezvous" in rendezvous and "$MASTER_ADDR" in rendezvous, rendezvous
    assert "$RANK='zero'" in garbage, garbage


def test_bad_input_is_refused_by_name_and_the_client_goes_on(daemon):
    results = run_ranks("errors.py", 2, daemon, args=("bad-input",))
    assert_all_ok(results, daemon)
    for code, out in results:
        got = lines(out)
        assert len(got) == 10, out
        # The set is named as the user knows it, never as a bare "set 0" they never made.
        want = ["at least one tensor", "op must be one of", "divisor applies to op='avg' only",
                "torch.complex64 is not supported", "on meta", "root 5 is not a rank", "unknown group 'tp'",
                "tensor 0 is empty",
                "avg is not defined for integer tensors, and a list of 1 int32 tensor (set ",
                "alloc of 18446744073709555712 bytes"]
        for line, needle in zip(got, want):
            assert needle in line, (needle, line)
        assert "after the errors: [3.0, 3.0, 3.0, 3.0]" in out, out


def test_daemon_killed_mid_step_raises_instead_of_hanging(daemon):
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
               TORCHELASTIC_RUN_ID="killed", GRADSYNC_SOCKET=daemon.socket)
    script = os.path.join(HERE, "workers", "errors.py")
    procs = []
    for rank in (0, 1):
        env["RANK"] = env["LOCAL_RANK"] = str(rank)
        procs.append(subprocess.Popen([sys.executable, script, "killed-daemon"], env=dict(env), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    # Until rank 0 is in its second step, waiting on an operation rank 1 never submits (however
    # long a loaded machine takes to import torch).
    first_line = ""
    deadline = time.monotonic() + 120
    while "waiting" not in first_line and time.monotonic() < deadline:
        ready, _, _ = select.select([procs[0].stdout], [], [], 1)
        if ready:
            first_line = procs[0].stdout.readline()
            if not first_line:
                break
    assert "waiting" in first_line, first_line
    time.sleep(0.2)  # it is inside wait() now
    killed_at = time.monotonic()
    daemon.kill()
    out0, _ = procs[0].communicate(timeout=30)
    elapsed = time.monotonic() - killed_at
    procs[1].kill()
    procs[1].communicate()
    assert procs[0].returncode == 0, out0
    first, second = lines(out0)
    assert first.startswith("raised PeerLostError") or first.startswith("raised AbortedError"), out0
    assert "gradsyncd" in first or "daemon" in first, first
    # The client is unusable now, and says so: the daemon is gone.
    assert second.startswith("raised PeerLostError") or second.startswith("raised AbortedError"), second
    assert elapsed < 10, f"rank 0 took {elapsed:.1f} s to notice"


def test_a_registration_in_a_job_a_lost_rank_failed_raises_peer_lost(daemon):
    # Not a bare AbortedError: the class says why the job failed, as its operations' errors do
    # (torch 2.x's DDP hook registers its buckets in the first backward, and met this).
    results = run_ranks("errors.py", 2, daemon, args=("register-after-peer-left",))
    assert_all_ok(results, daemon)
    [line] = lines(results[0][1])
    # ("has failed" when the job had failed before the registration, the failure itself when it
    # failed while the registration waited for rank 1: either way the lost rank's class.)
    assert line.startswith("raised PeerLostError") and "rank 1" in line, line


def test_world_size_not_a_whole_number_of_nodes_is_named():
    # Was: "the job spans 1 nodes, so it needs rendezvous" for world_size=3, local_world_size=2.
    code = ("import gradsync\n"
            "try:\n"
            "    gradsync.connect(socket='/nonexistent/gradsync.sock', job='j', rank=0, world_size=3, local_rank=0,\n"
            "                     local_world_size=2)\n"
            "except gradsync.InvalidArgumentError as e:\n"
            "    print('raised', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert "world_size 3 is not a whole number of nodes of local_world_size 2" in run.stdout, run.stdout
    assert "--nproc-per-node" in run.stdout and "spans" not in run.stdout, run.stdout


def test_abort_from_another_thread_fails_the_calling_thread_with_aborted_error(daemon):
    """gradsync.Client.abort while another thread is in allreduce_coalesced (workers/client_abort.py)."""
    assert_all_ok(run_ranks("client_abort.py", 1, daemon, args=("race",)), daemon)


def test_abort_after_close_still_leaves_the_job_a_work_holds(daemon):
    assert_all_ok(run_ranks("client_abort.py", 2, daemon, args=("after-close",)), daemon)
