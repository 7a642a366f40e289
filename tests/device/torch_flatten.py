"""The peer for the coalescing kernels: torch's _flatten_dense_tensors, then
_unflatten_dense_tensors and the copy back into the gradients, as the seeds do it, on the
same 161 ResNet-50 tensors (element counts on stdin, one per line). Prints the median time
per flatten+unflatten+copy, measured with CUDA events."""
import statistics
import sys

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def main() -> int:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    numels = [int(line) for line in sys.stdin if line.strip()]
    grads = [torch.full((n,), 1.5, device="cuda", dtype=torch.float32) for n in numels]

    def step():
        flat = _flatten_dense_tensors(grads)
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)

    for _ in range(3):
        step()
    samples = []
    for _ in range(iterations):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    print(f"raw: torch-flatten tensors={len(numels)} median_ms={statistics.median(samples):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
