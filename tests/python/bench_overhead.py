"""The Python layer's cost per tensor marked ready, next to the C++ client's, in the same run
against the same daemon (target: the Python layer adds at most 5 us per tensor).

    GRADSYNCD_BINARY=build/bin/gradsyncd PYTHONPATH=build/python \\
        /usr/bin/python3 tests/python/bench_overhead.py [--tensors 161] [--steps 200] [--bench build/bin/gradsync-mark-ready-bench]

Python: GradBuffer's hook body for each tensor (the gradient check and gs_mark_ready through
ctypes), as backward calls it, without autograd itself. C++: Client::mark_ready. Both: one
trainer, TENSORS float32 tensors of 1024 elements in one flat set, the median over STEPS steps.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Daemon  # noqa: E402


def python_us(socket, tensors, steps):
    import torch

    import gradsync
    import gradsync.torch
    client = gradsync.connect(job="overhead-py-" + uuid.uuid4().hex[:6], rank=0, world_size=1, local_rank=0,
                              local_world_size=1, socket=socket)
    params = [torch.nn.Parameter(torch.zeros(1024)) for _ in range(tensors)]
    buffer = gradsync.torch.GradBuffer(params, client)
    samples = []
    for _ in range(steps):
        buffer._open()
        start = time.perf_counter()
        for i in range(tensors):
            buffer._ready(i)
        samples.append((time.perf_counter() - start) / tensors * 1e6)
        buffer.wait(30)
    client.close()
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=161)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bench", default=os.path.join(HERE, "..", "..", "build", "bin", "gradsync-mark-ready-bench"))
    args = parser.parse_args()
    daemon = Daemon()
    try:
        out = subprocess.run([args.bench, daemon.socket, "overhead-cpp", str(args.tensors), str(args.steps)],
                             check=True, capture_output=True, text=True).stdout
        cpp = float(out.split("cpp_mark_ready_us=")[1].split()[0])
        py = python_us(daemon.socket, args.tensors, args.steps)
    finally:
        daemon.close()
    print(f"| per tensor marked ready ({args.tensors} tensors, median of {args.steps} steps) | Python {py:.2f} us | "
          f"C++ {cpp:.2f} us | Python layer adds {py - cpp:.2f} us (target <= 5 us) |")
    print(f"python_mark_ready_us={py:.3f} cpp_mark_ready_us={cpp:.3f} python_overhead_us={py - cpp:.3f}")


if __name__ == "__main__":
    main()
