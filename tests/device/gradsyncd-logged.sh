#!/usr/bin/env bash
# gradsyncd for the device check's test stages: runs the bundle's gradsyncd (it becomes this
# process: same pid, same signals) with everything it writes also copied, as it is written, to
# $GRADSYNC_DEVICE_DAEMON_LOGS/gradsyncd-HHMMSS-PID.log. The tests' harnesses (C++ TestDaemon,
# Python harness.Daemon) give each daemon a log of their own and delete it with the daemon's
# folder; the copy stays, also when the stage is killed at its budget. run.sh points
# GRADSYNCD_BINARY here and sets both variables below.
set -uo pipefail
real=${GRADSYNC_DEVICE_REAL_GRADSYNCD:?the real gradsyncd, set by run.sh}
dir=${GRADSYNC_DEVICE_DAEMON_LOGS:?the folder for the logs, set by run.sh}
printf -v log '%s/gradsyncd-%(%H%M%S)T-%s.log' "$dir" -1 "$$"
printf '# %s %s\n' "$real" "$*" >>"$log" 2>/dev/null || exec "$real" "$@"  # no copy rather than no daemon
# The harness's own log (this process's stdout/stderr) still gets every line, through tee.
exec > >(exec tee -a "$log") 2>&1
exec "$real" "$@"
