"""pytest fixtures over harness.py: a real gradsyncd per test."""
import pytest

from all_skipped import pytest_sessionfinish  # noqa: F401 (a hook: pytest finds it here)
from harness import Daemon, HERE, assert_all_ok, run_ranks  # noqa: F401 (the tests import them from here)


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.close()


