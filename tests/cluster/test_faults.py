"""Network faults on the simulated cluster: real gradsyncd per node namespace, real trainers,
faults made on the links. In each case every node either finishes correctly or fails within the
job timeout (plus the one probe that names the cause) with an error that names the node whose
link failed; nothing hangs; the daemons stay up; a job started after the link heals verifies.
Each test prints its time to error and time to re-form (pytest -s shows them)."""
import os
import time

import pytest

import nodes
import simcluster

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="the simulated cluster needs root"),
              pytest.mark.skipif(not nodes.python_has_torch(), reason="the trainers need torch")]

TIMEOUT_S = 3.0
PROBE_S = 1.0      # PeerCluster's probe of the other daemons, after the job timeout
SLACK_S = 1.5      # scheduling on a 2-core machine running every node


def node_name(cluster, k):
    return f"node {k} (ranks {k}-{k}, gradsyncd at {cluster.nodes[k].ip}:{nodes.PEER_PORT})"


def last_step(trainer):
    steps = [int(text.split()[1]) for _, text in trainer.events() if text.startswith("step ")]
    return steps[-1] if steps else -1


def running(g, job, steps):
    assert job.wait_for(lambda: job.all_have(f"step {steps} ok"), 120), job.describe()


def reform(g, label):
    """A fresh job after the fault: it verifies; returns the ms from its start to its first step."""
    start = nodes.now_ms()
    job = g.start_job(steps=3, timeout=TIMEOUT_S)
    assert job.wait_for(job.ended, 120), job.describe()
    assert all(t.proc.returncode == 0 for t in job.trainers), f"after {label}:\n" + job.describe()
    took = max(t.first("step 0 ok")[0] for t in job.trainers) - start
    print(f"{label}: re-formed, first verified step {took} ms after the new job started")
    return took


def assert_daemons_up(g):
    for k, proc in g.daemons.items():
        assert proc.poll() is None, f"node {k}'s gradsyncd exited:\n{g.log(k)[-3000:]}"


def check_failed_naming(cluster, job, victim, since_ms, timeout_s=TIMEOUT_S):
    """Every trainer failed, within the bound (the job's timeout, the probe and the slack),
    naming the victim (the victim's naming the others); returns the slowest time to error."""
    bound = (timeout_s + PROBE_S + SLACK_S) * 1000
    assert job.wait_for(job.ended, 60), "a trainer hangs:\n" + job.describe()
    slowest = 0
    for t in job.trainers:
        error = t.first("error")
        assert error, f"rank {t.rank} did not fail:\n" + job.describe()
        took = error[0] - since_ms
        slowest = max(slowest, took)
        assert took <= bound, f"rank {t.rank} failed {took} ms after the fault (bound {bound}):\n{error[1]}"
        assert "WrongResult" not in error[1], error[1]
        if t.node == victim:
            for k in range(len(cluster.nodes)):
                if k != victim:
                    assert f"node {k} " in error[1], f"rank {t.rank}, cut off, does not name node {k}: {error[1]}"
        else:
            assert node_name(cluster, victim) in error[1], f"rank {t.rank} does not name node {victim}: {error[1]}"
    return slowest


def finished_or_named(cluster, job, victim, since_ms, steps_after, timeout_s=TIMEOUT_S):
    """The job went on (every trainer `steps_after` more verified steps, no error) or every
    trainer failed in bound naming the victim. Returns 'continued' or 'failed'."""
    def settled():
        return job.ended() or all(t.first(f"step {steps_after} ok") for t in job.trainers)

    assert job.wait_for(settled, 120), "neither finished nor failed:\n" + job.describe()
    if any(t.first("error") for t in job.trainers):
        check_failed_naming(cluster, job, victim, since_ms, timeout_s)
        return "failed"
    return "continued"


@pytest.mark.parametrize("victim", [2, 0])
def test_a_partition_in_the_middle_of_a_collective_fails_every_node_naming_the_cut_off_one(victim):
    with simcluster.SimCluster(3) as cluster, nodes.GradsyncNodes(cluster) as g:
        job = g.start_job(timeout=TIMEOUT_S)
        running(g, job, 10)
        cut = nodes.now_ms()
        cluster.partition(victim)
        slowest = check_failed_naming(cluster, job, victim, cut)
        print(f"partition of node {victim} of 3: every node failed within {slowest} ms")
        cluster.heal(victim)
        assert_daemons_up(g)
        reform(g, f"partition of node {victim}")


def test_a_partition_at_16_nodes_fails_as_fast_as_at_3():
    with simcluster.SimCluster(16) as cluster, nodes.GradsyncNodes(cluster) as g:
        job = g.start_job(timeout=TIMEOUT_S, numel=1 << 12)
        running(g, job, 5)
        cut = nodes.now_ms()
        cluster.partition(5)
        slowest = check_failed_naming(cluster, job, 5, cut)
        print(f"partition of node 5 of 16: every node failed within {slowest} ms")
        cluster.heal(5)
        assert_daemons_up(g)
        reform(g, "partition at 16 nodes")


# Every fault runs at 3 nodes and at 16 (issue 29, item 3). At 16 nodes, 16 daemons and 16
# trainers share the machine's two cores, so the steps are smaller (16 KiB) and the victim is a
# node in the middle of the ranks, not next to the rendezvous.
SHAPES = [pytest.param(3, 1 << 16, id="3 nodes"), pytest.param(16, 1 << 12, id="16 nodes")]


def victim_of(count, at_3):
    return at_3 if count == 3 else 9


@pytest.mark.parametrize("count, numel", SHAPES)
def test_two_percent_packet_loss_for_five_seconds_slows_the_job_and_it_goes_on(count, numel):
    victim = victim_of(count, 1)
    with simcluster.SimCluster(count) as cluster, nodes.GradsyncNodes(cluster) as g:
        job = g.start_job(timeout=TIMEOUT_S * 2, numel=numel)
        running(g, job, 10)
        start = nodes.now_ms()
        before = last_step(job.trainers[0])
        cluster.impair(victim, loss=0.02)
        time.sleep(5)
        during = last_step(job.trainers[0]) - before
        cluster.clear(victim)
        outcome = finished_or_named(cluster, job, victim, start, steps_after=last_step(job.trainers[0]) + 20,
                                    timeout_s=TIMEOUT_S * 2)
        # The issue allows either outcome; a loss of 2% slows the job but does not stop it.
        assert outcome == "failed" or during > 0, f"no step in 5 s of 2% loss:\n{job.describe()}"
        print(f"2% loss on node {victim}'s link of {count} for 5 s: the job {outcome}; {during} steps during the loss")
        g.stop_job(job)
        assert_daemons_up(g)
        reform(g, f"packet loss, {count} nodes")


@pytest.mark.parametrize("count", [3, 16])
def test_two_hundred_ms_of_latency_on_one_link_slows_every_step_and_the_job_goes_on(count):
    victim = victim_of(count, 2)
    # Steps counted after the delay is added, and how long to wait for them: a step took 1.6 s
    # at 3 nodes and 9.2 s at 16 (docs/cluster.md), so 16 nodes wait for fewer, with room.
    steps_wanted, budget_s = (6, 60) if count == 3 else (3, 90)
    with simcluster.SimCluster(count) as cluster, nodes.GradsyncNodes(cluster) as g:
        # 4 KiB at either size: a step is then a few crossings of the slow link, not TCP's slow
        # start at a 400 ms round trip (256 KiB steps took 2.4 s, close to the timeout).
        job = g.start_job(timeout=TIMEOUT_S, numel=1 << 10)
        running(g, job, 10)
        cluster.impair(victim, delay_ms=200)
        start = nodes.now_ms()
        t0 = job.trainers[0]
        assert job.wait_for(lambda: sum(1 for ms, _ in t0.events() if ms > start) >= steps_wanted, budget_s), \
            job.describe()
        steps = [ms for ms, text in t0.events() if ms > start and text.startswith("step")]
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        assert min(gaps) >= 200, gaps  # at least one crossing of the slow link per step
        assert not any(t.first("error") for t in job.trainers), job.describe()
        print(f"200 ms on node {victim}'s link of {count}: steps every {sorted(gaps)[len(gaps) // 2]} ms (median)")
        cluster.clear(victim)
        g.stop_job(job)
        assert_daemons_up(g)
        reform(g, f"latency, {count} nodes")


@pytest.mark.parametrize("down_s", [1.0, 5.0])
@pytest.mark.parametrize("count, numel", SHAPES)
def test_a_link_that_goes_down_and_comes_back(count, numel, down_s):
    """Shorter than the job timeout, the job rides it out; longer, every node fails naming it."""
    victim = victim_of(count, 1)
    with simcluster.SimCluster(count) as cluster, nodes.GradsyncNodes(cluster) as g:
        job = g.start_job(timeout=TIMEOUT_S, numel=numel)
        running(g, job, 10)
        cut = nodes.now_ms()
        cluster.partition(victim)
        time.sleep(down_s)
        cluster.heal(victim)
        healed = nodes.now_ms()
        if down_s >= TIMEOUT_S + PROBE_S:
            slowest = check_failed_naming(cluster, job, victim, cut)
            print(f"node {victim}'s link of {count} down {down_s} s: every node failed within {slowest} ms")
        else:
            outcome = finished_or_named(cluster, job, victim, cut, steps_after=last_step(job.trainers[0]) + 10)
            # A second's outage is shorter than the job timeout: the job rides it out.
            assert outcome == "continued", job.describe()
            print(f"node {victim}'s link of {count} down {down_s} s: the job {outcome} "
                  f"({nodes.now_ms() - healed} ms after the link came back)")
        g.stop_job(job)
        assert_daemons_up(g)
        reform(g, f"link down {down_s} s, {count} nodes")
