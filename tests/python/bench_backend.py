"""The torch.distributed backend "gradsync" beside the gloo backend and the gradsync client's own
calls, two trainer processes on this machine, one run (issue 28's targets: a 4 KiB all_reduce
through the backend at most 1.5x the client's own 4 KiB round trip + 10 us; a 100 MiB one
within 1.2x of the client's coalesced call, the DDP hook's path).

    GRADSYNCD_BINARY=build/bin/gradsyncd PYTHONPATH=build/python \\
        /usr/bin/python3 tests/python/bench_backend.py [--small 500] [--large 10]
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Daemon, assert_all_ok, free_port, run_ranks  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=500, help="repeats of the 4 KiB all_reduce")
    parser.add_argument("--large", type=int, default=10, help="repeats of the 100 MiB all_reduce")
    args = parser.parse_args()
    port = free_port()
    daemon = Daemon()
    try:
        results = run_ranks("bench_backend.py", 2, daemon, args=(args.small, args.large), timeout=600,
                            env={"TEST_PORT": str(port)})
        assert_all_ok(results, daemon)
    finally:
        daemon.close()
    line = next(l for l in results[0][1].splitlines() if l.startswith("bench_backend:"))
    v = {k: float(x) for k, x in re.findall(r"(\w+)=([0-9.]+)", line)}
    # Backend and client calls alternate, call by call; the ratios are medians of per-pair ratios.
    small_target = 1.5 * v["client_4k_us"] + 10
    print("| measurement (2 ranks, one machine) | backend | gloo backend | gradsync client | target |")
    print("|---|---|---|---|---|")
    print(f"| 4 KiB all_reduce, median | {v['backend_4k_us']:.1f} us | {v['gloo_4k_us']:.1f} us | "
          f"{v['client_4k_us']:.1f} us | <= {small_target:.1f} us (1.5x client + 10 us): "
          f"{'met' if v['backend_4k_us'] <= small_target else 'MISSED'} (pairs: backend / client "
          f"{v['ratio_4k']:.2f}x) |")
    print(f"| 100 MiB all_reduce, median | {v['backend_100m_ms']:.2f} ms | {v['gloo_100m_ms']:.2f} ms | "
          f"{v['client_100m_ms']:.2f} ms | <= 1.2x client: "
          f"{'met' if v['ratio_100m'] <= 1.2 else 'MISSED'} (pairs: {v['ratio_100m']:.2f}x) |")
    print(f"| per-call Python overhead (backend - client, 4 KiB) | {v['backend_4k_us'] - v['client_4k_us']:.1f} us | | | |")


if __name__ == "__main__":
    main()
