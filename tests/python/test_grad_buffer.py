"""GradBuffer's edge cases, lifetimes past Client.close(), in-flight gathers, sync_params."""
import torch

from conftest import assert_all_ok, run_ranks
from training_check import expected_hook_path


def test_grad_buffer_edge_cases(daemon):
    results = run_ranks("grad_buffer_cases.py", 2, daemon)
    assert_all_ok(results, daemon)
    for case in ("twice", "no_sync", "main_grad", "unused", "set_to_none", "timeout", "no_grad", "rebuilt"):
        assert all(f"ok {case}" in out for _, out in results), (case, results)
    assert all(f"hook path {expected_hook_path()}\n" in out for _, out in results), (torch.__version__, results)


def test_tensors_and_works_outlive_close(daemon):
    results = run_ranks("lifetime.py", 1, daemon)
    assert_all_ok(results, daemon)
    assert "ok lifetime" in results[0][1]


def test_gathers_in_flight_and_sync_params(daemon):
    results = run_ranks("misc.py", 2, daemon)
    assert_all_ok(results, daemon)
    assert all("ok all_gather in flight" in o and "ok sync_params" in o for _, o in results), results
