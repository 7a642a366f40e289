"""The Python tests' harness: a real gradsyncd, and trainer processes. No pytest here, so the
device check can use it on a machine without pytest.

CTest runs these with /usr/bin/python3 (Debian's torch), PYTHONPATH=build/python and
GRADSYNCD_BINARY=build/bin/gradsyncd. Trainers are separate processes (workers/), as under
torchrun: the tests never share a client between ranks.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))


def cluster_token(directory):
    """A --peer-token-file for daemons playing the nodes of one job."""
    path = os.path.join(directory, "cluster.token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex())
    return path


class Daemon:
    def __init__(self, *args, peer_listen="127.0.0.1:0"):
        self.dir = tempfile.mkdtemp(prefix="gradsync-py-")
        self.socket = os.path.join(self.dir, "gradsync.sock")
        self.log_path = os.path.join(self.dir, "gradsyncd.log")
        binary = os.environ.get("GRADSYNCD_BINARY", os.path.join(HERE, "..", "..", "build", "bin", "gradsyncd"))
        env = dict(os.environ)
        if os.environ.get("GRADSYNCD_LD_LIBRARY_PATH"):  # the device bundle's libraries, for the daemon only
            env["LD_LIBRARY_PATH"] = os.environ["GRADSYNCD_LD_LIBRARY_PATH"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([binary, "--socket", self.socket, "--peer-listen", peer_listen, *args],
                                            stdout=log, stderr=subprocess.STDOUT, env=env)
        for _ in range(500):
            if os.path.exists(self.socket):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError("gradsyncd did not start:\n" + self.log())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def kill(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self):
        """stop(), then removes the daemon's folder (its socket and log): nothing is left in /tmp."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port():
    """A TCP port on loopback that nothing listens on now (for a test's torch.distributed store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script, world, daemon, args=(), timeout=240, env=None, job=None):
    """Runs `world` trainer processes of tests/python/workers/<script> with torchrun's variables;
    returns their (returncode, output) in rank order."""
    job = job or "py-" + uuid.uuid4().hex[:10]
    processes = []
    for rank in range(world):
        e = dict(os.environ)
        e.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                  "LOCAL_WORLD_SIZE": str(world), "TORCHELASTIC_RUN_ID": job, "OMP_NUM_THREADS": "1"})
        if daemon is not None:
            e["GRADSYNC_SOCKET"] = daemon.socket
        e.update(env or {})
        processes.append(subprocess.Popen([sys.executable, os.path.join(HERE, "workers", script), *map(str, args)],
                                          env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n[killed: timed out]"
        results.append((p.returncode, out))
    return results


def assert_all_ok(results, daemon=None):
    problems = [f"rank {r} exited {code}:\n{out}" for r, (code, out) in enumerate(results) if code != 0]
    if problems and daemon is not None:
        problems.append("gradsyncd log:\n" + daemon.log()[-4000:])
    assert not problems, "\n".join(problems)
