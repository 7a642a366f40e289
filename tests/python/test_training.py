"""Training runs: DDP with the gradsync comm hook, and GradBuffer, against DDP on gloo."""
import os
import re
import socket

import pytest
import torch

from conftest import assert_all_ok, run_ranks

STEPS = 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(mode, daemon, tmp_path, device="cpu"):
    out = str(tmp_path / mode)
    results = run_ranks("train.py", 2, daemon, args=(mode, out, STEPS, device), env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    return [torch.load(f"{out}_{r}.pt") for r in range(2)], [o for _, o in results]


def assert_same(got, want):
    for rank in range(2):
        for name, value in want[rank].items():
            torch.testing.assert_close(got[rank][name], value, rtol=1e-6, atol=1e-7, msg=f"rank {rank} {name}")


def staging(outputs, what):
    return [int(re.search(what + r" (\d+)", o).group(1)) for o in outputs]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_ddp_hook_and_grad_buffer_match_ddp_on_gloo(daemon, tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    reference, _ = train("gloo", None, tmp_path, device)
    assert not torch.equal(reference[0]["0.weight"], torch.nn.Linear(16, 32).weight)  # it trained
    assert all(torch.equal(reference[0][k], reference[1][k]) for k in reference[0])  # DDP kept ranks equal

    hooked, outputs = train("hook", daemon, tmp_path, device)
    assert_same(hooked, reference)
    assert all(n > 0 for n in staging(outputs, "staging copies"))  # DDP's buckets are staged

    buffered, outputs = train("gradbuffer", daemon, tmp_path, device)
    assert_same(buffered, reference)
    # The gradients were reduced where autograd wrote them: nothing was staged or copied.
    assert staging(outputs, "staging copies") == [0, 0]
    assert staging(outputs, "buffer copies") == [0, 0]
