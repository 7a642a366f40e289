"""A simulated cluster on one machine: N nodes, each a network namespace with its own veth link
to a bridge in a hub namespace, its own cores, and a shaped link.

    with SimCluster(3, rate="10gbit") as cluster:
        cluster.spawn(0, ["gradsyncd", ...])        # runs in node 0's namespace, on its cores
        cluster.partition(1); cluster.heal(1)        # node 1's link down, then up
        cluster.impair(2, loss=0.02, delay_ms=200)   # node 2's frames through the router
        cluster.clear(2)

What it builds (names carry this process's pid, so concurrent harnesses never meet):
  gsc<pid>-hub     the hub: bridge br0, and per node the hub end n<k> of that node's link
  gsc<pid>-<k>     node k: eth0 at 10.77.0.<k+1>/16, lo, and the processes spawned for it
Links are shaped with tc tbf on both ends (each direction at `rate`). This kernel has no netem
and no tc drop action, so loss and latency come from router.py, a userspace forwarder that an
impaired node's hub end is moved behind (n<k> <-> router <-> r<k>/b<k> <-> br0).

Teardown (close(), the context's exit, atexit, and SIGTERM/SIGINT/SIGHUP, which become
SystemExit while a cluster is up): every process spawned is killed with its process group, then
any process still inside a namespace, then the namespaces, whose deletion removes their links.
A harness killed with SIGKILL cannot clean up; the next SimCluster removes what a dead pid left
(sweep_stale()).

Traffic stays inside: no link reaches the host's namespace, and nodes have no default route.
Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for namespaces): NotRoot says so otherwise.
"""
import atexit
import os
import re
import signal
import subprocess
import sys
import threading
import time

PREFIX = "gsc"
_NAME = re.compile(PREFIX + r"(\d+)-(hub|\d+)$")
HERE = os.path.dirname(os.path.abspath(__file__))


class NotRoot(RuntimeError):
    pass


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _hold_signals():
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def _release_signals(held):
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _ip(*args, check=True):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _run(argv, check=True):
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out.stdout


def namespaces():
    """The harness's namespaces on this machine, any pid's."""
    names = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if _NAME.match(name):
            names.append(name)
    return names


def _kill_inside(ns):
    for pid in _ip("netns", "pids", ns, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale():
    """Removes the namespaces (and their processes) of harnesses whose process is gone."""
    removed = []
    for ns in namespaces():
        owner = int(_NAME.match(ns).group(1))
        if owner != os.getpid() and not _alive(owner):
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    return removed


class Node:
    def __init__(self, cluster, index, cores):
        self.index = index
        self.ns = f"{cluster.tag}-{index}"
        self.ip = f"10.77.{(index + 1) // 256}.{(index + 1) % 256}"
        self.hub_end = f"n{index}"  # this node's link, as the hub sees it
        self.cores = cores

    def __repr__(self):
        return f"node {self.index} ({self.ns}, {self.ip}, cores {self.cores})"


def _tbf(ns, dev, rate):
    # burst: at least one timer tick of traffic at the rate (HZ >= 100) so that tbf can reach
    # it; latency bounds the queue.
    bits = _parse_rate(rate)
    burst = max(64 * 1024, bits // 8 // 100)
    _ip("-n", ns, "link", "set", dev, "txqueuelen", "10000")
    _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", str(bits) + "bit",
          "burst", str(burst), "latency", "100ms"])


def _parse_rate(rate):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", str(rate).lower())
    if not m:
        raise ValueError(f"rate {rate!r}: give e.g. '10gbit', '25gbit' or '500mbit'")
    return int(float(m.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)])


class SimCluster:
    """`nodes` namespaces on one bridge; `rate` shapes every link (None: unshaped);
    `cores` is the list of CPUs to deal out, one per node in turn (default: all of them)."""

    def __init__(self, nodes, rate=None, cores=None):
        if os.geteuid() != 0:
            raise NotRoot("the simulated cluster needs root (network namespaces, veth links and tc): run as root, "
                          "e.g. with sudo, as CI and the developers' machines do")
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, not {nodes}")
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hub = f"{self.tag}-hub"
        cpus = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.nodes = [Node(self, k, str(cpus[k % len(cpus)])) for k in range(nodes)]
        if rate is not None:
            _parse_rate(rate)  # refused here, before anything is made
        self.rate = rate
        self._procs = []
        self._routers = {}
        self._up = False
        self._closing = False
        self._old_handlers = {}

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.close()

    def up(self):
        sweep_stale()
        self._catch_signals()
        atexit.register(self.close)
        self._up = True
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "set", "lo", "up")
            # A fixed address: a bridge takes its lowest port's otherwise, and changes it as ports come and go.
            _ip("-n", self.hub, "link", "add", "br0", "address", "02:67:73:00:00:01", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for node in self.nodes:
                _ip("netns", "add", node.ns)
                _ip("-n", node.ns, "link", "set", "lo", "up")
                _ip("-n", self.hub, "link", "add", node.hub_end, "type", "veth", "peer", "name", "eth0", "netns",
                    node.ns)
                _ip("-n", self.hub, "link", "set", node.hub_end, "master", "br0")
                _ip("-n", self.hub, "link", "set", node.hub_end, "up")
                _ip("-n", node.ns, "addr", "add", node.ip + "/16", "dev", "eth0")
                _ip("-n", node.ns, "link", "set", "eth0", "up")
                if self.rate:
                    _tbf(node.ns, "eth0", self.rate)            # node -> bridge
                    _tbf(self.hub, node.hub_end, self.rate)     # bridge -> node
        except BaseException:
            self.close()
            raise

    def close(self):
        """Kills everything spawned and removes every namespace: idempotent, any thread. The
        stop signals are held off meanwhile (main thread), so a second Ctrl-C cannot cut the
        teardown short; the cluster counts as up until it is done."""
        if not self._up or self._closing:
            return
        self._closing = True
        held = _hold_signals()
        try:
            self._teardown()
        finally:
            self._up = False
            self._closing = False
            _release_signals(held)

    def _teardown(self):
        for proc in self._procs + list(self._routers.values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._procs + list(self._routers.values()):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._routers.clear()
        for ns in [n.ns for n in self.nodes] + [self.hub]:
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
        self._restore_signals()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 (interpreter shutting down)
            pass

    def _catch_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def to_exit(signum, _frame):
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # pytest stops the session on it, as on any Ctrl-C
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, to_exit)

    def _restore_signals(self):
        for sig, handler in self._old_handlers.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()

    # -- processes -----------------------------------------------------------------------------

    def command(self, k, argv):
        """argv as it runs in node k: in its namespace, pinned to its cores."""
        node = self.nodes[k]
        return ["ip", "netns", "exec", node.ns, "taskset", "-c", node.cores, *argv]

    def spawn(self, k, argv, **popen):
        """Starts argv in node k (its own process group); the cluster kills it at teardown."""
        proc = subprocess.Popen(self.command(k, argv), start_new_session=True, **popen)
        self._procs.append(proc)
        return proc

    # -- links ---------------------------------------------------------------------------------

    def partition(self, k):
        """Node k's link goes down: nothing reaches it or leaves it."""
        _ip("-n", self.hub, "link", "set", self.nodes[k].hub_end, "down")

    def heal(self, k):
        _ip("-n", self.hub, "link", "set", self.nodes[k].hub_end, "up")

    def impair(self, k, loss=0.0, delay_ms=0.0, seed=1):
        """Node k's frames, both ways, go through the userspace router, which drops a `loss`
        fraction of them and delays each by `delay_ms` (each direction)."""
        if k in self._routers:
            self.clear(k)
        node = self.nodes[k]
        # The router forwards whole frames: no segmentation or checksum left to the hardware.
        for n in self.nodes:
            _run(["ip", "netns", "exec", n.ns, "ethtool", "-K", "eth0", "tso", "off", "gso", "off", "tx", "off"])
        r, b = f"r{k}", f"b{k}"
        _ip("-n", self.hub, "link", "add", r, "type", "veth", "peer", "name", b)
        for dev in (node.hub_end, r, b):
            _run(["ip", "netns", "exec", self.hub, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off",
                  "tx", "off"])
        _ip("-n", self.hub, "link", "set", b, "master", "br0")
        _ip("-n", self.hub, "link", "set", b, "up")
        _ip("-n", self.hub, "link", "set", r, "up")
        _ip("-n", self.hub, "link", "set", node.hub_end, "nomaster")
        ready = os.pipe()
        router = subprocess.Popen(
            ["ip", "netns", "exec", self.hub, sys.executable, os.path.join(HERE, "router.py"), node.hub_end, r,
             "--loss", str(loss), "--delay-ms", str(delay_ms), "--seed", str(seed), "--ready-fd", str(ready[1])],
            start_new_session=True, pass_fds=(ready[1],))
        os.close(ready[1])
        self._routers[k] = router
        with os.fdopen(ready[0]) as f:
            if f.read(1) != "1":
                raise RuntimeError(f"the router for node {k} did not start (exit {router.wait()})")

    def clear(self, k):
        """Node k's link back on the bridge, as it was."""
        router = self._routers.pop(k, None)
        if router is None:
            return
        os.killpg(router.pid, signal.SIGKILL)
        router.wait(10)
        _ip("-n", self.hub, "link", "del", f"r{k}", check=False)
        _ip("-n", self.hub, "link", "set", self.nodes[k].hub_end, "master", "br0")

    def link_bytes(self, k):
        """Bytes node k sent and received on its link (its eth0's counters)."""
        stats = {}
        for what in ("tx_bytes", "rx_bytes"):
            out = _run(["ip", "netns", "exec", self.nodes[k].ns, "cat", f"/sys/class/net/eth0/statistics/{what}"])
            stats[what] = int(out)
        return stats


def wait_until(predicate, timeout, interval=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
