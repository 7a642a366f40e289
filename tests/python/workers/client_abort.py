"""gradsync.Client.abort (gs_client_abort) from another thread, one scenario per run (argv[1]):

  race        one rank, a job of its own per round: a thread keeps calling allreduce_coalesced
              and waiting while the main thread aborts the client at a random moment; the
              thread must get gradsync.AbortedError naming the reason (never a crash, never
              "closed"), 30 rounds
  after-close two ranks: rank 0 starts an allreduce rank 1 is late to, closes the client (the
              work still holds the connection), then aborts: the wait raises AbortedError at
              once, and rank 1's allreduce fails with PeerLostError naming rank 0
"""
import os
import random
import sys
import threading
import time

import torch

import gradsync
import gradsync.torch  # noqa: F401 (the coalesced operations)
from ops import exit_on_failures

failures = []


def race():
    x = torch.ones(4)
    for trial in range(30):
        client = gradsync.connect(job=f"abort-race-{os.getpid()}-{trial}", rank=0, world_size=1, local_rank=0,
                                  local_world_size=1)
        seen = []

        def user(client=client, seen=seen):
            while True:
                try:
                    client.allreduce_coalesced([x]).wait()
                except Exception as e:  # noqa: BLE001 (checked below)
                    seen.append(e)
                    return

        thread = threading.Thread(target=user, daemon=True)
        thread.start()
        time.sleep(random.uniform(0.001, 0.01))
        client.abort(f"round {trial}")
        thread.join(5)
        if thread.is_alive():
            failures.append(f"round {trial}: the calling thread did not end within 5 s of the abort")
            break
        e = seen[0]
        if not isinstance(e, gradsync.AbortedError) or f"this client was aborted: round {trial}" not in str(e):
            failures.append(f"round {trial}: the calling thread got {type(e).__name__}: {e}")
        client.close()


def after_close(rank):
    client = gradsync.connect()
    t = torch.ones(4)
    client.allreduce_coalesced([t]).wait()  # the set registered by both ranks
    if rank == 1:
        time.sleep(2.0)
        try:
            client.allreduce_coalesced([t]).wait()
            failures.append("rank 1's allreduce after rank 0's abort completed")
        except gradsync.PeerLostError as e:
            if "rank 0" not in str(e):
                failures.append(f"rank 1's error does not name rank 0: {e}")
        return
    work = client.allreduce_coalesced([t])
    client.close()  # the work still holds the connection: rank 0 is still in the job
    started = time.monotonic()
    client.abort("after close")
    try:
        work.wait()
        failures.append("the work waited on after close() and abort() completed")
    except gradsync.AbortedError as e:
        took = time.monotonic() - started
        if "after close" not in str(e) or took > 1.5:
            failures.append(f"the wait raised after {took:.2f} s: {e}")
    time.sleep(3.0)  # alive (the work's connection too) until rank 1 has failed: the abort did it


def main():
    scenario = sys.argv[1]
    if scenario == "race":
        race()
    else:
        after_close(int(os.environ["RANK"]))
    print(f"{scenario} done", flush=True)
    exit_on_failures(failures)


if __name__ == "__main__":
    main()
