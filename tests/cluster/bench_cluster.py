"""Cross-node rows on the simulated cluster: gradsync beside Gloo alone between the same
namespaces over the same shaped links, in the same run.

    bench_cluster.py [--rates 10gbit,25gbit] [--steps 10] [--repeat 3] [--slice-mib 64] [--json FILE]

Rows: 2 nodes x 2 clients x 100 MiB float32, and 4 nodes x 1 client x 100 MiB, at each rate.
gradsync is a gradsyncd per node namespace and the bench's C++ trainers (gradsync-bench --role
trainer: rank 0 prints a sample per timed step, each after a barrier); Gloo alone is
gradsync-bench --role gloo-floor in the same namespaces (one process per node, the same slices
and algorithm as the daemons' Gloo engine, no local stages). Reported per row: medians with
min-max, the ratio, the bytes each node sent on its link (its eth0 counters), and node 0's
per-stage times from its metrics (local reduction, collective, waiting for peers).
Needs root (tests/cluster/simcluster.py). Each node is pinned to one core, dealt in turn: on a
2-core machine 4 nodes share them two by two.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import nodes as gsnodes  # noqa: E402
import simcluster  # noqa: E402

BENCH = os.path.join(gsnodes.BUILD, "bin", "gradsync-bench")
MIB = 1 << 20
METRICS_PORT = 29591
STAGES = ("local_reduction", "collective", "wait_for_peers")


def median_spread(samples):
    return f"{statistics.median(samples):.1f} ({min(samples):.1f}-{max(samples):.1f})"


def sent(cluster):
    return [cluster.link_bytes(k)["tx_bytes"] for k in range(len(cluster.nodes))]


def stage_means(cluster):
    """Node 0's mean seconds per bucket in each stage, from its metrics (None when not there)."""
    out = subprocess.run(cluster.command(0, ["curl", "-s", f"http://127.0.0.1:{METRICS_PORT}/metrics"]),
                         capture_output=True, text=True).stdout
    means = {}
    for stage in STAGES:
        total = re.search(rf"^gradsync_bucket_{stage}_seconds_sum\{{[^}}]*\}} (\S+)$", out, re.M)
        count = re.search(rf"^gradsync_bucket_{stage}_seconds_count\{{[^}}]*\}} (\S+)$", out, re.M)
        if total and count and float(count.group(1)) > 0:
            means[stage] = float(total.group(1)) / float(count.group(1))
    return means or None


def run_gradsync(cluster, per_node, nbytes, steps, slice_bytes):
    """ms per step (rank 0's samples), bytes sent per node, node 0's per-stage means."""
    count = len(cluster.nodes)
    args = ["--metrics", f"127.0.0.1:{METRICS_PORT}", "--gloo-slice-bytes", str(slice_bytes)]
    with gsnodes.GradsyncNodes(cluster, args) as g:
        before = sent(cluster)
        job = f"bench-{os.getpid()}-{time.monotonic_ns()}"
        trainers = []
        for k in range(count):
            for local in range(per_node):
                rank = k * per_node + local
                argv = [BENCH, "--role", "trainer", "--socket", g.socket(k), "--job", job, "--rank", str(rank),
                        "--world", str(count * per_node), "--local-rank", str(local), "--local-world",
                        str(per_node), "--layout", f"flat:{nbytes}", "--steps", str(steps), "--warmup", "2",
                        "--rendezvous", g.rendezvous]
                trainers.append(cluster.spawn(k, argv, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, text=True))
        stages = None
        end = time.monotonic() + 600
        while trainers[0].poll() is None and time.monotonic() < end:
            stages = stage_means(cluster) or stages
            time.sleep(0.2)
        out = trainers[0].stdout.read()  # rank 0 prints a line per step: far below a pipe's buffer
        for t in trainers:
            if t.wait(120) != 0:
                raise RuntimeError(f"a gradsync trainer exited {t.returncode}: {t.stderr.read()[-800:]}\n"
                                   f"node 0's log:\n{g.log(0)[-2000:]}")
        samples = [float(line.split()[1]) / 1000 for line in out.splitlines() if line.startswith("sample ")]
        return samples, [a - b for a, b in zip(sent(cluster), before)], stages


def run_gloo(cluster, nbytes, steps, slice_bytes):
    """ms per step of Gloo alone, one process per node, and bytes sent per node."""
    count = len(cluster.nodes)
    store = tempfile.mkdtemp(prefix="gradsync-gloo-store-")
    try:
        before = sent(cluster)
        ranks = [cluster.spawn(k, [BENCH, "--role", "gloo-floor", "--store", store, "--rank", str(k), "--size",
                                   str(count), "--bytes", str(nbytes), "--steps", str(steps), "--slice-bytes",
                                   str(slice_bytes), "--gloo-host",
                                   cluster.nodes[k].ip],
                               stdout=subprocess.PIPE if k == 0 else subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
                 for k in range(count)]
        out = ranks[0].stdout.read()
        for r in ranks:
            if r.wait(300) != 0:
                raise RuntimeError(f"a Gloo rank exited {r.returncode}: {r.stderr.read()[-800:]}")
        samples = [float(line.split()[1]) for line in out.splitlines() if line.startswith("sample ")]
        return samples, [a - b for a, b in zip(sent(cluster), before)]
    finally:
        shutil.rmtree(store, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="10gbit,25gbit")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="gradsync and Gloo alternate this many times per row")
    p.add_argument("--mib", type=int, default=100)
    p.add_argument("--slice-mib", type=int, default=64, help="the daemons' --gloo-slice-bytes, and Gloo alone's slices")
    p.add_argument("--json")
    a = p.parse_args()
    nbytes = a.mib * MIB
    rows = []
    print(f"{'rate':>7} {'shape':>12}  {'gradsync ms':>22}  {'Gloo alone ms':>22}  {'ratio':>6}  "
          f"{'MiB sent/node (gradsync, Gloo)':>32}  node 0 stages (ms per bucket)", flush=True)
    for rate in a.rates.split(","):
        for count, per_node in ((2, 2), (4, 1)):
            with simcluster.SimCluster(count, rate=rate) as cluster:
                ours, theirs, ours_sent, theirs_sent, stages = [], [], [], [], None
                for _ in range(a.repeat):  # alternated, so that the VM's drift hits both alike
                    s, b, st = run_gradsync(cluster, per_node, nbytes, a.steps, a.slice_mib * MIB)
                    ours += s
                    ours_sent.append(b)
                    stages = st or stages
                    s, b = run_gloo(cluster, nbytes, a.steps, a.slice_mib * MIB)
                    theirs += s
                    theirs_sent.append(b)
            ratio = statistics.median(ours) / statistics.median(theirs)
            mine = statistics.median(max(b) for b in ours_sent) / MIB / (a.steps + 2)
            gloo = statistics.median(max(b) for b in theirs_sent) / MIB / (a.steps + 2)
            stage_text = ", ".join(f"{k} {v * 1000:.1f}" for k, v in (stages or {}).items())
            shape = f"{count}x{per_node} {a.mib}MiB"
            print(f"{rate:>7} {shape:>12}  {median_spread(ours):>22}  {median_spread(theirs):>22}  {ratio:>5.2f}x  "
                  f"{mine:>15.1f} {gloo:>15.1f}  {stage_text}", flush=True)
            rows.append({"rate": rate, "nodes": count, "per_node": per_node, "mib": a.mib, "gradsync_ms": ours,
                         "gloo_ms": theirs, "ratio": ratio, "sent_mib_per_step": [mine, gloo], "stages": stages})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
