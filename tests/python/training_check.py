"""The training comparison: DDP with the gradsync comm hook, and GradBuffer, each against DDP on
gloo, two trainer processes, STEPS steps of a small model; then the torch.distributed backend's
checks under this torch (with --cuda, on GPU 0's tensors). Used by test_training.py (compare() only: test_backend.py
runs the backend's) and, with --cpu and --cuda (two processes sharing GPU 0), by the device check, which has
no pytest:

    GRADSYNCD_BINARY=... PYTHONPATH=.../python python3 training_check.py --cuda
"""
import os
import re
import sys
import tempfile
import time

import torch

from harness import Daemon, assert_all_ok, free_port, run_ranks

STEPS = 60


def _train(mode, daemon, out_dir, device):
    out = os.path.join(out_dir, mode)
    started = time.monotonic()
    results = run_ranks("train.py", 2, daemon, args=(mode, out, STEPS, device), env={"TEST_PORT": str(free_port())})
    # As each training ends, so that a run cut at its budget (the device check) shows how far it got.
    print(f"training {mode} on {device}: ranks ended in {time.monotonic() - started:.1f} s", flush=True)
    assert_all_ok(results, daemon)
    return [torch.load(f"{out}_{r}.pt") for r in range(2)], [o for _, o in results]


def _assert_same(got, want, what):
    for rank in range(2):
        for name, value in want[rank].items():
            torch.testing.assert_close(got[rank][name], value, rtol=1e-6, atol=1e-7, msg=f"{what}: rank {rank} {name}")


def expected_hook_path():
    """GradBuffer's hook on this torch: post-accumulate-grad from PyTorch 2.1 on, else the
    grad-accumulator hook (Debian's torch 1.13 in CI takes only this one)."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return "post-accumulate-grad" if (major, minor) >= (2, 1) else "grad-accumulator"


def _counter(outputs, what):
    return [int(re.search(what + r" (\d+)", o).group(1)) for o in outputs]


def compare(daemon, out_dir, device="cpu"):
    """Runs the three trainings and checks them; returns a line of what it saw."""
    reference, _ = _train("gloo", None, out_dir, device)
    untrained = torch.nn.Linear(16, 32)
    assert not torch.equal(reference[0]["0.weight"], untrained.weight.detach())  # it trained
    assert all(torch.equal(reference[0][k], reference[1][k]) for k in reference[0])  # DDP kept the ranks equal

    hooked, outputs = _train("hook", daemon, out_dir, device)
    _assert_same(hooked, reference, "DDP with allreduce_hook")
    hook_copies = _counter(outputs, "staging copies")
    assert all(n > 0 for n in hook_copies)  # DDP's own buckets are staged

    buffered, outputs = _train("gradbuffer", daemon, out_dir, device)
    _assert_same(buffered, reference, "GradBuffer")
    # The gradients were reduced where autograd wrote them: nothing was staged or copied.
    assert _counter(outputs, "staging copies") == [0, 0], outputs
    assert _counter(outputs, "buffer copies") == [0, 0], outputs
    path = expected_hook_path()
    assert all(f"hook path {path}" in o for o in outputs), (torch.__version__, outputs)
    return (f"{device}: DDP hook and GradBuffer equal DDP on gloo after {STEPS} steps (rtol 1e-6); staging copies "
            f"hook {hook_copies}, GradBuffer 0; torch {torch.__version__}, {path} hooks")


def sparse_on_gpu(daemon):
    """--cuda only: sparse COO gradients on the GPU (workers/sparse.py cuda): every dtype, op and
    result against torch's sum on the CPU, and an nn.Embedding(sparse=True) model under DDP with
    the gradsync hook against DDP on gloo. CI's tests run the same worker on the CPU."""
    started = time.monotonic()
    results = run_ranks("sparse.py", 2, daemon, args=("cuda",), env={"TEST_PORT": str(free_port())})
    assert_all_ok(results, daemon)
    cases = re.search(r"(\d+) cases on cuda", results[0][1]).group(1)
    return f"cuda: sparse gradients, {cases} cases and an embedding under DDP, equal torch and DDP on gloo " \
           f"({time.monotonic() - started:.1f} s)"


def backend_on_this_torch(device):
    """The torch.distributed backend under this machine's torch (CI has 1.13 only): every
    offered collective and DDP with no hook against gloo (workers/backend.py); on the CPU also
    an async Work and DDP's backward when a rank dies (workers/backend_errors.py), and FSDP
    against DDP on gloo where this torch has FSDP on the CPU (workers/backend_fsdp.py); on CUDA the
    collectives on GPU 0's tensors and the stream rule. Each run has a daemon of its own (the
    last CPU one's job fails)."""
    started, seen = time.monotonic(), []
    runs = (("backend.py", ()), ("backend_errors.py", ("async",)), ("backend_errors.py", ("ddp-killed-peer",)),
            ("backend_fsdp.py", ())) if device == "cpu" else (("backend.py", ("--cuda",)),)
    for script, args in runs:
        daemon = Daemon()
        try:
            results = run_ranks(script, 2, daemon, args=args, env={"TEST_PORT": str(free_port())})
            assert_all_ok(results, daemon)
        finally:
            daemon.close()
        skipped = [line for line in results[0][1].splitlines() if "not on this torch" in line]
        seen.append(" ".join((script,) + args) + (f" ({skipped[0]})" if skipped else ""))
        print(f"backend: {seen[-1]} passed at {time.monotonic() - started:.1f} s", flush=True)
    return f"{device}: init_process_group('gradsync') on torch {torch.__version__}: {', '.join(seen)} passed"


def main():
    device = "cuda" if "--cuda" in sys.argv else "cpu"  # --cpu (the default) or --cuda
    daemon = Daemon()
    try:
        with tempfile.TemporaryDirectory(prefix="gradsync-train-") as scratch:
            print("training:", compare(daemon, scratch, device), flush=True)
        if device == "cuda":
            print("sparse:", sparse_on_gpu(daemon), flush=True)
    finally:
        daemon.close()
    print("backend:", backend_on_this_torch(device), flush=True)


if __name__ == "__main__":
    main()
