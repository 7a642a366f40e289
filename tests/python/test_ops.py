"""Every coalesced operation, dtype and scaling mode from Python, against torch's results."""
from conftest import assert_all_ok, run_ranks
from harness import free_port


def test_every_operation_dtype_and_scaling_mode_matches_torch(daemon):
    results = run_ranks("ops.py", 2, daemon)
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "96 cases" in out, out


def test_three_ranks(daemon):
    results = run_ranks("ops.py", 3, daemon)
    assert_all_ok(results, daemon)


def test_reduce_scatter_every_dtype_and_mode_matches_torch(daemon):
    results = run_ranks("reduce_scatter.py", 2, daemon)
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "66 cases" in out, out


def test_reduce_scatter_three_ranks_with_uneven_shards(daemon):
    # SIZES total 1041 elements: shards of 347 over 3 ranks, 521 and 520 over 2.
    assert_all_ok(run_ranks("reduce_scatter.py", 3, daemon), daemon)


def test_fused_health_and_master_params(daemon):
    results = run_ranks("health.py", 2, daemon)
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "40 cases" in out and "skipped 1" in out, out


def test_fused_health_three_ranks(daemon):
    assert_all_ok(run_ranks("health.py", 3, daemon), daemon)


def test_masked_allreduce_and_reduce_every_dtype_and_mode_match_torch(daemon):
    results = run_ranks("masked.py", 2, daemon)
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "72 cases" in out, out


def test_masked_three_ranks(daemon):
    assert_all_ok(run_ranks("masked.py", 3, daemon), daemon)


def test_sparse_gradients_match_torch_and_ddp_on_gloo(daemon):
    results = run_ranks("sparse.py", 2, daemon, env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    for code, out in results:
        assert "16 cases" in out, out


def test_sparse_gradients_three_ranks(daemon):
    assert_all_ok(run_ranks("sparse.py", 3, daemon, env={"TEST_PORT": str(free_port())}), daemon)
