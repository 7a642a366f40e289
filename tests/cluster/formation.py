"""Formation at scale: N gradsyncd on loopback (one per simulated node, node 0's peer service the
rendezvous, or a 3-member etcd cluster with --rendezvous etcd), one trainer each (gradsync-demo's,
the tiny model, one step checked element by element), timed from the moment the last daemon is
ready to the moment every trainer has verified its step; and the calls the rendezvous answered
meanwhile, by method (node 0's gradsync_peer_calls_total, or the etcd members'
grpc_server_started_total), which is the store traffic of one formation, and through node 0 the
bytes its Gets answered (gradsync_peer_get_bytes_total).

    formation.py [--nodes 16,32,64] [--runs 3] [--rendezvous node0|etcd] [--json FILE]

Loopback rather than the namespaces: formation is bound by round trips to the rendezvous and
the Gloo mesh's connections, not by link bandwidth, and 64 namespaces add nothing to measure.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BYTES_READ = "bytes read"  # not a method: the bytes of the values node 0's Gets answered
BUILD = os.environ.get("GRADSYNC_BUILD", os.path.join(HERE, "..", "..", "build"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_calls(metrics_port):
    """Node 0's peer calls by method, and (under "bytes read") the bytes its Gets answered."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    calls = {m.group(1): int(float(m.group(2)))
             for m in re.finditer(r'^gradsync_peer_calls_total\{method="(\w+)"\} (\S+)$', text, re.M)}
    read = re.search(r'^gradsync_peer_get_bytes_total (\S+)$', text, re.M)
    if read:
        calls[BYTES_READ] = int(float(read.group(1)))
    return calls


def etcd_calls(ports):
    """gRPC calls the etcd members began, by method, summed over the members."""
    calls = {}
    for port in ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for m in re.finditer(r'^grpc_server_started_total\{grpc_method="(\w+)",[^}]*\} (\S+)$', text, re.M):
            calls[m.group(1)] = calls.get(m.group(1), 0) + int(float(m.group(2)))
    return calls


class Etcd:
    """A 3-member etcd cluster on loopback, its data in /dev/shm (Debian's etcd-server)."""

    def __init__(self, members=3):
        self.dir = tempfile.mkdtemp(prefix="gradsync-formation-etcd-", dir="/dev/shm")
        self.ports = [free_port() for _ in range(members)]
        peers = [free_port() for _ in range(members)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.procs = []
        for i in range(members):
            url, peer = f"http://127.0.0.1:{self.ports[i]}", f"http://127.0.0.1:{peers[i]}"
            argv = ["etcd", "--name", f"m{i}", "--data-dir", f"{self.dir}/m{i}", "--listen-client-urls", url,
                    "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
                    peer, "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--heartbeat-interval", "50", "--election-timeout", "500"]
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        end = time.monotonic() + 30
        env = dict(os.environ, ETCDCTL_API="3")
        while subprocess.run(["etcdctl", "--endpoints", self.endpoints(), "endpoint", "health"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > end:
                self.close()
                raise RuntimeError("etcd did not come up")
            time.sleep(0.1)

    def endpoints(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Daemons:
    """N gradsyncd on loopback with one cluster token; node 0 serves metrics."""

    def __init__(self, nodes, rendezvous=None):
        self.dir = tempfile.mkdtemp(prefix="gradsync-formation-")
        token = os.path.join(self.dir, "token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        self.node0 = rendezvous is None  # node 0's peer service is the rendezvous
        self.rendezvous = rendezvous or f"127.0.0.1:{free_port()}"
        self.metrics = free_port()
        self.sockets, self.procs = [], []
        try:
            self._start(nodes, token)
        except BaseException:
            self.close()  # the daemons started so far, and the folder
            raise
        self.ready = time.monotonic()

    def _start(self, nodes, token):
        binary = os.path.join(BUILD, "bin", "gradsyncd")
        for n in range(nodes):
            sock = os.path.join(self.dir, f"node{n}.sock")
            argv = [binary, "--socket", sock, "--peer-token-file", token, "--reduce-threads", "1",
                    "--log-level", "warning",
                    "--peer-listen", self.rendezvous if n == 0 and self.node0 else "127.0.0.1:0"]
            if n == 0:
                argv += ["--metrics", f"127.0.0.1:{self.metrics}"]
            log = open(os.path.join(self.dir, f"node{n}.log"), "w")
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            log.close()
            self.sockets.append(sock)
        end = time.monotonic() + 60
        for n, sock in enumerate(self.sockets):
            while not os.path.exists(sock):
                if self.procs[n].poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"gradsyncd of node {n} did not start:\n" + self.log(n))
                time.sleep(0.01)

    def log(self, n):
        with open(os.path.join(self.dir, f"node{n}.log")) as f:
            return f.read()

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def form(daemons, job, timeout=120):
    """Starts one trainer per node; returns seconds until every one verified its step."""
    nodes = len(daemons.sockets)
    demo = os.path.join(BUILD, "bin", "gradsync-demo")
    start = time.monotonic()
    trainers = [subprocess.Popen([demo, "--trainer", str(n), "--clients", "1", "--nodes", str(nodes), "--steps", "1",
                                  "--model", "tiny", "--socket", daemons.sockets[n], "--job", job, "--rendezvous",
                                  daemons.rendezvous], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for n in range(nodes)]
    failed = []
    for n, t in enumerate(trainers):
        try:
            if t.wait(max(1, timeout - (time.monotonic() - start))) != 0:
                failed.append(f"rank {n} exited {t.returncode}: {t.stderr.read()[-500:]}")
        except subprocess.TimeoutExpired:
            failed.append(f"rank {n} did not finish within {timeout} s")
    took = time.monotonic() - start
    for t in trainers:
        if t.poll() is None:
            t.kill()
            t.wait()
    if failed:
        raise RuntimeError(f"{nodes}-node formation failed:\n" + "\n".join(failed[:5]))
    return took


def measure(nodes, runs, etcd=None):
    """(seconds per formation for each run, the rendezvous's calls of one formation, by method)."""
    daemons = Daemons(nodes, "etcd://" + etcd.endpoints() if etcd else None)
    count = (lambda: etcd_calls(etcd.ports)) if etcd else (lambda: peer_calls(daemons.metrics))
    try:
        times, calls = [], None
        for run in range(runs):
            before = count()
            times.append(form(daemons, f"formation-{nodes}-{run}-{os.getpid()}"))
            time.sleep(0.5)  # the last leaves reach the rendezvous
            after = count()
            calls = {m: after.get(m, 0) - before.get(m, 0) for m in after}
        return times, calls
    finally:
        daemons.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="16,32,64", help="comma-separated node counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rendezvous", choices=["node0", "etcd"], default="node0",
                        help="node 0's peer service, or a 3-member etcd cluster this script starts")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    where = "calls at etcd" if args.rendezvous == "etcd" else "calls at node 0"
    print(f"{'nodes':>5}  {'formation s (median, min-max)':>30}  {where:>15}  by method")
    etcd = Etcd() if args.rendezvous == "etcd" else None
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            row(n, args.runs, etcd, rows)
    finally:
        if etcd:
            etcd.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def row(n, runs, etcd, rows):
    """Measures `n` nodes and prints and keeps its row."""
    times, calls = measure(n, runs, etcd)
    read = calls.pop(BYTES_READ, None)
    total = sum(calls.values())
    rows.append({"nodes": n, "seconds": times, "median": statistics.median(times), "calls": calls,
                 "calls_total": total, "bytes_read": read})
    spread = f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})"
    detail = ", ".join(f"{m} {c}" for m, c in sorted(calls.items()) if c)
    bytes_note = f"; Gets answered {read:,} bytes ({read / n:,.0f} per node)" if read is not None else ""
    print(f"{n:>5}  {spread:>30}  {total:>15}  {detail}  ({total / n:.1f} per node){bytes_note}", flush=True)


if __name__ == "__main__":
    main()
