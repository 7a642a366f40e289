#!/usr/bin/env bash
# A fake device bundle, for run.sh's own tests on a machine without a GPU (tests/device/test_run.sh):
# the layout of a real bundle (bundle.sh), with shell and Python stubs in place of the binaries
# that print what the real ones print (the key=value lines run.sh's table reads), plus a fake
# nvidia-smi and nvidia-cuda-mps-control (fakebin/, to put first on PATH) and a fake NCCL wheel
# (site/, to put on PYTHONPATH). A file FAKE marks it: run.sh's preflight then skips its ELF
# checks (ldd, symbol versions), which the dry run of a real bundle covers.
#
#   tests/device/fake_bundle.sh OUT_DIR
#
# The fake nvidia-smi reports one H200 with Default compute mode, MIG off and 140 GB free;
# FAKE_NVSMI_COMPUTE_MODE, FAKE_NVSMI_DRIVER, FAKE_NVSMI_MIG and FAKE_NVSMI_FREE_MIB change that.
# The fake daemon benchmark writes its daemon's log to $GRADSYNC_DEVICE_CHECK_BENCH_LOG, which
# run.sh sets (default: the real benchmark's fixed /tmp/gradsync-daemon-bench.log).
set -euo pipefail

out=${1:?usage: fake_bundle.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python/gradsync" "$out/python-tests/workers" "$out/fakebin" \
         "$out/site/nvidia/nccl/lib"
cp "$here/run.sh" "$here/gradsyncd-logged.sh" "$out/"
chmod +x "$out/run.sh" "$out/gradsyncd-logged.sh"
echo "a fake bundle for run.sh's tests (tests/device/fake_bundle.sh); not for a GPU machine" >"$out/FAKE"

stub() {  # PATH, then the script's body on stdin
  { echo '#!/usr/bin/env bash'; cat; } >"$1"
  chmod +x "$1"
}

stub "$out/bin/gradsyncd" <<'EOF'
# Fake gradsyncd: says where it listens, logs a VMM import, and runs until it is killed.
echo "gradsyncd (fake) pid $$: listening on ${2:-?}"
echo "gradsyncd (fake): CUDA VMM segment of 104857600 bytes on GPU 0 imported in import_ms=2.500"
exec sleep 30
EOF

stub "$out/bin/gradsync_gpu_tests" <<'EOF'
echo "nccl: single-rank communicator created in nccl_init_ms=850.0"
echo "nccl: communicator of a restarted job re-joined in nccl_rejoin_ms=0.120 (created fresh in 850.0 ms)"
echo "nccl: communicator split off another (shared resources) in nccl_split_ms=40.0"
echo "==============================================================================="
echo "All tests passed (40 assertions in 4 test cases)"
EOF

stub "$out/bin/gradsync_gpu_e2e_tests" <<'EOF'
# Starts the daemon the way the harness does ($GRADSYNCD_BINARY, output to a file it deletes).
log=$(mktemp /tmp/gradsync-fake-log-XXXXXX)
"${GRADSYNCD_BINARY:?}" --socket /tmp/fake.sock --log-level debug >"$log" 2>&1 &
daemon=$!
sleep 0.5
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null
grep -q "listening" "$log" || { echo "the daemon's log lacks its first line:"; cat "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
echo "legacy: IPC handle opened in gradsyncd in legacy_import_ms=1.234"
echo "==============================================================================="
echo "test cases: 8 | 8 passed"
echo "assertions: 30 | 30 passed"
EOF

stub "$out/bin/gradsync-gpu-bench" <<'EOF'
if [[ "${1:-}" == "--print-layout" ]]; then
  for ((i = 0; i < 161; i++)); do echo 1000; done
  exit 0
fi
echo "resnet50: 161 tensors, 97.5 MiB, 161 work items"
echo "raw: gpu-coalesce kernels_ms=1.2000 copy_ms=1.0000 fraction_of_copy_bandwidth=0.833"
EOF

stub "$out/bin/gradsync-gpu-daemon-bench" <<'EOF'
gradsyncd=""
while (($#)); do [[ "$1" == --gradsyncd ]] && gradsyncd=$2; shift; done
"${gradsyncd:?}" --socket /tmp/fake-bench.sock >"${GRADSYNC_DEVICE_CHECK_BENCH_LOG:?}" 2>&1 &
daemon=$!
sleep 0.3
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null
for rank in 0 1; do
  echo "daemon_bench: rank=$rank step_ms=2.000 copy_floor_ms=1.500 rt4k_p50_us=25.0 rt4k_p99_us=60.0 compute_ms=10.000 compute_during_allreduce_ms=12.000"
done
EOF

stub "$out/bin/gradsync-gpu-ipc-floor" <<'EOF'
echo "ipc_floor: mode=processes p50_us=20.0 p99_us=40.0"
echo "ipc_floor: mode=threads p50_us=8.0 p99_us=15.0"
EOF

stub "$out/fakebin/nvidia-smi" <<'EOF'
# Fake nvidia-smi: -q prints a few lines; --query-gpu=a,b,... prints those fields for one GPU.
if [[ " $* " == *" -q "* ]]; then echo "==============NVSMI LOG=============="; echo "Product Name : NVIDIA H200 (fake)"; exit 0; fi
query=""
for a in "$@"; do [[ "$a" == --query-gpu=* ]] && query=${a#--query-gpu=}; done
[[ -n "$query" ]] || { echo "fake nvidia-smi: no --query-gpu" >&2; exit 2; }
IFS=, read -ra fields <<<"$query"
values=()
for f in "${fields[@]}"; do
  case "$f" in
    index) values+=(0) ;;
    name) values+=("NVIDIA H200 (fake)") ;;
    driver_version) values+=("${FAKE_NVSMI_DRIVER:-580.95.05}") ;;
    compute_mode) values+=("${FAKE_NVSMI_COMPUTE_MODE:-Default}") ;;
    mig.mode.current) values+=("${FAKE_NVSMI_MIG:-[N/A]}") ;;
    memory.free) values+=("${FAKE_NVSMI_FREE_MIB:-140000}") ;;
    memory.total) values+=(143771) ;;
    *) values+=("[N/A]") ;;
  esac
done
(IFS=,; echo "${values[*]}") | sed 's/,/, /g'
EOF

stub "$out/fakebin/nvidia-cuda-mps-control" <<'EOF'
# Fake MPS control: -d "starts" (a file in the pipe folder), "quit" on stdin stops.
dir=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
if [[ "${1:-}" == "-d" ]]; then mkdir -p "$dir" && echo started >"$dir/fake-control"; exit 0; fi
read -r command || true
[[ "$command" == quit && -e "$dir/fake-control" ]] && rm -f "$dir/fake-control"
EOF

# The fake NCCL wheel: nvidia-nccl-cu13's layout (nvidia/nccl/lib/libnccl.so.2), a namespace package.
: >"$out/site/nvidia/nccl/lib/libnccl.so.2"

# The Python package and the training check, as stubs.
: >"$out/python/gradsync/libgradsync_client.so"
echo '"""Fake gradsync package (fake_bundle.sh)."""' >"$out/python/gradsync/__init__.py"
printf 'def lib():\n    return None\n' >"$out/python/gradsync/_lib.py"
echo '"""Fake harness (fake_bundle.sh)."""' >"$out/python-tests/harness.py"
echo '"""Fake worker (fake_bundle.sh)."""' >"$out/python-tests/workers/train.py"
echo '"""Fake worker (fake_bundle.sh)."""' >"$out/python-tests/workers/sparse.py"
echo '"""Fake helpers (fake_bundle.sh)."""' >"$out/python-tests/workers/ops.py"
echo '"""Fake worker (fake_bundle.sh)."""' >"$out/python-tests/workers/backend.py"
echo '"""Fake worker (fake_bundle.sh)."""' >"$out/python-tests/workers/backend_errors.py"
echo '"""Fake worker (fake_bundle.sh)."""' >"$out/python-tests/workers/backend_fsdp.py"
cat >"$out/python-tests/training_check.py" <<'EOF'
"""Fake training check (fake_bundle.sh): starts $GRADSYNCD_BINARY in a folder of its own under
$TMPDIR, as harness.Daemon does, deletes the folder, and prints the real check's last line."""
import os, shutil, subprocess, sys, tempfile, time
device = "cuda" if "--cuda" in sys.argv else "cpu"
folder = tempfile.mkdtemp(prefix="gradsync-py-")
env = dict(os.environ)
if os.environ.get("GRADSYNCD_LD_LIBRARY_PATH"):
    env["LD_LIBRARY_PATH"] = os.environ["GRADSYNCD_LD_LIBRARY_PATH"]
with open(os.path.join(folder, "gradsyncd.log"), "w") as log:
    daemon = subprocess.Popen([os.environ["GRADSYNCD_BINARY"], "--socket", os.path.join(folder, "gradsync.sock")],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
time.sleep(0.3)
daemon.kill()
daemon.wait()
shutil.rmtree(folder)
os.makedirs(os.path.join(tempfile.gettempdir(), "gradsync-train-left"), exist_ok=True)
with open(os.path.join(tempfile.gettempdir(), "gradsync-train-left", "rank0.txt"), "w") as f:
    f.write("a file the check left behind\n")  # run.sh keeps it under $OUT/scratch
print(f"training: {device}: DDP hook and GradBuffer equal DDP on gloo after 60 steps (fake)")
if device == "cuda":
    print("sparse: cuda: sparse gradients, 16 cases and an embedding under DDP, equal torch and DDP on gloo (fake)")
EOF
cat >"$out/torch_flatten.py" <<'EOF'
"""Fake torch peer (fake_bundle.sh)."""
import sys
numels = [line for line in sys.stdin if line.strip()]
print(f"raw: torch-flatten tensors={len(numels)} median_ms=2.4000")
EOF
echo "fake bundle: $out"
