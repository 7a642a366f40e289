"""Training runs: DDP with the gradsync comm hook, and GradBuffer, against DDP on gloo
(training_check.py). The CUDA variant (2 processes sharing one GPU) is skipped without a device."""
import pytest
import torch

import training_check


def test_ddp_hook_and_grad_buffer_match_ddp_on_gloo(daemon, tmp_path):
    training_check.compare(daemon, str(tmp_path), "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_one_gpu_shared_by_two_processes(daemon, tmp_path):
    training_check.compare(daemon, str(tmp_path), "cuda")
