"""Failures a trainer meets mid-step, with the real daemon and trainer processes
(workers/killed_rank.py: two ranks, a tiny model, a 4 s job timeout):

* a rank SIGKILLed at a random moment of training, 20 times each for DDP with the comm hook and
  for GradBuffer, one run after the other: every survivor raises gradsync.PeerLostError with the
  daemon's text (the job, the lost rank and its pid) within the job timeout, never torch's
  "RuntimeError: Unable to cast ... to Tensor" or a RuntimeError wrapping it, whether its step
  failed inside backward() (a gradient hook, the DDP reducer's wait) or in GradBuffer.wait();
  and its process exits, the exception uncaught (a trainer that hangs at exit fails);
* gradsyncd stopped (SIGTERM) under training: both ranks raise gradsync.AbortedError ("gradsyncd
  is shutting down") and exit.

$GRADSYNC_KILLS changes the count, $GRADSYNC_KILL_SEED the random moments (printed on failure)."""
import json
import os
import re
import random
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import HERE
from harness import free_port

KILLS = int(os.environ.get("GRADSYNC_KILLS", "20"))
JOB_TIMEOUT = 4.0
SLACK = 1.5  # a loaded 2-core machine's scheduling, on top of the bound under test
EXIT_WITHIN = 15  # seconds from the failure to a rank's exit; longer is a hang


def _read(path):
    """What a worker wrote so far; nothing yet when it has not opened its file: the fork server
    says "started" as soon as it forked, and on a loaded machine the child may not have run at
    all by the time the test first looks (a CI run once failed there, FileNotFoundError)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _stacks(pid):
    """A hung process's native stacks, for the failure message (gdb, where there is one)."""
    try:
        return subprocess.run(["gdb", "-batch", "-ex", "thread apply all bt 30", "-p", str(pid)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=60).stdout[-5000:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stacks: {e})"


class _ForkServer:
    """workers/fork_server.py: trainer processes forked from one interpreter that imported torch
    already, so that 80 of them take seconds, not minutes, on 2 cores."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "workers", "fork_server.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                        env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.exited = {}  # pid -> exit code (-SIGNAL)
        self.started = []
        self._partial = b""  # the server's output after its last complete line

    def _pump(self, timeout):
        """Reads the server's replies for up to `timeout` seconds: every complete line that has
        come. Read from the descriptor with a buffer of our own: a buffered readline() could
        take two lines ("exited A", "exited B") from the pipe and return one, and select() would
        then not wake for the other (a rank reported as never exiting)."""
        fd = self.process.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            raise RuntimeError(f"the fork server ended (exit {self.process.wait()})")
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            what, pid, *code = line.decode().split()
            if what == "started":
                self.started.append(int(pid))
            else:
                self.exited[int(pid)] = int(code[0])

    def start(self, script, argv, env, out):
        self.process.stdin.write(json.dumps({"script": os.path.join(HERE, "workers", script), "argv": argv,
                                             "env": env, "out": out}) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + 60
        while not self.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fork server did not start a process within 60 s")
            self._pump(1)
        return _Child(self, self.started.pop(0))

    def close(self):
        self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Child:
    def __init__(self, server, pid):
        self.server, self.pid = server, pid

    def poll(self):
        self.server._pump(0)
        return self.server.exited.get(self.pid)

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pid not in self.server.exited:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self.server._pump(0.05)
        return self.server.exited[self.pid]

    def kill(self):
        if self.pid not in self.server.exited:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Job:
    """Two ranks of workers/killed_rank.py MODE, their output in files under `directory`."""

    def __init__(self, server, daemon, mode, directory, name):
        self.id = f"{name}-" + uuid.uuid4().hex[:6]
        port = str(free_port())
        self.processes, self.paths = [], []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       TORCHELASTIC_RUN_ID=self.id, OMP_NUM_THREADS="1", GRADSYNC_SOCKET=daemon.socket,
                       JOB_TIMEOUT=str(JOB_TIMEOUT), TEST_PORT=port)
            path = os.path.join(str(directory), f"{self.id}-{rank}.out")
            self.processes.append(server.start("killed_rank.py", [mode], env, path))
            self.paths.append(path)

    def training(self):
        """Waits until both ranks finished a step; a problem, or None."""
        deadline = time.monotonic() + 120
        while not all("training" in _read(p) for p in self.paths):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                return "the ranks did not both start training:\n" + "\n".join(
                    f"rank {r}:\n{_read(p)}" for r, p in enumerate(self.paths))
            time.sleep(0.02)
        return None

    def check(self, rank, failed_at, within, cls, needles, phases):
        """Rank `rank` raised gradsync's `cls` with every needle in its text, within `within`
        seconds of `failed_at` (time.time()), and exited, the exception uncaught. Counts in
        `phases` where its step failed. A problem, or None."""
        process = self.processes[rank]
        try:
            code = process.wait(max(1, failed_at + EXIT_WITHIN - time.time()))
        except subprocess.TimeoutExpired:
            return f"rank {rank} did not exit within {EXIT_WITHIN} s:\n{_read(self.paths[rank])}\n" + \
                _stacks(process.pid)
        finally:
            out = _read(self.paths[rank])
            for line in out.splitlines():
                if line.startswith("raised at "):
                    phases[line.split()[4]] = phases.get(line.split()[4], 0) + 1
        # torch 2.x prints an uncaught exception's lines after "[rankN]: " in a process group.
        lines = [re.sub(r"^\[rank\d+\]: ", "", line) for line in out.splitlines()]
        raised = [l for l in lines if l.startswith("raised ") and not l.startswith("raised at ")]
        at = [float(l.split()[2]) for l in lines if l.startswith("raised at ")]
        if not raised or not raised[0].startswith(f"raised {cls}: ") or not at:
            return f"rank {rank} did not raise {cls} (exit {code}):\n{out}"
        if not lines[-1].startswith(f"gradsync.errors.{cls}: "):
            return f"rank {rank}'s uncaught error is not gradsync.{cls}:\n{out}"
        text = raised[0][len(f"raised {cls}: "):]
        missing = [n for n in needles if n not in text]
        if missing:
            return f"rank {rank}'s {cls} does not say {missing}: {text}"
        if at[0] - failed_at > within:
            return f"rank {rank} raised {at[0] - failed_at:.2f} s after the failure (bound {within} s):\n{out}"
        if code != 1:
            return f"rank {rank} exited {code}, not 1 (an uncaught exception):\n{out}"
        return None

    def kill_all(self):
        for p in self.processes:
            p.kill()
        for p in self.processes:
            p.wait(60)


def _one_kill(server, daemon, mode, rng, directory, n, phases):
    """One job; one rank SIGKILLed at a random moment of training. A problem, or None."""
    job = _Job(server, daemon, mode, directory, f"kill-{mode}-{n}")
    victim = rng.randrange(2)
    delay = rng.uniform(0.0, 0.4)
    try:
        problem = job.training()
        if problem:
            return f"run {n}: {problem}"
        time.sleep(delay)
        job.processes[victim].kill()
        killed_at = time.time()
        job.processes[victim].wait()
        problem = job.check(1 - victim, killed_at, JOB_TIMEOUT + SLACK, "PeerLostError",
                            [job.id, f"rank {victim} (client pid {job.processes[victim].pid})"], phases)
        return problem and f"run {n} ({mode}, rank {victim} killed {delay:.3f} s into training): {problem}"
    finally:
        job.kill_all()


@pytest.fixture
def server():
    s = _ForkServer()
    yield s
    s.close()


@pytest.mark.parametrize("mode", ["hook", "gradbuffer"])
def test_survivors_of_a_killed_rank_raise_peer_lost_and_exit(server, daemon, mode, tmp_path):
    seed = int(os.environ.get("GRADSYNC_KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    problems, phases = [], {}
    for n in range(KILLS):
        problem = _one_kill(server, daemon, mode, rng, tmp_path, n, phases)
        if problem:
            problems.append(problem)
    print(f"{mode}: {KILLS - len(problems)} of {KILLS} survivors raised PeerLostError and exited (seed {seed}); "
          f"where their steps failed: {phases}")
    assert not problems, f"{len(problems)} of {KILLS} kills failed (GRADSYNC_KILL_SEED={seed}):\n\n" + \
        "\n\n".join(problems) + "\n\ngradsyncd log:\n" + daemon.log()[-3000:]


@pytest.mark.parametrize("mode", ["hook", "gradbuffer"])
def test_daemon_stopping_under_training_raises_aborted_and_ranks_exit(server, daemon, mode, tmp_path):
    job = _Job(server, daemon, mode, tmp_path, f"stop-{mode}")
    try:
        problem = job.training()
        assert problem is None, problem
        time.sleep(0.1)
        stopped_at = time.time()
        daemon.stop()  # SIGTERM: operations submitted already may finish for 2 s (--drain-timeout-ms)
        phases = {}
        problems = [job.check(rank, stopped_at, 2.0 + SLACK, "AbortedError", ["gradsyncd is shutting down"], phases)
                    for rank in range(2)]
        problems = [p for p in problems if p]
        assert not problems, "\n\n".join(problems) + "\n\ngradsyncd log:\n" + daemon.log()[-3000:]
    finally:
        job.kill_all()
