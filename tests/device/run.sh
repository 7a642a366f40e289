#!/usr/bin/env bash
# The device check: what a session lent a GPU machine runs, in one call, within 8 minutes (the
# stages' timeouts add up to 560 s at worst; a stuck stage loses its own rows, not the table).
# Runs the GPU tests, then the benchmarks, and prints a table with the peer and the floor of
# each measurement from the same run. Uses the machine's CUDA driver and the NCCL of its
# nvidia-nccl-cu13 Python package.
#
#   bash tests/device/run.sh BUNDLE            on the GPU machine (BUNDLE from bundle.sh)
#   bash tests/device/run.sh BUNDLE --dry-run  anywhere: checks the bundle, runs nothing on a GPU
set -uo pipefail

bundle=${1:?usage: run.sh BUNDLE [--dry-run]}
mode=${2:-}
bundle=$(cd "$bundle" && pwd)
fail=0
note() { echo "run.sh: $*"; }

for f in bin/gradsync_gpu_tests bin/gradsync_gpu_e2e_tests bin/gradsync-gpu-bench bin/gradsync-gpu-daemon-bench bin/gradsyncd run.sh torch_flatten.py python/gradsync/libgradsync_client.so python-tests/training_check.py python-tests/workers/train.py; do
  [[ -e "$bundle/$f" ]] || { note "the bundle lacks $f"; exit 1; }
done
if [[ "$mode" == "--dry-run" ]]; then
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/gradsync-gpu-bench" --print-layout | wc -l | grep -qx 161 || { note "the layout is not ResNet-50's"; exit 1; }
  python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$bundle/torch_flatten.py" || exit 1
  # The package loads its library, and that library's own dependencies, from the bundle alone.
  PYTHONPATH="$bundle/python" python3 -c "import gradsync._lib as l; l.lib()" ||
    { note "the bundle's Python package cannot load libgradsync_client.so"; exit 1; }
  note "dry run ok: bundle complete, benchmark layout has 161 tensors"
  exit 0
fi

nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
# The bundle's libraries for our binaries only: torch's Python must keep its own.
libs="$bundle/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ours() { LD_LIBRARY_PATH="$libs" "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || note "nvidia-smi failed"
note "NCCL from ${nccl:-nowhere (not found)}"

echo "== GPU tests"
gputests=$(ours timeout 120 "$bundle/bin/gradsync_gpu_tests" --durations yes 2>&1)
status=$?
grep '^nccl:' <<<"$gputests"
tail -40 <<<"$gputests"
[[ $status -eq 0 ]] || { note "GPU tests exited $status"; fail=1; }

echo "== end to end: gradsyncd and client processes on the GPU"
e2e=$(GRADSYNCD_BINARY="$bundle/bin/gradsyncd" ours timeout 120 "$bundle/bin/gradsync_gpu_e2e_tests" --durations yes 2>&1)
status=$?
grep '^legacy:' <<<"$e2e"
tail -40 <<<"$e2e"
[[ $status -eq 0 ]] || { note "end-to-end GPU tests exited $status"; fail=1; }

echo "== Python: DDP with the comm hook and GradBuffer on CUDA tensors (2 processes sharing GPU 0), against DDP on gloo"
# The machine's torch, our package; the bundle's libraries reach only libgradsync_client.so (its RPATH).
# The CPU run too: this machine's torch (2.11) takes GradBuffer's post-accumulate-grad hook path,
# which Debian's torch 1.13 in CI never does.
for where in --cpu --cuda; do
  pyrun=$(GRADSYNCD_BINARY="$bundle/bin/gradsyncd" GRADSYNCD_LD_LIBRARY_PATH="$libs" PYTHONPATH="$bundle/python" \
          timeout 60 python3 "$bundle/python-tests/training_check.py" $where 2>&1)
  status=$?
  tail -30 <<<"$pyrun"
  [[ $status -eq 0 ]] || { note "the Python training check ($where) exited $status"; fail=1; }
done

echo "== benchmarks"
kernels=$(ours timeout 40 "$bundle/bin/gradsync-gpu-bench" --iterations 50 2>&1) || { note "gradsync-gpu-bench failed"; fail=1; }
echo "$kernels"
torch=$(ours "$bundle/bin/gradsync-gpu-bench" --print-layout | timeout 40 python3 "$bundle/torch_flatten.py" 50 2>&1) ||
  { note "torch_flatten.py failed"; fail=1; }
echo "$torch"
daemon=$(ours timeout 60 "$bundle/bin/gradsync-gpu-daemon-bench" --gradsyncd "$bundle/bin/gradsyncd" --steps 20 --round-trips 500 2>&1) ||
  { note "gradsync-gpu-daemon-bench failed"; tail -20 /tmp/gradsync-daemon-bench.log; fail=1; }
echo "$daemon"
daemonlog=$(cat /tmp/gradsync-daemon-bench.log 2>/dev/null)
# (c) once more under MPS, if this machine lets us start its control daemon (one user: ours).
mps=""
if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d 2>/dev/null; then
  sleep 1
  mps=$(ours timeout 60 "$bundle/bin/gradsync-gpu-daemon-bench" --gradsyncd "$bundle/bin/gradsyncd" --steps 20 --round-trips 100 2>&1) ||
    { note "gradsync-gpu-daemon-bench under MPS failed"; }
  echo "MPS: $mps"
  echo quit | nvidia-cuda-mps-control
else
  note "MPS: could not start nvidia-cuda-mps-control here"
fi

value() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2" | head -1; }
k=$(value kernels_ms "$kernels"); c=$(value copy_ms "$kernels"); t=$(value median_ms "$torch")
ratio() { [[ -n "$1" && -n "$2" ]] && python3 -c "print(f'{$1 / $2:.2f}x')" || echo missing; }
echo
echo "| measurement | gradsync | floor (same run) | gradsync / floor | peer (same run) | peer / gradsync |"
echo "|---|---|---|---|---|---|"
echo "| (a) ResNet-50 161 tensors, gather + scatter | ${k:-missing} ms | 2 x D2D copy: ${c:-missing} ms | $(ratio "$k" "$c") (target <= 1.25x, i.e. >= 80% of copy bandwidth) | torch flatten+unflatten+copy: ${t:-missing} ms | $(ratio "$t" "$k") (target >= 1.5x) |"
rank0=$(grep 'rank=0' <<<"$daemon")
s=$(value step_ms "$rank0"); f=$(value copy_floor_ms "$rank0"); p50=$(value rt4k_p50_us "$rank0"); p99=$(value rt4k_p99_us "$rank0")
echo "| (b) daemon + 2 clients on one GPU, 2 x 100 MiB avg-allreduce step | ${s:-missing} ms | D2D copy of 2 x 100 MiB: ${f:-missing} ms | $(ratio "$s" "$f") | none on one GPU (NCCL refuses 2 ranks per GPU) | |"
echo "| (b) 4 KiB avg-allreduce round trip, p50 / p99 | ${p50:-missing} / ${p99:-missing} us | | (target p50 <= 30 us) | | |"
ca=$(value compute_ms "$rank0"); cd=$(value compute_during_allreduce_ms "$rank0")
echo "| (c) trainer compute kernel while the daemon allreduces, no MPS | ${cd:-missing} ms | alone: ${ca:-missing} ms | $(ratio "$cd" "$ca") slowdown | | |"
mrank0=$(grep 'rank=0' <<<"$mps")
ma=$(value compute_ms "$mrank0"); md=$(value compute_during_allreduce_ms "$mrank0"); ms=$(value step_ms "$mrank0"); mp=$(value rt4k_p50_us "$mrank0")
echo "| (c) the same under MPS | ${md:-missing} ms | alone: ${ma:-missing} ms | $(ratio "$md" "$ma") slowdown | step ${ms:-missing} ms, 4 KiB p50 ${mp:-missing} us | |"
vmm=$(sed -n 's/.*CUDA VMM segment of 104857600 bytes.*import_ms=\([0-9.]*\).*/\1/p' <<<"$daemonlog" | head -1)
echo "| (d) cuMem import + map of 100 MiB in gradsyncd | ${vmm:-missing} ms | | | | |"
n=$(value nccl_init_ms "$gputests")
echo "| (d) NCCL single-rank communicator init (non-blocking, polled) | ${n:-missing} ms | | | | |"
r=$(value nccl_rejoin_ms "$gputests")
echo "| (d) NCCL communicator re-join by a restarted job (kept, agreed, no init) | ${r:-missing} ms | fresh init: ${n:-missing} ms | $(ratio "$r" "$n") | | |"
leg=$(value legacy_import_ms "$e2e")
echo "| (d) legacy IPC open (cudaIpcOpenMemHandle) in gradsyncd | ${leg:-missing} ms | | | | |"
exit $fail
