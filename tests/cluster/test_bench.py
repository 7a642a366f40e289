"""The cross-node bench rows (bench_cluster.py) run end to end on a short shape: both rows at
one rate, gradsync and Gloo alone each measured, the bytes each node sent read from its link.
Their numbers belong to the bench (docs/cluster.md), not to this test."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the simulated cluster needs root")


def test_a_short_run_measures_both_rows_beside_gloo_alone(tmp_path):
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, os.path.join(HERE, "bench_cluster.py"), "--rates", "2gbit", "--repeat", "1",
                          "--steps", "2", "--mib", "8", "--slice-mib", "4", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())
    assert [(r["nodes"], r["per_node"]) for r in rows] == [(2, 2), (4, 1)], rows
    for r in rows:
        assert len(r["gradsync_ms"]) == 2 and len(r["gloo_ms"]) == 2, r
        # Each node sends about what a ring allreduce must: 2 (n - 1) / n of the buffer.
        ring = 2 * (r["nodes"] - 1) / r["nodes"] * 8
        assert 0.9 * ring < r["sent_mib_per_step"][0] < 1.3 * ring, r
        assert 0.9 * ring < r["sent_mib_per_step"][1] < 1.3 * ring, r
    print(run.stdout)
