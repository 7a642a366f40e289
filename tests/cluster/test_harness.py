"""The simulated cluster itself: links that carry traffic at their shaped rate, faults that do
what they say, and a teardown that leaves nothing behind on any exit path."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import simcluster

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the simulated cluster needs root")

# A TCP echo between two nodes: the round trip of one byte and the time to echo N bytes.
ECHO = textwrap.dedent("""
    import socket, sys, threading, time
    host, mode = sys.argv[1], sys.argv[2]
    if mode == "serve":
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, 5000)); s.listen()
        print("listening", flush=True)
        while True:
            c, _ = s.accept()
            try:
                while (d := c.recv(1 << 20)): c.sendall(d)
            except OSError: pass
    else:
        nbytes = int(sys.argv[3])
        try:
            c = socket.create_connection((host, 5000), timeout=3)
            a = time.monotonic(); c.sendall(b"x"); c.recv(1); rtt = time.monotonic() - a
            big = b"y" * nbytes; a = time.monotonic()
            threading.Thread(target=c.sendall, args=(big,), daemon=True).start()
            got = 0
            while got < nbytes: got += len(c.recv(1 << 20))
            print(f"ok {rtt * 1000:.3f} {(time.monotonic() - a) * 1000:.1f}")
        except OSError as e:
            print(f"unreachable {e}")
""")


def echo(cluster, src, dst, nbytes=1 << 20):
    """(rtt ms, echo ms) from node src to node dst's echo server, or None when unreachable."""
    out = subprocess.run(cluster.command(src, [sys.executable, "-c", ECHO, cluster.nodes[dst].ip, "c", str(nbytes)]),
                         capture_output=True, text=True, timeout=60).stdout.split()
    return (float(out[1]), float(out[2])) if out and out[0] == "ok" else None


def serve(cluster, k):
    proc = cluster.spawn(k, [sys.executable, "-c", ECHO, cluster.nodes[k].ip, "serve"], stdout=subprocess.PIPE,
                         text=True)
    assert proc.stdout.readline().strip() == "listening"


def leftovers(tag):
    """What a harness of this tag left: namespaces, and processes in them."""
    return [ns for ns in simcluster.namespaces() if ns.startswith(tag + "-")]


def test_links_carry_traffic_at_their_rate_and_faults_do_what_they_say():
    with simcluster.SimCluster(3, rate="200mbit") as cluster:
        serve(cluster, 1)
        rtt, took = echo(cluster, 0, 1, 8 << 20)
        # 8 MiB each way at 200 Mbit/s is 336 ms; unshaped veth does it in a few ms.
        assert 300 < took < 2000, took
        cluster.impair(1, delay_ms=100)
        rtt, _ = echo(cluster, 0, 1, 1024)
        assert 195 < rtt < 1000, rtt  # 100 ms each way, and the Python router's own time
        cluster.impair(1, loss=1.0)
        assert echo(cluster, 0, 1, 1024) is None  # every frame dropped
        cluster.clear(1)
        # Back on the bridge: the first exchange may take a retransmission.
        assert simcluster.wait_until(lambda: (echo(cluster, 0, 1, 1024) or (1e9,))[0] < 50, 10)
        cluster.partition(1)
        assert echo(cluster, 0, 1, 1024) is None
        serve(cluster, 2)  # the others' links are unaffected
        assert echo(cluster, 0, 2, 1024) is not None
        cluster.heal(1)
        assert simcluster.wait_until(lambda: echo(cluster, 0, 1, 1024) is not None, 10)
        sent = cluster.link_bytes(0)
        assert sent["tx_bytes"] > 8 << 20 and sent["rx_bytes"] > 8 << 20, sent


def test_traffic_stays_inside_the_namespaces_the_harness_made():
    with simcluster.SimCluster(2) as cluster:
        routes = subprocess.run(cluster.command(0, ["ip", "route", "show"]), capture_output=True, text=True).stdout
        assert "default" not in routes, routes
        links = subprocess.run(cluster.command(0, ["ip", "-o", "link", "show"]), capture_output=True,
                               text=True).stdout
        assert {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()} == {"lo", "eth0"}, links
        # The host's namespace gained no link.
        host = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert "br0" not in host and " n0" not in host, host


# A harness in a child process, torn down by the way it ends: `how` is normal, exception,
# sigterm, sigint or sigkill (the next harness sweeps it).
CHILD = textwrap.dedent("""
    import faulthandler, os, sys, time, signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, should it hang
    sys.path.insert(0, {here!r})
    import simcluster
    how = sys.argv[1]
    cluster = simcluster.SimCluster(3, rate="1gbit")
    with cluster:
        cluster.spawn(1, ["sleep", "600"])
        cluster.impair(2, delay_ms=5)
        print(cluster.tag, flush=True)
        sys.stdin.readline()  # the test has seen what runs
        if how == "exception":
            raise RuntimeError("the test's failure")
        if how != "normal":
            time.sleep(600)
""")


@pytest.mark.parametrize("how", ["normal", "exception", "sigterm", "sigint", "sighup", "sigkill"])
def test_teardown_leaves_no_namespace_link_or_process_on_any_exit_path(how):
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(here=HERE), how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = child.stdout.readline().strip()
    assert tag.startswith(simcluster.PREFIX), child.stderr.read()
    assert len(leftovers(tag)) == 4  # the hub and 3 nodes, while it runs

    def inside():
        return [p for ns in leftovers(tag)
                for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]

    assert simcluster.wait_until(lambda: len(inside()) >= 2, 10), inside()  # the sleep and the router
    running = inside()
    child.stdin.write("go\n")
    child.stdin.flush()
    if how in ("sigterm", "sigint", "sighup", "sigkill"):
        child.send_signal({"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sighup": signal.SIGHUP,
                           "sigkill": signal.SIGKILL}[how])
    try:
        child.wait(60)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGUSR1)  # its threads' stacks, to stderr
        time.sleep(1)
        child.kill()
        child.wait()
        with simcluster.SimCluster(1):  # sweeps what the killed harness left
            pass
        pytest.fail(f"the harness did not end within 60 s of '{how}'; its stacks:\n{child.communicate()[1]}")
    if how == "sigkill":
        assert leftovers(tag), "a harness killed with SIGKILL cannot clean up: the next one sweeps"
        with simcluster.SimCluster(1):
            pass
    assert leftovers(tag) == []
    for pid in running:
        assert simcluster.wait_until(lambda: not alive(pid), 10), f"process {pid} outlived its namespace"


def alive(pid):
    """Running, not a zombie waiting for its parent (init, for a dead harness's children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_without_root_it_says_so():
    if os.geteuid() != 0:
        pytest.skip("needs root to make an unprivileged user")
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import simcluster\n"
            "try:\n    simcluster.SimCluster(2)\nexcept simcluster.NotRoot as e:\n    print(e)\n")
    out = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c",
                          code], capture_output=True, text=True, timeout=60)
    assert "needs root" in out.stdout, out.stdout + out.stderr


def test_a_rate_it_cannot_read_is_refused_with_an_example():
    with pytest.raises(ValueError, match="10gbit"):
        simcluster.SimCluster(2, rate="fast")
