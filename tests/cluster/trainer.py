"""A trainer of the simulated cluster's tests: joins a job through its node's gradsyncd and runs
sum-allreduces of one float32 tensor, checking every element of every step exactly.

It prints one line per event, each starting with the CLOCK_MONOTONIC time in milliseconds (one
clock for every namespace of the machine), which the tests read back:
    <ms> joined
    <ms> step <n> ok
    <ms> error <ErrorType>: <text>      (then exits 3)
    <ms> done                           (after --steps steps; exit 0)
--steps 0 runs until an error or SIGTERM. --pace S sleeps S seconds between steps.
"""
import argparse
import sys
import time

import torch

import gradsync


def now_ms():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000)


def say(text):
    print(f"{now_ms()} {text}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--local-world", type=int, default=1)
    p.add_argument("--rendezvous", required=True)
    p.add_argument("--numel", type=int, default=1 << 16)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--pace", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=None, help="the job's timeout in seconds")
    a = p.parse_args()
    try:
        client = gradsync.connect(job=a.job, rank=a.rank, world_size=a.world, local_rank=a.local_rank,
                                  local_world_size=a.local_world, rendezvous=a.rendezvous, socket=a.socket,
                                  timeout=a.timeout)
        say("joined")
        t = torch.empty(a.numel, dtype=torch.float32)
        step = 0
        while a.steps == 0 or step < a.steps:
            # Rank r holds r + 1 + step: small integers, so the sum is exact in float32.
            t.fill_(a.rank + 1 + step % 7)
            client.allreduce_coalesced([t], op="sum").wait()
            want = float(sum(r + 1 + step % 7 for r in range(a.world)))
            if not bool((t == want).all()):
                bad = (t != want).nonzero()[0].item()
                say(f"error WrongResult: step {step}: element {bad} is {t[bad].item()}, not {want}")
                sys.exit(4)
            say(f"step {step} ok")
            step += 1
            if a.pace:
                time.sleep(a.pace)
        say("done")
    except gradsync.Error as e:
        say(f"error {type(e).__name__}: {' '.join(str(e).split())}")
        sys.exit(3)


if __name__ == "__main__":
    main()
