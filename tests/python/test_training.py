"""Training runs: DDP with the gradsync comm hook, and GradBuffer, against DDP on gloo
(training_check.py). The CUDA variant (2 processes sharing one GPU) is skipped without a device."""
import pytest
import torch

import training_check
from conftest import assert_all_ok, run_ranks


def test_ddp_hook_and_grad_buffer_match_ddp_on_gloo(daemon, tmp_path):
    training_check.compare(daemon, str(tmp_path), "cpu")


def test_a_hook_futures_callback_that_waits_for_a_later_buckets_future_finishes(daemon):
    """allreduce_hook's futures complete on callback threads (workers/hook_callbacks.py): before,
    one waiter thread ran each callback inline and a callback waiting for a later bucket hung."""
    assert_all_ok(run_ranks("hook_callbacks.py", 2, daemon), daemon)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_one_gpu_shared_by_two_processes(daemon, tmp_path):
    training_check.compare(daemon, str(tmp_path), "cuda")
