"""The benchmark's supervisor (tests/bench/supervise.cc), against the real gradsync-bench:
a stop signal to the bench ends every process it started, and the bench dies of that signal.

    python3 supervise_test.py BENCH SIGNAL   (SIGNAL: INT, QUIT, HUP, TERM or KILL)

Exits 0 when, after SIGNAL reached the bench while its daemons ran, the bench died of SIGNAL
(not a plain exit status) and nothing of its process group was left within 10 seconds. With
KILL the supervisor can forward nothing: the bench's own group must stop itself.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


def main():
    bench, name = sys.argv[1], sys.argv[2]
    signo = getattr(signal, "SIG" + name)
    # A temporary directory of its own: what the bench's group leaves there is seen.
    tmpdir = tempfile.mkdtemp(prefix="gradsync-supervise-test-")
    proc = subprocess.Popen([bench, "--only", "2x2", "--steps", "200", "--skip-peer", "--idle-seconds", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TMPDIR=tmpdir))
    # The bench proper is the supervisor's child and leads its own group; wait for its daemons.
    deadline = time.monotonic() + 30
    group = None
    while time.monotonic() < deadline and group is None:
        time.sleep(0.1)
        children = [p for p, _, _, parent, _ in processes() if parent == proc.pid]
        if children and any(comm == "gradsyncd" and g == children[0] for _, comm, _, _, g in processes()):
            group = children[0]
    if group is None:
        proc.kill()
        sys.exit("no daemon of the bench appeared in 30 s")
    time.sleep(1)
    os.kill(proc.pid, signo)
    status = proc.wait(timeout=30)
    left = group_members(group)
    for _ in range(100):
        if not left:
            break
        time.sleep(0.1)
        left = group_members(group)
    # The supervisor removes its private directory; a supervisor killed outright cannot.
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmpdir) for f in fs] + os.listdir(tmpdir)
    shutil.rmtree(tmpdir, ignore_errors=True)
    files_ok = signo == signal.SIGKILL or not files
    print(f"bench ended with {status} (want {-signo}); left in its group: {left}; left in TMPDIR: {files}")
    sys.exit(0 if status == -signo and not left and files_ok else 1)


if __name__ == "__main__":
    main()
