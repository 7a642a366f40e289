"""A pytest hook the test folders share (their conftest.py imports it)."""
import os


def pytest_sessionfinish(session, exitstatus):
    """GRADSYNC_ALL_SKIPPED_CODE=77: a run in which every test was skipped (the CUDA tests without a
    device) exits 77, which CTest reports as skipped rather than passed."""
    code = os.environ.get("GRADSYNC_ALL_SKIPPED_CODE")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if code and exitstatus == 0 and reporter is not None:
        stats = reporter.stats
        if stats.get("skipped") and not stats.get("passed") and not stats.get("failed"):
            session.exitstatus = int(code)
