"""The Prometheus exposition, read by an independent parser (prometheus_client, Debian's
python3-prometheus-client): every family parses, names follow Prometheus' conventions, the
daemon-wide counters survive the end of the job they count, every histogram `gradsyncctl stats`
shows is exported, and the standard process_* metrics are there."""
import os
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import Daemon, assert_all_ok, run_ranks

parser = pytest.importorskip("prometheus_client.parser")

BIN = os.path.dirname(os.environ.get("GRADSYNCD_BINARY", ""))


def metrics_port(daemon):
    """The port a daemon started with --metrics 127.0.0.1:0 logged."""
    for _ in range(200):
        match = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", daemon.log())
        if match:
            return int(match.group(1))
        time.sleep(0.02)
    raise AssertionError("no metrics port in the daemon's log:\n" + daemon.log())


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(families_, name, labels=None):
    for family in families_.values():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return sample.value
    raise KeyError(name)


def test_exposition_parses_and_daemon_counters_survive_the_job():
    daemon = Daemon("--metrics", "127.0.0.1:0")
    try:
        port = metrics_port(daemon)
        idle = families(scrape(port))
        for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_start_time_seconds", "process_open_fds", "process_max_fds"):
            assert name in idle, sorted(idle)
        assert value(idle, "gradsync_daemon_operations_total") == 0

        # A job that runs and ends: 2 ranks, a few steps.
        demo = subprocess.run([os.path.join(BIN, "gradsync-demo"), "--socket", daemon.socket, "--clients", "2",
                               "--steps", "3", "--model", "tiny"], capture_output=True, text=True, timeout=120)
        assert "verified" in demo.stdout, demo.stdout + demo.stderr
        for _ in range(500):  # the job is removed once its ranks have gone (up to 10 s on a busy machine)
            after = families(scrape(port))
            if value(after, "gradsync_jobs") == 0 and value(after, "gradsync_jobs_ended_total", {"how": "clean"}) >= 1:
                break
            time.sleep(0.02)
        assert value(after, "gradsync_jobs") == 0
        # Per-job series go with the job; the daemon's own stay.
        assert value(after, "gradsync_daemon_operations_total") >= 3
        assert value(after, "gradsync_daemon_reduced_bytes_total") > 0
        # A demo whose ranks leave right after their last completion ended cleanly: the daemon
        # counts an operation done before it tells the clients (Worker::complete).
        ended = {how: value(after, "gradsync_jobs_ended_total", {"how": how}) for how in ("clean", "failed")}
        assert ended == {"clean": 1, "failed": 0}, (ended, daemon.log())

        # Conventions: snake_case with the gradsync_ (or process_) prefix; counters end in _total
        # (the parser strips it from the family name and keeps it on the sample); units in the
        # name are base units (seconds, bytes).
        for name, family in after.items():
            assert re.fullmatch(r"(gradsync|process)_[a-z0-9_]+", name), name
            assert not re.search(r"(milli|micro|nano)seconds|_ms$|_us$|kib|mib|_kb$", name), name
            if family.type == "counter":
                assert all(s.name.endswith("_total") or s.name.endswith("_created") for s in family.samples), name
            if family.type == "histogram":
                assert name.endswith("_seconds"), name
    finally:
        daemon.close()


def test_every_histogram_stats_shows_is_exported():
    daemon = Daemon("--metrics", "127.0.0.1:0")
    try:
        port = metrics_port(daemon)
        text = scrape(port)
        exported = {f.name for f in parser.text_string_to_metric_families(text) if f.type == "histogram"}
        # The histograms of `gradsyncctl stats` (daemon/job/stats.h JobStatsSnapshot).
        for name in ("gradsync_operation_duration_seconds", "gradsync_bucket_wait_for_ranks_seconds",
                     "gradsync_bucket_execution_seconds", "gradsync_bucket_wait_for_peers_seconds",
                     "gradsync_bucket_local_reduction_seconds", "gradsync_bucket_collective_seconds",
                     "gradsync_readiness_lag_seconds"):
            assert name in exported, (name, sorted(exported))
    finally:
        daemon.close()
