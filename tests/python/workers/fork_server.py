"""A fork server for tests that start many short-lived trainers (test_killed_rank.py): imports
torch, torch.distributed and gradsync.torch once, then forks one trainer process per request,
so that each costs neither an interpreter start nor a torch import (some 1.7 s of CPU each).

Requests on stdin, a JSON object a line: {"script": PATH, "argv": [...], "env": {...}, "out": PATH}.
Replies on stdout, a line each: "started PID" for every request, and "exited PID CODE" as each
child ends (CODE: its exit code, or -SIGNAL). A child runs the script as __main__ with exactly
`env` as its environment, its stdout and stderr in the file `out`, and ends through the
interpreter's ordinary exit, as a trainer does: an uncaught exception is printed and exits 1.
The server exits once stdin is closed and its children have ended. Single-threaded, so that
forking is safe: it reaps its children between requests."""
import json
import os
import runpy
import select
import sys

import torch  # noqa: F401 (imported once, here)
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401

import gradsync.torch  # noqa: F401


def _child(request):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["script"], *request["argv"]]
    sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
    runpy.run_path(request["script"], run_name="__main__")
    sys.exit(0)


def main():
    children = set()
    reading = True
    while reading or children:
        ready, _, _ = select.select([sys.stdin] if reading else [], [], [], 0.01)
        if ready:
            line = sys.stdin.readline()
            if not line:
                reading = False
            elif line.strip():
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request)  # never returns: the child ends in the interpreter's exit
                children.add(pid)
                print(f"started {pid}", flush=True)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            print(f"exited {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main()
