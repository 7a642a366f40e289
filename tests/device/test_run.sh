#!/usr/bin/env bash
# run.sh's own tests, on any machine (tests/device/tests.cmake runs them): run.sh against a fake
# bundle (fake_bundle.sh), with a fake nvidia-smi, MPS control and NCCL wheel, so that every
# layer of run.sh runs without a GPU. Each case checks run.sh's exit status, how long it took
# against its bound, table.json (valid JSON, the rows' statuses) and run.log.
#
#   tests/device/test_run.sh CASE WORK_DIR      CASE: pass, hang, bound, trap-stuck, preflight-stops,
#                                                     interrupt
#
# pass             every stage passes (with --mps); the whole table, every daemon's log kept
# hang             the e2e stage hangs: cut at its budget (4 s), the other rows still measured
# bound            a stage hangs without its timeout, as a bug would: the overall bound (30 s:
#                  the stages before it need about 15 s on a loaded 2-core machine)
#                  ends it, and run.sh's trap prints and saves the table within the bound
# trap-stuck       the same, and the trap hangs too: the outer layer kills the main layer at
#                  the bound + 8 s, ends the stage, and prints the last saved table, marked
# preflight-stops  the fake GPU is in EXCLUSIVE_PROCESS mode: run.sh stops after the preflight
# interrupt        SIGTERM to run.sh during a stage that hangs: the stage is ended, and the table
#                  printed and saved, within 10 s
#
# RUN_SH=path tests another run.sh (to see a case fail, e.g. one whose bound is broken).
set -uo pipefail

case_name=${1:?usage: test_run.sh CASE WORK_DIR}
work=${2:?usage: test_run.sh CASE WORK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
bash "$here/fake_bundle.sh" "$work/bundle" >/dev/null || { echo "FAIL: fake_bundle.sh"; exit 1; }
[[ -n "${RUN_SH:-}" ]] && cp "$RUN_SH" "$work/bundle/run.sh"
export PATH="$work/bundle/fakebin:$PATH" PYTHONPATH="$work/bundle/site" OUT="$work/out"
export GRADSYNC_DEVICE_CHECK_BENCH_LOG="$work/daemon-bench.log"
unset GRADSYNC_DEVICE_CHECK_ROLE GRADSYNC_DEVICE_CHECK_BUDGETS GRADSYNC_DEVICE_CHECK_FAKE_STAGE \
      GRADSYNC_DEVICE_CHECK_FAKE_TRAP GRADSYNC_DEVICE_CHECK_BOUND_S
args=("$work/bundle")
bound=480 want_rc=0
case "$case_name" in
  pass) args+=(--mps) ;;
  hang)
    bound=60 want_rc=1
    export GRADSYNC_DEVICE_CHECK_FAKE_STAGE=e2e:hang GRADSYNC_DEVICE_CHECK_BUDGETS=e2e=4 ;;
  bound)
    bound=30 want_rc=124
    export GRADSYNC_DEVICE_CHECK_FAKE_STAGE=python-cpu:hang-untimed ;;
  trap-stuck)
    bound=30 want_rc=124
    export GRADSYNC_DEVICE_CHECK_FAKE_STAGE=python-cpu:hang-untimed GRADSYNC_DEVICE_CHECK_FAKE_TRAP=hang ;;
  preflight-stops)
    want_rc=3
    export FAKE_NVSMI_COMPUTE_MODE=Exclusive_Process ;;
  interrupt)
    want_rc=130
    export GRADSYNC_DEVICE_CHECK_FAKE_STAGE=python-cpu:hang ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
export GRADSYNC_DEVICE_CHECK_BOUND_S=$bound
# run.sh's promise: done within its bound, plus 8 s for its kill grace, plus its clean-up. This
# test allows 6 s more for a slow machine; its own timeout (bound + 60 s) only keeps CTest going.
limit=$((bound + 8 + 6))

start=$(date +%s%N)
if [[ "$case_name" == interrupt ]]; then
  # SIGTERM once the hanging stage has begun; from then on run.sh has 10 s to end.
  bash "$work/bundle/run.sh" "${args[@]}" >"$work/stdout.txt" 2>&1 &
  pid=$!
  # Once the stage's hanging process runs: the main layer is then waiting for it. (A TERM that
  # lands while bash parses one of the table writer's $(...) can break that parse, and the trap
  # with it; the outer layer then prints the last saved table, marked, which is the designed
  # fallback, but not what this case checks. Waiting for the log line alone hit that window on
  # a loaded machine.)
  stage_runs() {
    local f args
    for f in /proc/[0-9]*/cmdline; do
      mapfile -d '' args <"$f" 2>/dev/null || continue
      [[ "${args[*]}" == *"fake-hang:$OUT:python-cpu"* ]] && return 0
    done
    return 1
  }
  for ((i = 0; i < 300; i++)); do grep -q '^== python-cpu' "$OUT/run.log" 2>/dev/null && stage_runs && break; sleep 0.1; done
  sleep 1
  kill -TERM "$pid"
  start=$(date +%s%N) limit=10
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  wait "$pid"
  rc=$?
else
  timeout -k 5 $((bound + 60)) bash "$work/bundle/run.sh" "${args[@]}" >"$work/stdout.txt" 2>&1
  rc=$?
fi
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "run.sh exited $rc after ${elapsed_ms} ms (bound ${bound} s, limit ${limit} s); its output: $work/stdout.txt"

failures=0
check() {  # DESCRIPTION, then a command that must succeed
  local what=$1
  shift
  if "$@"; then echo "ok:   $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
check "exit status $want_rc (got $rc)" test "$rc" -eq "$want_rc"
check "done within ${limit} s (took ${elapsed_ms} ms)" test "$elapsed_ms" -le $((limit * 1000))
check "run.log exists and is not empty" test -s "$OUT/run.log"
check "preflight.txt exists and is not empty" test -s "$OUT/preflight.txt"
check "run.log holds the table" grep -q '^| row | covers | result |' "$OUT/run.log"
check "run.log holds what run.sh printed (its last line)" grep -qF "$(grep . "$work/stdout.txt" | tail -1)" "$OUT/run.log"
check "table.md exists" test -s "$OUT/table.md"
# The device tool returns at most 8 files from $OUT: the summary files and one archive of the rest.
check "\$OUT holds at most 8 files" test "$(find "$OUT" -type f | wc -l)" -le 8
check "the logs are packed into device-out.tar.gz" tar -xzf "$OUT/device-out.tar.gz" -C "$OUT"

# table.json: valid, every row there, and the statuses this case expects (ID=STATUS-PREFIX).
expect=(nc-multi-gpu="not covered" nc-multi-node="not covered")
case "$case_name" in
  pass)
    expect+=(complete=true preflight=passed gpu-tests=passed e2e=passed python-cpu=passed python-cuda=passed
             a-kernels=measured a-torch=measured b-step=measured b-rt=measured c-nomps=measured c-mps=measured
             d-vmm=measured d-nccl-init=measured d-nccl-rejoin=measured d-nccl-split=measured d-legacy=measured)
    check "every daemon's log is kept: e2e" grep -q 'listening' "$OUT"/daemons/e2e/gradsyncd-*.log
    check "every daemon's log is kept: python-cpu" grep -q 'listening' "$OUT"/daemons/python-cpu/gradsyncd-*.log
    check "every daemon's log is kept: the daemon benchmark" grep -q 'import_ms' "$OUT/daemons/daemon-bench/gradsyncd.log"
    check "each stage's whole output is kept" grep -q '^All tests passed' "$OUT/stages/gpu-tests.log"
    check "nvidia-smi -q is kept" test -s "$OUT/nvidia-smi-q.txt"
    check "the CUDA Python check reports its sparse run" grep -qF 'sparse gradients, 16 cases and an embedding under DDP' "$OUT/table.md"
    check "row (b)'s round trip has its floor from the same run" \
      grep -qF 'p50: 2 processes 20.0 us, 1 process 8.0 us; gradsync / 2 processes 1.25x' "$OUT/table.md"
    check "files left in a stage's temporary folder are kept" test -s "$OUT/scratch/python-cuda/gradsync-train-left/rank0.txt"
    check "the MPS control daemon was stopped" grep -q "stage mps-stop: passed" "$OUT/run.log" ;;
  hang)
    expect+=(complete=true preflight=passed gpu-tests=passed "e2e=timed out at its budget of 4 s"
             "d-legacy=missing: stage e2e timed out" a-kernels=measured python-cpu=passed python-cuda=passed
             a-torch=measured b-step=measured d-nccl-init=measured)
    check "the hung stage's row was printed as soon as it ended, before the next stage" \
      awk '!row && /^\| end to end .*timed out/ {row = NR} !after && /^== kernels/ {after = NR} END {exit !(row && after > row)}' "$OUT/run.log" ;;
  bound)
    expect+=(complete=true gpu-tests=passed a-kernels=measured
             "python-cpu=timed out: the overall bound (30 s) ended it"
             "python-cuda=not run: the overall bound" "a-torch=not run: the overall bound")
    check "run.sh says the bound stopped it" grep -q 'stopped: the overall bound (30 s) was reached during stage python-cpu' "$OUT/run.log" ;;
  trap-stuck)
    expect+=(complete=false gpu-tests=passed a-kernels=measured
             "python-cpu=cut: the overall bound (30 s) was reached and run.sh's own trap did not finish"
             "python-cuda=not run: the overall bound (30 s) was reached" "a-torch=not run: the overall bound")
    check "run.sh's outer layer printed the saved table" grep -q 'the last saved table' "$OUT/run.log" ;;
  preflight-stops)
    expect+=(complete=true "preflight=FAILED" "gpu-tests=not run: the preflight failed"
             "a-kernels=not run: the preflight failed")
    check "preflight.txt says what is wrong" grep -q '^FAIL  compute-mode .*EXCLUSIVE_PROCESS' "$OUT/preflight.txt"
    check "run.log shows the preflight's report" grep -q 'EXCLUSIVE_PROCESS' "$OUT/run.log" ;;
  interrupt)
    expect+=(complete=true gpu-tests=passed a-kernels=measured "python-cpu=cut: run.sh was interrupted (SIGTERM)"
             "python-cuda=not run: run.sh was interrupted (SIGTERM)")
    check "run.sh says it was interrupted" grep -q 'stopped: run.sh was interrupted (SIGTERM) during stage python-cpu' "$OUT/run.log" ;;
esac
nothing_left() {  # no process of a hung stage (run.sh names them fake-hang:$OUT:STAGE) still runs
  local f args
  for f in /proc/[0-9]*/cmdline; do
    mapfile -d '' args <"$f" 2>/dev/null || continue
    if [[ "${args[*]}" == *"fake-hang:$OUT:"* ]]; then echo "    left running: ${f%/cmdline}: ${args[*]}"; return 1; fi
  done
  return 0
}
check "nothing of a hung stage is left running" nothing_left
check "table.json is valid JSON with every row and the statuses expected: ${expect[*]}" \
  python3 - "$OUT/table.json" "${expect[@]}" <<'EOF'
import json, sys
table = json.load(open(sys.argv[1]))
rows = {r["id"]: r for r in table["rows"]}
want_ids = {"preflight", "gpu-tests", "e2e", "python-cpu", "python-cuda", "a-kernels", "a-torch", "b-step", "b-rt",
            "c-nomps", "c-mps", "d-vmm", "d-nccl-init", "d-nccl-rejoin", "d-nccl-split", "d-legacy", "nc-multi-gpu",
            "nc-multi-node"}
bad = [f"rows missing: {sorted(want_ids - rows.keys())}"] if want_ids - rows.keys() else []
bad += [f"row {i} has no 'covers'" for i, r in rows.items() if not r.get("covers")]
for item in sys.argv[2:]:
    key, want = item.split("=", 1)
    if key == "complete":
        if str(table["complete"]).lower() != want:
            bad.append(f"complete is {table['complete']}, not {want}")
    elif not rows.get(key, {}).get("status", "").startswith(want):
        bad.append(f"row {key}: status {rows.get(key, {}).get('status')!r}, not {want!r}...")
for b in bad:
    print("   ", b)
sys.exit(1 if bad else 0)
EOF
if ((failures)); then
  echo "$failures check(s) failed; run.sh's output:"
  tail -60 "$work/stdout.txt"
  exit 1
fi
echo "all checks passed"
