"""The benchmark's supervisor (tests/bench/supervise.cc), against the real gradsync-bench:
a stop signal to the bench ends every process it started, and the bench dies of that signal.

    python3 supervise_test.py BENCH SIGNAL   (SIGNAL: INT, QUIT, HUP, TERM or KILL)

Exits 0 when, after SIGNAL reached the bench while its daemons ran, the bench died of SIGNAL
(not a plain exit status) and nothing of its process group was left within 10 seconds. With
KILL the supervisor can forward nothing: the bench's own group must stop itself.
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import time


def processes():
    """(pid, comm, state, parent, process group) of every process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text.split("(", 1)[1].rsplit(")", 1)[0]
        fields = text.rsplit(")", 1)[1].split()
        yield int(entry), comm, fields[0], int(fields[1]), int(fields[2])


def group_members(pgid):
    return [p for p, _, state, _, group in processes() if group == pgid and state != "Z"]


def scratch_dirs():
    """The supervisors' private folders (tests/bench/supervise.cc) now in /tmp."""
    return set(glob.glob("/tmp/gradsync-bench-*"))


def main():
    bench, name = sys.argv[1], sys.argv[2]
    signo = getattr(signal, "SIG" + name)
    before = scratch_dirs()  # the bench tests run alone (RUN_SERIAL): no other bench makes one
    proc = subprocess.Popen([bench, "--only", "2x2", "--steps", "200", "--skip-peer", "--idle-seconds", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    group = None
    try:
        # The bench proper is the supervisor's child and leads its own group; wait for its daemons.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and group is None:
            time.sleep(0.1)
            children = [p for p, _, _, parent, _ in processes() if parent == proc.pid]
            if children and any(comm == "gradsyncd" and g == children[0] for _, comm, _, _, g in processes()):
                group = children[0]
        if group is None:
            sys.exit("no daemon of the bench appeared in 30 s")
        time.sleep(1)
        os.kill(proc.pid, signo)
        status = proc.wait(timeout=30)
        started = time.monotonic()
        left = group_members(group)
        for _ in range(100):
            if not left:
                break
            time.sleep(0.1)
            left = group_members(group)
        emptied = time.monotonic() - started
        # The supervisor removes its private folder; a supervisor killed outright cannot.
        new = sorted(scratch_dirs() - before)
        files_ok = signo == signal.SIGKILL or not new
        print(f"bench ended with {status} (want {-signo}); left in its group: {left} "
              f"(empty after {emptied:.1f} s); new scratch folders left: {new}")
        sys.exit(0 if status == -signo and not left and files_ok else 1)
    finally:
        # Whatever happened, nothing of this test outlives it.
        if proc.poll() is None:
            proc.kill()
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for d in scratch_dirs() - before:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
