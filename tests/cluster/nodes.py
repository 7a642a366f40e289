"""gradsync on a SimCluster: one gradsyncd per node, listening on the node's own address, and
trainers (trainer.py) whose event lines are read back.

    with SimCluster(3) as cluster, GradsyncNodes(cluster, tmp) as nodes:
        job = nodes.start_job("faults", steps=0, timeout=3)
        job.wait_for(lambda: job.all_have("step 3 ok"), 30)
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("GRADSYNC_BUILD", os.path.join(HERE, "..", "..", "build"))
PEER_PORT = 29590
TEST_PYTHON = os.environ.get("GRADSYNC_TEST_PYTHON", "/usr/bin/python3")


def now_ms():
    """CLOCK_MONOTONIC in milliseconds: the clock trainer.py stamps its events with."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000)


class Trainer:
    def __init__(self, proc, out_path, rank, node):
        self.proc, self.out_path, self.rank, self.node = proc, out_path, rank, node

    def events(self):
        """[(ms, text)] printed so far."""
        with open(self.out_path) as f:
            lines = f.read().splitlines()
        events = []
        for line in lines:
            ms, _, text = line.partition(" ")
            if ms.isdigit():
                events.append((int(ms), text))
        return events

    def first(self, prefix):
        """(ms, text) of the first event starting with `prefix`, or None."""
        return next(((ms, text) for ms, text in self.events() if text.startswith(prefix)), None)

    def output(self):
        with open(self.out_path) as f:
            return f.read()


class Job:
    def __init__(self, name, trainers):
        self.name, self.trainers = name, trainers

    def wait_for(self, predicate, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def all_have(self, prefix):
        return all(t.first(prefix) for t in self.trainers)

    def ended(self):
        return all(t.proc.poll() is not None for t in self.trainers)

    def describe(self):
        return "\n".join(f"--- rank {t.rank} (node {t.node}), exit {t.proc.poll()}:\n{t.output()[-3000:]}"
                         for t in self.trainers)


class GradsyncNodes:
    """A gradsyncd on every node of `cluster` with a shared token; `daemon_args` are added to
    every daemon's command line."""

    def __init__(self, cluster, daemon_args=(), workdir=None):
        self.cluster = cluster
        self.dir = tempfile.mkdtemp(prefix="gradsync-cluster-", dir=workdir)
        self.token = os.path.join(self.dir, "cluster.token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        self.daemon_args = list(daemon_args)
        self.daemons = {}

    def __enter__(self):
        for k in range(len(self.cluster.nodes)):
            self.start_daemon(k)
        for k in range(len(self.cluster.nodes)):
            self.wait_ready(k)
        return self

    def __exit__(self, *exc):
        self.close()

    def socket(self, k):
        return os.path.join(self.dir, f"node{k}.sock")

    def log(self, k):
        with open(os.path.join(self.dir, f"node{k}.log")) as f:
            return f.read()

    @property
    def rendezvous(self):
        return f"{self.cluster.nodes[0].ip}:{PEER_PORT}"

    def start_daemon(self, k):
        node = self.cluster.nodes[k]
        if os.path.exists(self.socket(k)):
            os.unlink(self.socket(k))
        log = open(os.path.join(self.dir, f"node{k}.log"), "a")
        argv = [os.path.join(BUILD, "bin", "gradsyncd"), "--socket", self.socket(k), "--peer-listen",
                f"{node.ip}:{PEER_PORT}", "--peer-token-file", self.token, "--gloo-iface", "eth0",
                "--reduce-threads", "1", *self.daemon_args]
        self.daemons[k] = self.cluster.spawn(k, argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self.daemons[k]

    def wait_ready(self, k, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(self.socket(k)):
                return
            if self.daemons[k].poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"gradsyncd of node {k} did not start:\n{self.log(k)}")

    def fds(self, k):
        """The open descriptors of node k's gradsyncd."""
        return len(os.listdir(f"/proc/{self.daemons[k].pid}/fd"))

    def start_job(self, name=None, steps=0, timeout=3.0, numel=1 << 16, per_node=1, pace=0.0, nodes=None):
        """per_node trainers on each node (or on `nodes`, a subset, for a job some node never
        joins); returns the Job."""
        name = name or f"cluster-{uuid.uuid4().hex[:8]}"
        count = len(self.cluster.nodes)
        world = count * per_node
        trainers = []
        for k in (range(count) if nodes is None else nodes):
            for local in range(per_node):
                rank = k * per_node + local
                out = os.path.join(self.dir, f"{name}.{rank}.out")
                with open(out, "w") as f:
                    argv = [TEST_PYTHON, os.path.join(HERE, "trainer.py"), "--socket", self.socket(k), "--job", name,
                            "--rank", str(rank), "--world", str(world), "--local-rank", str(local),
                            "--local-world", str(per_node), "--rendezvous", self.rendezvous, "--numel", str(numel),
                            "--steps", str(steps), "--pace", str(pace), "--timeout", str(timeout)]
                    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
                    proc = self.cluster.spawn(k, argv, stdout=f, stderr=subprocess.STDOUT, env=env)
                trainers.append(Trainer(proc, out, rank, k))
        return Job(name, trainers)

    def stop_job(self, job):
        for t in job.trainers:
            if t.proc.poll() is None:
                try:
                    os.killpg(t.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                t.proc.wait(10)

    def close(self):
        for proc in self.daemons.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.daemons.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def python_has_torch():
    return subprocess.run([TEST_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0
