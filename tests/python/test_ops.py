"""Every coalesced operation, dtype and scaling mode from Python, against torch's results."""
from conftest import assert_all_ok, run_ranks


def test_every_operation_dtype_and_scaling_mode_matches_torch(daemon):
    results = run_ranks("ops.py", 2, daemon)
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "96 cases" in out, out


def test_three_ranks(daemon):
    results = run_ranks("ops.py", 3, daemon)
    assert_all_ok(results, daemon)
