"""Error paths a trainer meets, each printing the exception's class and message.
usage: errors.py absent|missing-env|killed-daemon|bad-input|register-after-peer-left"""
import os
import sys
import time

import torch

import gradsync


def report(e):
    print(f"raised {type(e).__name__}: {e}", flush=True)


def main():
    what = sys.argv[1]
    if what == "absent":
        try:
            gradsync.connect(socket="/nonexistent/gradsync.sock")
        except gradsync.Error as e:
            report(e)
    elif what == "missing-env":
        for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                  "GRADSYNC_RENDEZVOUS"):
            os.environ.pop(v, None)
        try:
            gradsync.connect(job="j")
        except gradsync.Error as e:
            report(e)
        try:
            gradsync.connect(job="j", rank=0, world_size=4, local_rank=0, local_world_size=2)
        except gradsync.Error as e:
            report(e)
        os.environ["RANK"] = "zero"
        try:
            gradsync.connect(job="j")
        except gradsync.Error as e:
            report(e)
    elif what == "killed-daemon":
        # Rank 1 never submits, so rank 0's operation waits until the test kills the daemon.
        client = gradsync.connect()
        grads = [torch.ones(1000)]
        client.allreduce_coalesced(grads).wait(60)  # one step together: the set is registered
        if client.rank == 0:
            work = client.allreduce_coalesced(grads)
            print("waiting", flush=True)
            try:
                work.wait()
            except gradsync.Error as e:
                report(e)
            try:
                client.allreduce_coalesced(grads).wait()
            except gradsync.Error as e:
                report(e)
        else:
            print("waiting", flush=True)
            time.sleep(60)
    elif what == "register-after-peer-left":
        # Rank 1 takes one step and exits; rank 0 then registers a set of a new layout in the
        # job that rank 1's leaving failed: that is the lost rank's error, as an operation's is.
        client = gradsync.connect()
        client.allreduce_coalesced([torch.ones(10)]).wait(60)
        if client.rank == 1:
            os._exit(0)  # at once: its connection closes now, not after the interpreter's teardown
        if client.rank == 0:
            time.sleep(1.0)  # rank 1 has gone by now
            try:
                client.allreduce_coalesced([torch.ones(20), torch.ones(3)]).wait(60)
            except gradsync.Error as e:
                report(e)
    elif what == "bad-input":
        client = gradsync.connect()
        cases = [
            lambda: client.allreduce_coalesced([]),
            lambda: client.allreduce_coalesced([torch.ones(3)], op="mean"),
            lambda: client.allreduce_coalesced([torch.ones(3)], op="sum", divisor=2.0),
            lambda: client.allreduce_coalesced([torch.ones(3, dtype=torch.complex64)]),
            lambda: client.allreduce_coalesced([torch.ones(3), torch.ones(3, dtype=torch.float64).to("meta")]),
            lambda: client.broadcast_coalesced([torch.ones(3)], root=5),
            lambda: client.allreduce_coalesced([torch.ones(3)], group="tp"),
            lambda: client.allreduce_coalesced([torch.ones(0)]),
            lambda: client.allreduce_coalesced([torch.ones(3, dtype=torch.int32)], op="avg"),
            lambda: client.alloc(2**64 + 4096),  # ctypes once wrapped it to 4 KiB, and said yes
        ]
        for case in cases:
            try:
                case()
                print("no error")
            except gradsync.Error as e:
                report(e)
        # The client still works after all that.
        t = [torch.full((4,), float(client.rank + 1))]
        client.allreduce_coalesced(t, op="sum").wait(60)
        print("after the errors:", t[0].tolist(), flush=True)


if __name__ == "__main__":
    main()
