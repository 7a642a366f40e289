"""The package itself: pip install from the build tree, torch imported only by gradsync.torch,
the error classes, and the set cache."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import assert_all_ok, run_ranks

BUILD_PYTHON = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]


def test_pip_install_from_the_build_tree(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(BUILD_PYTHON, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADSYNC_LIBRARY")}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", "import sys, gradsync, gradsync._lib as l; l.lib(); "
                          "print(gradsync.__file__); print(l.lib()._name); print('torch' in sys.modules); "
                          "import importlib.metadata as m; print(gradsync.__version__); print(m.version('gradsync'))"],
                         env=env, check=True, capture_output=True, text=True, cwd=str(tmp_path)).stdout.split()
    assert out[0].startswith(str(target)), out
    assert out[1] == str(target / "gradsync" / "libgradsync_client.so"), out
    assert out[2] == "False", "import gradsync imported torch"
    # The package is versioned as the daemon it was built with ("gradsyncd 0.2.4 (protocol N)").
    daemon_version = subprocess.run([os.environ["GRADSYNCD_BINARY"], "--version"], check=True, capture_output=True,
                                    text=True).stdout.split()[1]
    assert out[3] == daemon_version and out[4] == daemon_version, (out, daemon_version)


def test_error_classes():
    import builtins

    import gradsync
    from gradsync.errors import error_for
    assert issubclass(gradsync.TimeoutError, builtins.TimeoutError)
    assert issubclass(gradsync.PermissionDeniedError, PermissionError)
    e = error_for(3, "job j: set 0 layout mismatch")
    assert isinstance(e, gradsync.LayoutMismatchError) and isinstance(e, gradsync.Error) and str(e).startswith("job j")
    unknown = error_for(99, "new code")
    assert type(unknown) is gradsync.Error and unknown.code == 99


def test_library_not_found_is_named(tmp_path):
    env = dict(os.environ, GRADSYNC_LIBRARY=str(tmp_path / "missing.so"))
    run = subprocess.run([sys.executable, "-c", "import gradsync; gradsync.connect(job='j', rank=0, world_size=1, "
                          "local_rank=0, local_world_size=1)"], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "cannot load libgradsync_client.so" in run.stderr and "missing.so" in run.stderr, run.stderr


def test_sets_are_reused_for_the_same_tensors_and_registered_for_new_ones(daemon):
    results = run_ranks("sets.py", 2, daemon)
    assert_all_ok(results, daemon)
