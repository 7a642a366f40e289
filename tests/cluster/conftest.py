"""The simulated cluster's tests: run by CTest from this folder (tests/CMakeLists.txt)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from all_skipped import pytest_sessionfinish  # noqa: E402,F401 (a hook: pytest finds it here)
