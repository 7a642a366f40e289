"""Failures leave nothing open: 100 cycles of a 3-node job whose node 2 freezes (its daemon
SIGSTOPped, then continued), each failing the survivors, and the daemons' descriptors and
established connections counted before and after. Was: one socket more on each survivor per
cycle, never closed (a gRPC channel per probe, dropped while the peer was frozen)."""
import os
import signal
import subprocess
import time

import pytest

import nodes
import simcluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the simulated cluster needs root")

CYCLES = int(os.environ.get("GRADSYNC_DESCRIPTOR_CYCLES", "100"))
BENCH = os.path.join(nodes.BUILD, "bin", "gradsync-bench")


def trainer(cluster, g, k, job):
    """The bench's C++ trainer (starts in milliseconds): steps until the job fails."""
    argv = [BENCH, "--role", "trainer", "--socket", g.socket(k), "--job", job, "--rank", str(k), "--world",
            str(len(cluster.nodes)), "--local-rank", "0", "--local-world", "1", "--layout", "flat:65536",
            "--steps", "1000000", "--warmup", "0", "--rendezvous", g.rendezvous]
    return cluster.spawn(k, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def established(cluster, k):
    out = subprocess.run(cluster.command(k, ["ss", "-Htn", "state", "established"]), capture_output=True,
                         text=True).stdout
    return len(out.splitlines())


def test_a_hundred_frozen_peer_failures_leave_no_descriptor_or_connection_behind():
    with simcluster.SimCluster(3) as cluster, nodes.GradsyncNodes(cluster, ["--timeout-ms", "500"]) as g:
        frozen = g.daemons[2]

        def cycle(i):
            procs = [trainer(cluster, g, k, f"fd-cycle-{i}") for k in range(3)]
            time.sleep(0.3)  # formed and stepping
            frozen.send_signal(signal.SIGSTOP)
            try:
                for p in procs[:2]:
                    p.wait(30)  # the survivors fail: job timeout, then the probe that names node 2
                    assert p.returncode != 0, "a survivor finished a job whose node 2 froze"
            finally:
                frozen.send_signal(signal.SIGCONT)
            procs[2].wait(30)

        for i in range(3):  # warm: the channels and the daemons' pools exist from here on
            cycle(i)
        time.sleep(1)
        before = [g.fds(k) for k in range(3)]
        connections = [established(cluster, k) for k in range(3)]
        start = time.monotonic()
        for i in range(3, 3 + CYCLES):
            cycle(i)
        took = time.monotonic() - start

        def settled():
            # A few descriptors come and go with the last job's Gloo pairs and the threads of the
            # moment, for a second or two; a leak per failure would be CYCLES more, for good.
            return all(g.fds(k) <= before[k] + 4 and established(cluster, k) <= connections[k] + 2 for k in range(3))

        ok = simcluster.wait_until(settled, 15, interval=0.5)
        after = [g.fds(k) for k in range(3)]
        print(f"{CYCLES} cycles in {took:.0f} s: descriptors {before} -> {after}, "
              f"established connections {connections} -> {[established(cluster, k) for k in range(3)]}")
        assert ok, f"descriptors {before} before, {after} after {CYCLES} failures"
        for k, proc in g.daemons.items():
            assert proc.poll() is None, g.log(k)[-2000:]
