#!/usr/bin/env bash
# The device check: what a session lent a GPU machine runs, in one call of the device tool (one
# H200, 15 minutes of device time in all with the machine's start-up, only the last 12 KB of
# output come back, plus the files written under $OUT). It checks the machine (preflight), runs
# the GPU tests and the benchmarks, and prints a table: each measurement next to its floor and
# peer from the same run, what each row covers, and what one GPU cannot cover.
#
#   bash run.sh BUNDLE [--mps]     on the GPU machine; BUNDLE from tests/device/bundle.sh
#   bash run.sh BUNDLE --dry-run   anywhere: the preflight checks that need no GPU, nothing else
#
# Uses the machine's CUDA driver, the NCCL of its nvidia-nccl-cu13 Python package, and its
# python3 with PyTorch. Exit status: 0 all passed; 1 a stage failed or timed out; 2 usage;
# 3 the preflight failed (nothing else ran); 124 the overall bound was reached.
#
# Everything under $OUT ($OUT unset: a new ./device-out-DATE, named at the start):
#   run.log          all that this script prints
#   preflight.txt    the preflight's report, one line per check
#   table.json       the table (also table.md), rewritten after every stage: a killed run leaves it
#   stages/NAME.log  each stage's whole output (Catch2's full console report, Python's output)
#   daemons/STAGE/   the log of every gradsyncd the stage started (gradsyncd-logged.sh keeps a copy
#                    of the logs the tests' harnesses delete; the benchmarks' from their fixed file)
#   nccl/            NCCL's own log, NCCL_DEBUG=WARN, one file per process (NCCL_DEBUG_FILE)
#   nvidia-smi-q.txt `nvidia-smi -q` at the start
#   mps/             the MPS control daemon's logs (with --mps)
#   scratch/STAGE/   files the stage left in its temporary folders (TMPDIR, GRADSYNC_SCRATCH_DIR)
#
# Stages, in order, and their budgets (`timeout -k 5`; a budget includes the 5 s kill grace):
#   preflight      25 s  driver >= 580 (CUDA 13), compute mode Default (EXCLUSIVE_PROCESS stops a
#                        daemon and its clients from sharing the GPU), MIG off, >= 8 GiB free,
#                        the NCCL wheel, the bundle complete, ldd of every binary and library, the
#                        GLIBCXX_/CXXABI_/GLIBC_/GCC_ symbol versions they need against the
#                        machine's libstdc++/libc; stops the run, saying what is wrong
#   gpu-tests      60 s  gradsync_gpu_tests: kernels vs the host reduction; single-rank NCCL
#   e2e            35 s  gradsync_gpu_e2e_tests: gradsyncd + trainer processes sharing GPU 0
#   kernels        20 s  (a) gradsync-gpu-bench: gather + scatter of ResNet-50's 161 tensors
#   daemon-bench   30 s  (b) (c) (d) gradsync-gpu-daemon-bench: gradsyncd + 2 trainers
#   python-cpu    130 s  training_check.py --cpu   } 230 s: each run starts 3+ Python processes
#   python-cuda   100 s  training_check.py --cuda  } importing torch (33-42 s each on an H200);
#                                                    --cuda then runs the sparse worker on the
#                                                    GPU; both then the torch.distributed
#                                                    backend's checks (--cpu 4 more pairs of
#                                                    processes, --cuda 1)
#   torch-flatten  25 s  (a) the peer: torch flatten + unflatten (torch warm by then)
#   mps            30 s  (c) under MPS, only with --mps; then 10 s to stop MPS (mps-stop)
# Sum: 425 s, 465 s with --mps. Overall bound: 480 s. The script runs itself under
# `timeout -k 8 480`; every stage's budget is also cut to what is left of the bound (less 10 s
# kept for the end), and at the bound a trap ends the stage, marks its rows, and prints and saves
# the table. Worst case: 480 s + 8 s of kill grace + at most 13 s of clean-up by the outer layer
# (end the stage 2 s, stop MPS 5 s, remove the scratch folder 4 s, let tee finish 2 s) if even
# the trap was stuck: 501 s, under 9 minutes. Every external command that can hang (nvidia-smi,
# python3, ldd, readelf, MPS control, our binaries) runs under `timeout -k`.
#
# For run.sh's own tests only (tests/device/test_run.sh, with fake_bundle.sh):
#   GRADSYNC_DEVICE_CHECK_BOUND_S=S             the overall bound instead of 480 s
#   GRADSYNC_DEVICE_CHECK_BUDGETS=NAME=S,...    stage budgets instead of the above
#   GRADSYNC_DEVICE_CHECK_FAKE_STAGE=NAME:hang  stage NAME hangs instead (cut at its budget);
#                             NAME:hang-untimed  the same without its timeout, as a bug would
#   GRADSYNC_DEVICE_CHECK_FAKE_TRAP=hang        the bound's trap hangs (the outer layer finishes)
#   GRADSYNC_DEVICE_CHECK_BENCH_LOG=FILE        where the daemon benchmark's daemon logs
set -uo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
STAGES=(preflight gpu-tests e2e kernels daemon-bench python-cpu python-cuda torch-flatten mps)
declare -A BUDGET=([preflight]=25 [gpu-tests]=60 [e2e]=35 [kernels]=20 [daemon-bench]=30
                   [python-cpu]=130 [python-cuda]=100 [torch-flatten]=25 [mps]=30 [mps-stop]=10)
BOUND=${GRADSYNC_DEVICE_CHECK_BOUND_S:-480}
OUTER_KILL_GRACE=8  # after the bound's TERM, before the KILL
STAGE_KILL_GRACE=5
END_RESERVE=$((BOUND >= 100 ? 10 : 2))  # kept at the end of the bound for the table (2 s: tests)
MIN_DRIVER=580      # CUDA 13.0 and nvidia-nccl-cu13 need 580 or later
MIN_FREE_MIB=8192
BENCH_LOG=${GRADSYNC_DEVICE_CHECK_BENCH_LOG:-/tmp/gradsync-daemon-bench.log}  # fixed in bench_daemon.cc
REQUIRED=(bin/gradsync_gpu_tests bin/gradsync_gpu_e2e_tests bin/gradsync-gpu-bench bin/gradsync-gpu-daemon-bench
          bin/gradsync-gpu-ipc-floor
          bin/gradsyncd run.sh gradsyncd-logged.sh torch_flatten.py python/gradsync/__init__.py
          python/gradsync/_lib.py python/gradsync/libgradsync_client.so python-tests/harness.py
          python-tests/training_check.py python-tests/workers/train.py python-tests/workers/sparse.py
          python-tests/workers/ops.py python-tests/workers/backend.py python-tests/workers/backend_errors.py
          python-tests/workers/backend_fsdp.py)

note() { echo "run.sh: $*"; }
usage() { sed -n '2,13p' "$SELF"; exit 2; }
now_s() { echo "${EPOCHSECONDS:-$(date +%s)}"; }
now_us() { if [[ -n "${EPOCHREALTIME:-}" ]]; then echo "${EPOCHREALTIME/[.,]/}"; else date +%s%6N; fi; }
secs_since() { local d=$(( $(now_us) - $1 )); printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000)); }

ARGS=("$@")
bundle="" dry=0 mps=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    --mps) mps=1 ;;
    -h|--help) usage ;;
    -*) echo "run.sh: unknown option $arg" >&2; usage ;;
    *) [[ -z "$bundle" ]] || usage; bundle=$arg ;;
  esac
done
[[ -n "$bundle" && -d "$bundle" ]] || { echo "run.sh: no bundle folder given (${bundle:-none})" >&2; usage; }
BUNDLE=$(cd "$bundle" && pwd)
if [[ -n "${GRADSYNC_DEVICE_CHECK_BUDGETS:-}" ]]; then
  IFS=, read -ra overrides <<<"$GRADSYNC_DEVICE_CHECK_BUDGETS"
  for o in "${overrides[@]}"; do BUDGET[${o%%=*}]=${o#*=}; done
fi

# ---------------------------------------------------------------------------------------------
# Stage bodies. Each runs in its own `bash run.sh` (GRADSYNC_DEVICE_CHECK_ROLE=stage:NAME) under
# the stage's `timeout -k`, output to $OUT/stages/NAME.log, with TMPDIR and GRADSYNC_SCRATCH_DIR
# set to a folder of its own.

ours() { LD_LIBRARY_PATH="$LIBS" "$@"; }  # the bundle's libraries and NCCL, for our binaries only
logged_daemon_env() {  # gradsyncd through gradsyncd-logged.sh, its log kept in $OUT/daemons/STAGE
  export GRADSYNCD_BINARY="$BUNDLE/gradsyncd-logged.sh" GRADSYNC_DEVICE_REAL_GRADSYNCD="$BUNDLE/bin/gradsyncd"
}
# Line-buffered (stdbuf, where there is one): output to a file is block-buffered, and a stage
# killed at its budget would lose what it printed last (which test case hung).
linebuf() { if command -v stdbuf >/dev/null; then stdbuf -oL -eL "$@"; else "$@"; fi; }
catch2() { ours linebuf "$@" --durations yes --use-colour no; }

stage_gpu-tests() { catch2 "$BUNDLE/bin/gradsync_gpu_tests"; }
stage_e2e() { logged_daemon_env; catch2 "$BUNDLE/bin/gradsync_gpu_e2e_tests"; }
stage_kernels() { ours linebuf "$BUNDLE/bin/gradsync-gpu-bench" --iterations 50; }
stage_daemon-bench() {
  ours linebuf "$BUNDLE/bin/gradsync-gpu-daemon-bench" --gradsyncd "$BUNDLE/bin/gradsyncd" --steps 20 --round-trips 500 ||
    return
  ours linebuf "$BUNDLE/bin/gradsync-gpu-ipc-floor" --round-trips 500  # row (b)'s floor, without gradsync
}
python_check() {  # the machine's torch, our package; the bundle's libraries reach only gradsyncd
  logged_daemon_env
  GRADSYNCD_LD_LIBRARY_PATH="$LIBS" PYTHONPATH="$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    python3 -u "$BUNDLE/python-tests/training_check.py" "$1"
}
stage_python-cpu() { python_check --cpu; }
stage_python-cuda() { python_check --cuda; }
stage_torch-flatten() {
  ours "$BUNDLE/bin/gradsync-gpu-bench" --print-layout >"$TMPDIR/layout.txt" || return
  python3 -u "$BUNDLE/torch_flatten.py" 50 <"$TMPDIR/layout.txt"
}
stage_mps() {  # the control daemon on a private pipe folder: only this stage's processes use it
  nvidia-cuda-mps-control -d </dev/null || { echo "run.sh: nvidia-cuda-mps-control -d failed"; return 1; }
  : >"$SCRATCH/mps-running"
  echo "MPS control daemon started (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
  sleep 1
  ours "$BUNDLE/bin/gradsync-gpu-daemon-bench" --gradsyncd "$BUNDLE/bin/gradsyncd" --steps 20 --round-trips 100 || return
  ours linebuf "$BUNDLE/bin/gradsync-gpu-ipc-floor" --round-trips 200
}

# The preflight: one line per check into $OUT/preflight.txt; exits 1 if a check failed.
pf_failed=0
pf() {  # ok|FAIL|warn|skip CHECK DETAIL
  printf '%-4s  %-16s  %s\n' "$1" "$2" "$3" | tee -a "$OUT/preflight.txt"
  [[ "$1" == FAIL ]] && pf_failed=1
  return 0
}
is_elf() { [[ -f "$1" && "$(head -c 4 "$1" 2>/dev/null | tr -d '\0')" == $'\x7fELF' ]]; }
version_needs() {  # FILE: "library version" per line, from its .gnu.version_r
  timeout -k 2 5 readelf -V -W "$1" 2>/dev/null | awk '
    /^Version needs section/ {s = 1; next} /^Version (definition|symbols) section/ {s = 0}
    s && / File: / {for (i = 1; i < NF; i++) if ($i == "File:") lib = $(i + 1)}
    s && / Name: / {for (i = 1; i < NF; i++) if ($i == "Name:") print lib, $(i + 1)}'
}
version_defs() {  # FILE: the versions it defines, from its .gnu.version_d
  timeout -k 2 5 readelf -V -W "$1" 2>/dev/null | awk '
    /^Version definition section/ {s = 1; next} /^Version (needs|symbols) section/ {s = 0}
    s && / Name: / {for (i = 1; i < NF; i++) if ($i == "Name:") print $(i + 1)}'
}
ldconfig_path() {  # LIBRARY: its x86-64 path in the loader's cache
  local ldconfig
  ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  timeout -k 2 5 "$ldconfig" -p 2>/dev/null | awk -v lib="$1" '$1 == lib && /x86-64/ {print $NF; exit}'
}

# ldd -v of every ELF file of the bundle, with the run's LD_LIBRARY_PATH: every library resolves
# (in a dry run, libcuda and libnccl may be missing: the GPU machine has them), and every symbol
# version needed from a library outside the bundle (GLIBCXX_*, CXXABI_*, GLIBC_*, GCC_*) is
# defined by the library the loader picks here: read with readelf on both sides where readelf
# is installed, and in any case the loader's own verdict (ldd -v: "version `X' not found").
provided_by_gpu_machine() { ((dry)) && [[ "$1" == libcuda.so.1 || "$1" == libnccl.so.2 ]]; }
preflight_elf() {
  local f elves=() bad=() verdict=() lines line lib path ldd_needs="" have_readelf=0
  declare -A where=()
  command -v readelf >/dev/null && have_readelf=1
  for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/* "$BUNDLE"/python/gradsync/*.so; do is_elf "$f" && elves+=("$f"); done
  if ! command -v ldd >/dev/null; then
    pf warn ldd "ldd is not on PATH: the libraries and symbol versions are not checked"
    return
  fi
  for f in "${elves[@]}"; do
    if ! lines=$(LD_LIBRARY_PATH="$LIBS" timeout -k 2 5 ldd -v "$f" 2>&1); then
      grep -q 'not found' <<<"$lines" || { bad+=("${f#"$BUNDLE"/}: ldd failed: ${lines:0:200}"); continue; }
    fi
    # "<tab>name => path (address)": where each library resolves; "<tab>/lib64/ld-linux...": the loader.
    while read -r lib _ path _; do
      if [[ "$path" == not ]]; then provided_by_gpu_machine "$lib" || bad+=("${f#"$BUNDLE"/} needs $lib: not found")
      elif [[ "$path" == /* ]]; then where[$lib]=$path; fi
    done < <(awk -F'\t' 'NF == 2 && / => / {print $2}' <<<"$lines")
    path=$(awk -F'\t' 'NF == 2 && $2 ~ /^\/.*ld-linux/ {split($2, a, " "); print a[1]; exit}' <<<"$lines")
    [[ -n "$path" ]] && where[${path##*/}]=$path
    # "<tab><tab>name (VERSION) => path": each version needed, by this file and by what it loads.
    # (Only the blocks of the bundle's own files: the machine's libraries need what they need.)
    ldd_needs+=$(awk -F'\t' -v b="$BUNDLE/" 'NF == 2 && $2 ~ /:$/ {own = index($2, b) == 1}
      own && NF == 3 && / => / {split($3, a, " "); v = a[2]; gsub(/[()]/, "", v); print a[1], v}' <<<"$lines")$'\n'
    while read -r line; do verdict+=("${f#"$BUNDLE"/}: $line"); done < <(grep -o "version \`[^']*' not found.*" <<<"$lines")
  done
  if ((${#bad[@]})); then pf FAIL ldd "${bad[*]}"
  else pf ok ldd "${#elves[@]} binaries and libraries resolve every library$( ((dry)) && echo " (in a dry run libcuda.so.1 and libnccl.so.2 may come from the GPU machine)")"; fi

  # Every version needed from a library outside the bundle, against what the machine's defines.
  local needs provider defs want gaps highest failed=0 summary=()
  if ((have_readelf)); then needs=$(for f in "${elves[@]}"; do version_needs "$f"; done | sort -u)
  else needs=$(sort -u <<<"$ldd_needs" | grep .); fi
  while read -r lib; do
    [[ -n "$lib" && ! -e "$BUNDLE/lib/$lib" ]] || continue
    want=$(awk -v l="$lib" '$1 == l {print $2}' <<<"$needs" | sort -uV)
    highest=$(for p in GLIBCXX CXXABI GLIBC GCC; do grep "^${p}_[0-9]" <<<"$want" | tail -1; done | tr '\n' ' ')
    highest=${highest% }
    provider=${where[$lib]:-}
    [[ -n "$provider" ]] || provider=$(ldconfig_path "$lib")
    if [[ -z "$provider" || ! -e "$provider" ]]; then
      provided_by_gpu_machine "$lib" && continue
      pf FAIL symbol-versions "$lib (needed with ${highest:-its versions}) is not on this machine"; failed=1; continue
    fi
    if ((have_readelf)); then
      defs=$(version_defs "$provider")
      gaps=$(comm -23 <(sort -u <<<"$want") <(sort -u <<<"$defs") | sort -V | tr '\n' ' ')
      if [[ -n "$gaps" ]]; then
        pf FAIL symbol-versions "$provider lacks ${gaps}(it defines up to $(for p in GLIBCXX CXXABI GLIBC GCC; do grep "^${p}_[0-9]" <<<"$defs" | sort -V | tail -1; done | tr '\n' ' '))"
        failed=1; continue
      fi
    fi
    [[ -n "$highest" ]] || highest=$(tr '\n' ' ' <<<"$want") highest=${highest% }
    summary+=("$lib $highest")
  done < <(awk '{print $1}' <<<"$needs" | sort -u)
  local joined
  joined=$(IFS=';'; echo "${summary[*]}")
  pf info needs "the highest versions the bundle needs from the machine: ${joined//;/; }"
  if ((${#verdict[@]})); then
    pf FAIL symbol-versions "the loader: ${verdict[*]:0:5}"; failed=1
  fi
  if ((!failed)); then
    pf ok symbol-versions "the machine's libraries define every version the bundle needs ($( ((have_readelf)) && echo "readelf on both sides, and the loader" || echo "the loader, ldd -v: readelf is not installed"))"
  fi
}

stage_preflight() {
  : >"$OUT/preflight.txt"
  local fake=0 f missing=()
  [[ -e "$BUNDLE/FAKE" ]] && fake=1
  pf info mode "$( ((dry)) && echo "dry run: the checks that need no GPU" || echo "GPU run")$( ((fake)) && echo "; FAKE bundle (run.sh's tests)")"
  pf info host "$(uname -n), $(uname -r), bash $BASH_VERSION"

  # The bundle.
  for f in "${REQUIRED[@]}"; do [[ -e "$BUNDLE/$f" ]] || missing+=("$f"); done
  for f in "$BUNDLE"/bin/*; do [[ -x "$f" ]] || missing+=("${f#"$BUNDLE"/} (not executable)"); done
  # Both test harnesses start it directly (it is GRADSYNCD_BINARY).
  [[ -x "$BUNDLE/gradsyncd-logged.sh" ]] || missing+=("gradsyncd-logged.sh (not executable)")
  if ((${#missing[@]})); then pf FAIL bundle "$BUNDLE lacks ${missing[*]}"
  else pf ok bundle "$BUNDLE: complete, $(du -sh "$BUNDLE" 2>/dev/null | cut -f1)"; fi

  # The GPU first (nvidia-smi-q.txt is then saved even if a later check hangs): nvidia-smi, the
  # driver, compute mode, MIG, free memory, libcuda.
  if ((dry)); then
    pf skip gpu "dry run: no GPU checks (driver, compute mode, MIG, free memory, libcuda)"
  elif ! command -v nvidia-smi >/dev/null; then
    pf FAIL gpu "nvidia-smi is not on PATH: no NVIDIA driver on this machine"
  else
    timeout -k 2 10 nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1 || pf warn nvidia-smi-q "nvidia-smi -q failed or timed out (see nvidia-smi-q.txt)"
    local q index name driver mode mig free total count
    q=$(timeout -k 2 8 nvidia-smi --query-gpu=index,name,driver_version,compute_mode,mig.mode.current,memory.free,memory.total \
          --format=csv,noheader,nounits 2>&1)
    count=$(grep -c '^[0-9]' <<<"$q")
    if ((count == 0)); then
      pf FAIL gpu "nvidia-smi lists no GPU: ${q:0:300}"
    else
      IFS=, read -r index name driver mode mig free total <<<"$(grep -m1 '^[0-9]' <<<"$q" | sed 's/, */,/g')"
      pf info gpu "$count GPU(s); GPU $index: $name, ${total} MiB${CUDA_VISIBLE_DEVICES:+; CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}"
      if [[ "${driver%%.*}" =~ ^[0-9]+$ ]] && ((${driver%%.*} >= MIN_DRIVER)); then
        pf ok driver "$driver (CUDA 13 needs $MIN_DRIVER or later)"
      else pf FAIL driver "driver $driver: CUDA 13 and nvidia-nccl-cu13 need $MIN_DRIVER or later"; fi
      case "$mode" in
        Default) pf ok compute-mode "Default: gradsyncd and its trainer processes may share the GPU" ;;
        Exclusive_Process) pf FAIL compute-mode "EXCLUSIVE_PROCESS: one process per GPU, so gradsyncd and its trainers cannot share it (every e2e, benchmark and Python stage would fail); run.sh leaves the GPU's settings as they are" ;;
        Prohibited) pf FAIL compute-mode "Prohibited: no process may use the GPU; Default is needed" ;;
        *) pf warn compute-mode "\"$mode\": not a compute mode run.sh knows; going on (each stage is bounded)" ;;
      esac
      case "$mig" in
        Enabled) pf FAIL mig "MIG is enabled: the tests and benchmarks assume the whole GPU, and MIG limits CUDA IPC; run.sh leaves it as it is" ;;
        *) pf ok mig "MIG ${mig}" ;;
      esac
      if [[ ! "$free" =~ ^[0-9]+$ ]]; then
        pf warn free-memory "\"$free\": nvidia-smi did not say how much is free; going on (each stage is bounded)"
      elif ((free >= MIN_FREE_MIB)); then
        pf ok free-memory "$free MiB free of $total MiB"
      else pf FAIL free-memory "$free MiB free of $total MiB, under $MIN_FREE_MIB MiB: another process holds the GPU's memory (see nvidia-smi-q.txt)"; fi
    fi
    # Loaded as our binaries will load it (the driver may be mounted outside the loader's
    # cache and found through LD_LIBRARY_PATH), then the cache.
    if ((fake)); then pf skip libcuda "fake bundle"
    elif f=$(timeout -k 2 10 python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1"); print(next(l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l))' 2>/dev/null | tail -1) && [[ "$f" == /* ]]; then
      pf ok libcuda "$f (loaded)"
    elif f=$(ldconfig_path libcuda.so.1) && [[ -n "$f" ]]; then pf ok libcuda "$f"
    else pf FAIL libcuda "libcuda.so.1 (the CUDA driver library) cannot be loaded, and is not in the loader's cache (ldconfig -p)"; fi
  fi
  # The NCCL wheel (nvidia-nccl-cu13: nvidia/nccl/lib/libnccl.so.2), found without importing torch.
  local nccl
  nccl=$(timeout -k 2 10 python3 - 2>"$SCRATCH/nccl.err" <<'EOF' | tail -1
import glob, importlib.metadata as md, importlib.util, os
found = None
try:
    spec = importlib.util.find_spec("nvidia.nccl")
    for p in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(p, "lib", "libnccl.so.2")):
            found = os.path.join(p, "lib"); break
except ModuleNotFoundError:
    pass
if not found:
    spec = importlib.util.find_spec("nvidia")
    for p in (spec.submodule_search_locations or []) if spec else []:
        hits = glob.glob(os.path.join(p, "**", "libnccl.so.2"), recursive=True)
        if hits:
            found = os.path.dirname(hits[0]); break
version = "?"
for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
    try:
        version = name + " " + md.version(name); break
    except md.PackageNotFoundError:
        pass
print(f"{found}|{version}" if found else "NOTFOUND")
EOF
  )
  if [[ "$nccl" == /*"|"* ]]; then
    echo "${nccl%%|*}" >"$SCRATCH/nccl-lib"
    pf ok nccl-wheel "${nccl#*|}: ${nccl%%|*}/libnccl.so.2"
  elif ((dry)); then pf skip nccl-wheel "not found (dry run: not required)"
  else pf FAIL nccl-wheel "the NCCL wheel (pip nvidia-nccl-cu13, nvidia/nccl/lib/libnccl.so.2) is not found by python3: ${nccl:0:200} $(head -c 300 "$SCRATCH/nccl.err" 2>/dev/null)"
  fi
  LIBS="$BUNDLE/lib"
  [[ -s "$SCRATCH/nccl-lib" ]] && LIBS+=":$(cat "$SCRATCH/nccl-lib")"
  LIBS+="${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  pf info libraries "LD_LIBRARY_PATH for our binaries: $LIBS"

  # Python and torch: version only, torch is not imported (30-40 s cold).
  pf info python "$(timeout -k 2 5 python3 -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>&1 | tail -1)"
  local torch
  torch=$(timeout -k 2 8 python3 -c 'import importlib.util as u, importlib.metadata as m; s = u.find_spec("torch"); print(m.version("torch") + " at " + s.origin if s else "MISSING")' 2>&1 | tail -1)
  if [[ "$torch" == MISSING* || -z "$torch" ]]; then
    pf warn torch "python3 finds no torch: the Python stages and the torch peer will fail"
  else pf ok torch "$torch"; fi

  # The bundle's own checks: the benchmark's layout, the Python files parse, the package loads
  # its library (and that library's own from the bundle).
  local n
  n=$(timeout -k 2 8 env LD_LIBRARY_PATH="$LIBS" "$BUNDLE/bin/gradsync-gpu-bench" --print-layout 2>/dev/null | wc -l)
  if [[ "$n" == 161 ]]; then pf ok layout "the benchmark's layout is ResNet-50's 161 tensors"
  else pf FAIL layout "gradsync-gpu-bench --print-layout printed $n lines, not ResNet-50's 161"; fi
  local out
  if out=$(timeout -k 2 8 python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' \
             "$BUNDLE/torch_flatten.py" "$BUNDLE"/python-tests/*.py "$BUNDLE"/python-tests/workers/*.py 2>&1); then
    pf ok python-files "torch_flatten.py and python-tests/ parse"
  else pf FAIL python-files "${out:0:300}"; fi
  if out=$(PYTHONPATH="$BUNDLE/python" timeout -k 2 10 python3 -c 'import gradsync._lib as l; l.lib()' 2>&1); then
    pf ok python-package "gradsync loads libgradsync_client.so from the bundle"
  else pf FAIL python-package "the bundle's gradsync cannot load libgradsync_client.so: ${out: -300}"; fi

  # ldd and symbol versions of every binary and library (a fake bundle has scripts: skipped).
  if ((fake)); then
    pf skip ldd "fake bundle: no ELF files"
    pf skip symbol-versions "fake bundle: no ELF files"
  else
    preflight_elf
  fi

  ((pf_failed)) && echo "preflight: FAILED" || echo "preflight: ok"
  return "$pf_failed"
}

# ---------------------------------------------------------------------------------------------
# The table: one row per measurement or test stage, with what it covers. Rows are kept in
# associative arrays, printed as their stage ends, and written to table.json and table.md.

ROWS=(preflight gpu-tests e2e python-cpu python-cuda a-kernels a-torch b-step b-rt c-nomps c-mps
      d-vmm d-nccl-init d-nccl-rejoin d-nccl-split d-legacy nc-multi-gpu nc-multi-node)
declare -A TITLE COVERS RESULT FLOOR PEER TARGET STATUS VALUES STAGE_OF
def_row() { TITLE[$1]=$3; STAGE_OF[$1]=$2; COVERS[$1]=$4; TARGET[$1]=${5:-}; RESULT[$1]=""; FLOOR[$1]=""; PEER[$1]="";
            VALUES[$1]=""; STATUS[$1]=pending; }
def_row preflight preflight "preflight" "this machine: driver, compute mode, MIG, free memory, NCCL wheel, ldd and symbol versions of the bundle (preflight.txt)"
def_row gpu-tests gpu-tests "GPU tests (gradsync_gpu_tests)" "the coalescing kernels on the GPU against the host reduction, bit for bit (two NaNs equal whatever their payload); one single-rank NCCL communicator through the engine: allreduce, watchdog, a stuck stream's timeout and abort, a restarted job's re-join, a split off a parent communicator; the health kernel against the host's health"
def_row e2e e2e "end to end (gradsync_gpu_e2e_tests)" "gradsyncd + 2-3 trainer processes sharing GPU 0: allreduce sum/avg, broadcast, reduce, allgather, clients killed mid-step and mid-job, stream ordering, legacy IPC (trusted user only), fused health, masked allreduce, reduce-scatter, SparseReducer from device memory, device memory freed after its set is released; single node, NCCL single-rank"
def_row python-cpu python-cpu "Python training check, CPU tensors (training_check.py --cpu)" "DDP with gradsync's comm hook, and GradBuffer, each equal to DDP on gloo after 60 steps, 2 trainer processes, with this machine's torch (its post-accumulate-grad hook path, which CI's torch never takes); then init_process_group('gradsync') on this torch: every offered collective and DDP without a hook against gloo, an async Work, DDP's backward when a rank dies, FSDP on the CPU against DDP on gloo"
def_row python-cuda python-cuda "Python training check, CUDA tensors (training_check.py --cuda)" "the same with both trainer processes' tensors on GPU 0; then sparse COO gradients on the GPU (every dtype, op and result against torch on the CPU; an nn.Embedding(sparse=True) under DDP against DDP on gloo); then init_process_group('gradsync') with GPU 0's tensors: every offered collective against gloo, the stream rule, DDP without a hook against DDP on gloo"
def_row a-kernels kernels "(a) ResNet-50 161 tensors: gradsync gather + scatter" "gradsync's coalescing kernels alone, on one GPU" "<= 1.25x the copy (>= 80% of copy bandwidth)"
def_row a-torch torch-flatten "(a) peer: torch flatten + unflatten + copy back, the same 161 tensors" "torch's _flatten_dense_tensors/_unflatten_dense_tensors, as the seeds do it" "torch >= 1.5x gradsync"
def_row b-step daemon-bench "(b) gradsyncd + 2 trainers on one GPU: 2 x 100 MiB avg-allreduce step" "one node, one GPU: gradsyncd's same-GPU kernel reduction of 2 processes' buffers; NCCL moves no data (single rank)"
def_row b-rt daemon-bench "(b) 4 KiB avg-allreduce round trip, p50 / p99" "the control path: trainer -> gradsyncd -> trainer on one node, one GPU" "p50 <= 30 us"
def_row c-nomps daemon-bench "(c) trainer compute kernel while gradsyncd allreduces, no MPS" "time-slicing between gradsyncd's and a trainer's CUDA contexts on one GPU"
def_row c-mps mps "(c) the same under MPS" "the same with an MPS control daemon (run.sh --mps)"
def_row d-vmm daemon-bench "(d) cuMem import + map of 100 MiB in gradsyncd" "gradsyncd importing a trainer's VMM allocation (from the daemon benchmark's log)"
def_row d-nccl-init gpu-tests "(d) NCCL single-rank communicator init (non-blocking, polled)" "ncclCommInitRank for one rank on one GPU; no transport between GPUs or nodes"
def_row d-nccl-rejoin gpu-tests "(d) NCCL communicator re-join by a restarted job (kept, agreed, no init)" "the kept single-rank communicator reused by a restarted job"
def_row d-nccl-split gpu-tests "(d) NCCL communicator split off another, sharing its resources (non-blocking)" "ncclCommSplit with splitShare of a single-rank communicator into a single-rank child; no NOCOLOR rank, no transport"
def_row d-legacy e2e "(d) legacy IPC open (cudaIpcOpenMemHandle) in gradsyncd" "gradsyncd opening a trusted trainer's cudaMalloc memory"
def_row nc-multi-gpu - "multi-GPU NCCL (several GPUs per node)" "not covered on one GPU: every NCCL communicator here has a single rank, so no NCCL collective moves data between GPUs"
def_row nc-multi-node - "multi-node NCCL (the collective across nodes)" "not covered: one machine; NCCL between the daemons of several nodes never runs here"
STATUS[nc-multi-gpu]="not covered"; STATUS[nc-multi-node]="not covered"
((mps)) || STATUS[c-mps]="not run: --mps not given"

json_str() {  # a JSON string of $1
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/}
  s=${s//[$'\001'-$'\037']/}
  printf '"%s"' "$s"
}
md_cell() { local s=${1//|/\/}; printf '%s' "${s//$'\n'/ }"; }
row_md() { local id=$1
  echo "| $(md_cell "${TITLE[$id]}") | $(md_cell "${COVERS[$id]}") | $(md_cell "${RESULT[$id]}") | $(md_cell "${FLOOR[$id]}") | $(md_cell "${PEER[$id]}") | $(md_cell "${TARGET[$id]}") | $(md_cell "${STATUS[$id]}") |"
}
table_header() {
  echo "| row | covers | result | floor (same run) | peer (same run) | target | status |"
  echo "|---|---|---|---|---|---|---|"
}
table_write() {  # [complete]: table.md and table.json, each replaced whole
  local id sep="" k v kv vals
  {
    table_header
    for id in "${ROWS[@]}"; do row_md "$id"; done
  } >"$OUT/table.md.tmp" && mv -f "$OUT/table.md.tmp" "$OUT/table.md"
  {
    printf '{\n  "complete": %s,\n  "bundle": %s,\n  "mode": %s,\n  "bound_s": %s,\n  "budgets_s": {' \
      "$([[ "${1:-}" == complete ]] && echo true || echo false)" "$(json_str "$BUNDLE")" \
      "$(json_str "$( ((dry)) && echo dry-run || echo gpu)$( ((mps)) && echo ' --mps')")" "$BOUND"
    for k in "${STAGES[@]}" mps-stop; do printf '%s%s: %s' "$sep" "$(json_str "$k")" "${BUDGET[$k]}"; sep=", "; done
    printf '},\n  "rows": [\n'
    sep=""
    for id in "${ROWS[@]}"; do
      vals=""
      for kv in ${VALUES[$id]}; do
        k=${kv%%=*}; v=${kv#*=}
        [[ "$v" =~ ^-?[0-9]+(\.[0-9]+)?$ ]] || v=$(json_str "$v")
        vals+="${vals:+, }$(json_str "$k"): $v"
      done
      printf '%s    {"id": %s, "row": %s, "stage": %s, "covers": %s, "result": %s, "floor": %s, "peer": %s, "target": %s, "status": %s, "values": {%s}}' \
        "$sep" "$(json_str "$id")" "$(json_str "${TITLE[$id]}")" "$(json_str "${STAGE_OF[$id]}")" "$(json_str "${COVERS[$id]}")" \
        "$(json_str "${RESULT[$id]}")" "$(json_str "${FLOOR[$id]}")" "$(json_str "${PEER[$id]}")" \
        "$(json_str "${TARGET[$id]}")" "$(json_str "${STATUS[$id]}")" "$vals"
      sep=$',\n'
    done
    printf '\n  ]\n}\n'
  } >"$OUT/table.json.tmp" && mv -f "$OUT/table.json.tmp" "$OUT/table.json"
}
rows_of() { local id; for id in "${ROWS[@]}"; do [[ "${STAGE_OF[$id]}" == "$1" ]] && echo "$id"; done; }
mark_rows() {  # STAGE STATUS: the stage's rows, where still pending or running
  local id
  for id in $(rows_of "$1"); do [[ "${STATUS[$id]}" == pending || "${STATUS[$id]}" == running ]] && STATUS[$id]=$2; done
}
mark_pending() { local id; for id in "${ROWS[@]}"; do [[ "${STATUS[$id]}" == pending ]] && STATUS[$id]=$1; done; }

value() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" "$2" 2>/dev/null | head -1; }
ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.3gx", a / b; else print "n/a"}' || echo "n/a"; }
met() { [[ -n "$1" ]] || { echo "unknown"; return; }; awk -v x="$1" -v op="$2" -v t="$3" 'BEGIN {ok = op == "<=" ? x <= t : x >= t; print ok ? "met" : "MISSED"}'; }
measured() {  # ID VALUE: the row's status from whether VALUE is there and how its stage ended
  local ended=${stage_end[${STAGE_OF[$1]}]:-did not run}
  if [[ -n "$2" ]]; then
    STATUS[$1]="measured"
    [[ "$ended" == passed ]] || STATUS[$1]+=" (stage ${STAGE_OF[$1]} $ended)"
  else
    STATUS[$1]="missing: stage ${STAGE_OF[$1]} $ended"
  fi
}

# Catch2's console summary: "All tests passed (N assertions in M test cases)" or
# "test cases: T | P passed | F failed".
catch_counts() {  # LOG: "passed total failed", or nothing
  local all line
  all=$(sed -n 's/^All tests passed ([0-9]* assertions\{0,1\} in \([0-9]*\) test cases\{0,1\})/\1/p' "$1" | tail -1)
  if [[ -n "$all" ]]; then echo "$all $all 0"; return; fi
  line=$(grep '^test cases:' "$1" | tail -1)
  [[ -n "$line" ]] || return 0
  echo "$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<<"$line" | grep . || echo 0)" \
       "$(sed -n 's/^test cases: *\([0-9]*\).*/\1/p' <<<"$line")" \
       "$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$line" | grep . || echo 0)"
}

catch_failed() {  # LOG: the names of the test cases that failed (Catch2's console report)
  awk '/^-+$/ && length($0) > 60 {if (state == 0) {state = 1; next} if (state == 2) {state = 0; next}}
       state == 1 {name = $0; state = 2; next}
       state == 2 {next}
       / FAILED:$/ && !(name in seen) {seen[name] = 1; printf "%s%s", (n++ ? "; " : ""), name}' "$1" 2>/dev/null
}

# After each stage: fill its rows from its log, then print them.
fill_rows() {
  local s=$1 log="$OUT/stages/$1.log" end=${stage_end[$1]} counts p t f
  case "$s" in
    preflight)
      local c=()
      for p in '^ok ' '^FAIL' '^warn' '^skip'; do c+=("$(grep -c "$p" "$OUT/preflight.txt" 2>/dev/null)"); done
      RESULT[preflight]="checks: ${c[0]} ok, ${c[1]} failed, ${c[2]} warnings, ${c[3]} skipped"
      STATUS[preflight]=$end ;;
    gpu-tests|e2e)
      counts=$(catch_counts "$log")
      if [[ -n "$counts" ]]; then
        read -r p t f <<<"$counts"
        RESULT[$s]="$p of $t test cases passed in ${stage_secs[$s]} s"
        ((f > 0)) && RESULT[$s]+="; $f failed: $(catch_failed "$log")"
        VALUES[$s]="passed=$p total=$t failed=$f"
      elif grep -q '^skipped: no usable CUDA device' "$log" 2>/dev/null; then
        RESULT[$s]=$(grep -m1 '^skipped:' "$log")
      else RESULT[$s]="no Catch2 summary (cut short) after ${stage_secs[$s]} s"; fi
      STATUS[$s]=$end
      if [[ "$s" == gpu-tests ]]; then
        local n r
        n=$(value nccl_init_ms "$log"); r=$(value nccl_rejoin_ms "$log")
        RESULT[d-nccl-init]=${n:+$n ms}; VALUES[d-nccl-init]=${n:+nccl_init_ms=$n}; measured d-nccl-init "$n"
        RESULT[d-nccl-rejoin]=${r:+$r ms}; VALUES[d-nccl-rejoin]=${r:+nccl_rejoin_ms=$r}; measured d-nccl-rejoin "$r"
        [[ -n "$n" ]] && FLOOR[d-nccl-rejoin]="fresh init: $n ms; re-join / init $(ratio "$r" "$n")"
        local sp
        sp=$(value nccl_split_ms "$log")
        RESULT[d-nccl-split]=${sp:+$sp ms}; VALUES[d-nccl-split]=${sp:+nccl_split_ms=$sp}; measured d-nccl-split "$sp"
        [[ -n "$n" ]] && FLOOR[d-nccl-split]="fresh init: $n ms; split / init $(ratio "$sp" "$n")"
      else
        local leg
        leg=$(value legacy_import_ms "$log")
        RESULT[d-legacy]=${leg:+$leg ms}; VALUES[d-legacy]=${leg:+legacy_import_ms=$leg}; measured d-legacy "$leg"
      fi ;;
    python-cpu|python-cuda)
      if [[ "$end" == passed ]]; then
        RESULT[$s]="1 check (3 trainings: gloo, hook, GradBuffer) passed in ${stage_secs[$s]} s: $(grep -m1 '^training:' "$log" | cut -c11-200)"
        grep -q '^sparse:' "$log" && RESULT[$s]+="; $(grep -m1 '^sparse:' "$log" | cut -c9-200)"
        grep -q '^backend:' "$log" && RESULT[$s]+="; $(grep '^backend:' "$log" | tail -1 | cut -c10-260)"
        VALUES[$s]="passed=1 total=1 failed=0"
      else
        RESULT[$s]="0 of 1 check passed (${stage_secs[$s]} s): $(grep -v '^\s*$' "$log" 2>/dev/null | tail -1 | cut -c1-200)"
        VALUES[$s]="passed=0 total=1 failed=1"
      fi
      STATUS[$s]=$end ;;
    kernels)
      local k c
      k=$(value kernels_ms "$log"); c=$(value copy_ms "$log")
      RESULT[a-kernels]=${k:+$k ms}; VALUES[a-kernels]="${k:+kernels_ms=$k} ${c:+copy_ms=$c}"
      FLOOR[a-kernels]="2 x D2D copy: ${c:-missing} ms; gradsync / copy $(ratio "$k" "$c")"
      [[ -n "$k" && -n "$c" ]] && TARGET[a-kernels]+=": $(met "$(awk -v a="$k" -v b="$c" 'BEGIN {print a / b}')" "<=" 1.25)"
      measured a-kernels "$k" ;;
    torch-flatten)
      local t k
      t=$(value median_ms "$log"); k=$(value kernels_ms "$OUT/stages/kernels.log")
      RESULT[a-torch]=${t:+$t ms}; VALUES[a-torch]=${t:+median_ms=$t}
      PEER[a-torch]="torch / gradsync: $(ratio "$t" "$k") (gradsync ${k:-missing} ms)"
      [[ -n "$t" && -n "$k" ]] && TARGET[a-torch]+=": $(met "$(awk -v a="$t" -v b="$k" 'BEGIN {print a / b}')" ">=" 1.5)"
      measured a-torch "$t" ;;
    daemon-bench)
      local rank0 st fl p50 p99 ca cd vmm
      rank0=$(grep 'rank=0' "$log" 2>/dev/null)
      st=$(value step_ms <(echo "$rank0")); fl=$(value copy_floor_ms <(echo "$rank0"))
      p50=$(value rt4k_p50_us <(echo "$rank0")); p99=$(value rt4k_p99_us <(echo "$rank0"))
      ca=$(value compute_ms <(echo "$rank0")); cd=$(value compute_during_allreduce_ms <(echo "$rank0"))
      RESULT[b-step]=${st:+$st ms}; VALUES[b-step]="${st:+step_ms=$st} ${fl:+copy_floor_ms=$fl}"
      FLOOR[b-step]="D2D copy of 2 x 100 MiB: ${fl:-missing} ms; step / copy $(ratio "$st" "$fl")"
      PEER[b-step]="none on one GPU (NCCL takes one rank per GPU)"; measured b-step "$st"
      RESULT[b-rt]="${p50:-missing} / ${p99:-missing} us"; VALUES[b-rt]="${p50:+rt4k_p50_us=$p50} ${p99:+rt4k_p99_us=$p99}"
      [[ -n "$p50" ]] && TARGET[b-rt]+=": $(met "$p50" "<=" 30)"; measured b-rt "$p50"
      local fp ft
      fp=$(value p50_us <(grep 'mode=processes' "$log" 2>/dev/null)); ft=$(value p50_us <(grep 'mode=threads' "$log" 2>/dev/null))
      FLOOR[b-rt]="the same signalling without gradsync (gradsync-gpu-ipc-floor), p50: 2 processes ${fp:-missing} us, 1 process ${ft:-missing} us; gradsync / 2 processes $(ratio "$p50" "$fp")"
      VALUES[b-rt]+=" ${fp:+floor_processes_p50_us=$fp} ${ft:+floor_threads_p50_us=$ft}"
      RESULT[c-nomps]=${cd:+$cd ms}; VALUES[c-nomps]="${cd:+compute_during_allreduce_ms=$cd} ${ca:+compute_ms=$ca}"
      FLOOR[c-nomps]="kernel alone: ${ca:-missing} ms; slowdown $(ratio "$cd" "$ca")"; measured c-nomps "$cd"
      vmm=$(sed -n 's/.*CUDA VMM segment of 104857600 bytes.*import_ms=\([0-9.]*\).*/\1/p' "$OUT/daemons/daemon-bench/gradsyncd.log" 2>/dev/null | head -1)
      RESULT[d-vmm]=${vmm:+$vmm ms}; VALUES[d-vmm]=${vmm:+import_ms=$vmm}; measured d-vmm "$vmm" ;;
    mps)
      local rank0 ma md ms mp
      rank0=$(grep 'rank=0' "$log" 2>/dev/null)
      ma=$(value compute_ms <(echo "$rank0")); md=$(value compute_during_allreduce_ms <(echo "$rank0"))
      ms=$(value step_ms <(echo "$rank0")); mp=$(value rt4k_p50_us <(echo "$rank0"))
      RESULT[c-mps]=${md:+$md ms}; VALUES[c-mps]="${md:+compute_during_allreduce_ms=$md} ${ma:+compute_ms=$ma} ${ms:+step_ms=$ms} ${mp:+rt4k_p50_us=$mp}"
      FLOOR[c-mps]="kernel alone: ${ma:-missing} ms; slowdown $(ratio "$md" "$ma")"
      local fm
      fm=$(value p50_us <(grep 'mode=processes' "$log" 2>/dev/null))
      PEER[c-mps]="under MPS: step ${ms:-missing} ms, 4 KiB p50 ${mp:-missing} us (its floor, 2 processes: ${fm:-missing} us)"
      measured c-mps "$md" ;;
  esac
}

# ---------------------------------------------------------------------------------------------
# The main layer: the stages in order, each in the background under its timeout, waited for so
# that the bound's TERM reaches the trap at once.

declare -A stage_end stage_secs
fail=0 current="" stage_pid="" stage_t0=0

group_alive() {  # PGID: whether a process of that group still runs (zombies do not count: an
  local f line state pgrp  # init that does not reap them would keep them in the group)
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    read -r state _ pgrp _ <<<"${line##*) }"
    [[ "$pgrp" == "$1" && "$state" != Z ]] && return 0
  done
  return 1
}
end_group() {  # PGID: TERM, then KILL after 2 s, to the process group a stage's `timeout` leads
  local i
  kill -TERM -- "-$1" 2>/dev/null || return 0
  for ((i = 0; i < 10; i++)); do group_alive "$1" || return 0; sleep 0.2; done
  kill -KILL -- "-$1" 2>/dev/null
  return 0
}

# Runs one stage or helper: NAME; sets stage_end[NAME] and stage_secs[NAME].
run_stage() {
  local name=$1 budget=${BUDGET[$1]} left t0 rc fake=""
  left=$((GRADSYNC_DEVICE_CHECK_DEADLINE - END_RESERVE - $(now_s)))
  if ((left < STAGE_KILL_GRACE + 1)); then
    stage_end[$name]="not run: the overall bound (${BOUND} s) was reached"; stage_secs[$name]=0
    note "stage $name: not run, only ${left} s left of the overall bound"; return 1
  fi
  if ((budget > left)); then note "stage $name: its budget is cut from $budget s to the $left s left of the overall bound"; budget=$left; fi
  [[ "${GRADSYNC_DEVICE_CHECK_FAKE_STAGE:-}" == "$name":* ]] && fake=${GRADSYNC_DEVICE_CHECK_FAKE_STAGE#*:}
  mkdir -p "$SCRATCH/$name" "$OUT/daemons/$name"
  echo
  echo "== $name (budget $budget s)$([[ -n "$fake" ]] && echo " [test hook: $fake]")"
  current=$name
  mark_rows "$name" running
  table_write
  t0=$(now_us)
  stage_t0=$t0
  local grace=$((budget >= 10 ? STAGE_KILL_GRACE : 1))  # (budgets under 10 s: tests)
  local env=(GRADSYNC_DEVICE_CHECK_ROLE="stage:$name" TMPDIR="$SCRATCH/$name" GRADSYNC_SCRATCH_DIR="$SCRATCH/$name"
             GRADSYNC_DEVICE_DAEMON_LOGS="$OUT/daemons/$name")
  local command=(bash "$SELF" "${ARGS[@]}")
  # (A test hook's hang: a loop named for the stage, which run.sh's tests look for afterwards.)
  [[ -n "$fake" ]] && command=(bash -c 'while :; do sleep 1; done' "fake-hang:$OUT:$name")
  if [[ "$fake" == hang-untimed ]]; then  # as a bug would: no timeout, in a process group of its own
    env "${env[@]}" setsid "${command[@]}" >"$OUT/stages/$name.log" 2>&1 </dev/null &
  else
    env "${env[@]}" timeout -k "$grace" $((budget - grace)) "${command[@]}" \
      >"$OUT/stages/$name.log" 2>&1 </dev/null &
  fi
  stage_pid=$!
  echo "$stage_pid" >"$SCRATCH/stage.pgid"
  wait "$stage_pid"
  rc=$?
  end_group "$stage_pid"  # anything the stage left behind in its group (a daemon, a trainer)
  stage_pid="" current=""
  rm -f "$SCRATCH/stage.pgid"
  stage_secs[$name]=$(secs_since "$t0")
  case $rc in
    0) stage_end[$name]=passed ;;
    124|137) stage_end[$name]="timed out at its budget of $budget s" ;;
    77) stage_end[$name]="skipped: no usable CUDA device (exit 77)" ;;
    *) stage_end[$name]="FAILED (exit $rc)" ;;
  esac
  keep_scratch "$name"
  note "stage $name: ${stage_end[$name]} after ${stage_secs[$name]} s; its output: $OUT/stages/$name.log"
  return "$rc"
}
keep_scratch() {  # STAGE: the plain files its temporary folders still hold, into $OUT/scratch
  [[ -d "$SCRATCH/$1" ]] || return 0
  mkdir -p "$OUT/scratch/$1"
  (cd "$SCRATCH/$1" && timeout -k 1 3 find . -type f -exec cp --parents -t "$OUT/scratch/$1" {} + 2>/dev/null) || true
}
show_stage() {  # STAGE: key lines of its output, its tail on failure, and its rows
  local s=$1 log="$OUT/stages/$1.log" id
  grep -E '^(nccl|legacy|raw|daemon_bench|training|resnet50|skipped|MPS):' "$log" 2>/dev/null | head -20
  grep -E '^(All tests passed|test cases:)' "$log" 2>/dev/null | tail -1
  if [[ "${stage_end[$s]}" != passed ]]; then
    echo "-- the last 30 lines of $log:"
    tail -30 "$log" 2>/dev/null
  fi
  fill_rows "$s"
  for id in $(rows_of "$s"); do row_md "$id"; done
  table_write
}
stage() {  # NAME: runs it (with before_NAME and after_NAME if defined), shows it, counts a failure
  local name=$1
  if declare -F "before_$name" >/dev/null; then "before_$name"; fi
  run_stage "$name"
  if declare -F "after_$name" >/dev/null; then "after_$name"; fi
  [[ "${stage_end[$name]}" == passed ]] || fail=1
  if [[ "${stage_end[$name]}" == "not run:"* ]]; then mark_rows "$name" "${stage_end[$name]}"; table_write; return; fi
  show_stage "$name"
}
# The daemon benchmark's daemon logs to a fixed file (bench_daemon.cc: /tmp/gradsync-daemon-bench.log;
# in $GRADSYNC_SCRATCH_DIR too, should it move there): cleared before, kept after.
keep_bench_log() {  # STAGE
  local f
  for f in "$SCRATCH/$1/gradsync-daemon-bench.log" "$BENCH_LOG"; do
    if [[ -e "$f" ]]; then cp "$f" "$OUT/daemons/$1/gradsyncd.log"; return; fi
  done
}
before_daemon-bench() { rm -f "$BENCH_LOG"; }
after_daemon-bench() { keep_bench_log daemon-bench; }
before_mps() {
  rm -f "$BENCH_LOG"
  mkdir -p "$OUT/mps" "$SCRATCH/mps-pipe"
  export CUDA_MPS_PIPE_DIRECTORY="$SCRATCH/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$OUT/mps"
}
after_mps() {  # stops the MPS control daemon, bounded as a stage of its own
  keep_bench_log mps
  [[ -e "$SCRATCH/mps-running" ]] || return 0
  GRADSYNC_DEVICE_CHECK_FAKE_STAGE="" run_stage mps-stop
  if [[ "${stage_end[mps-stop]}" == passed ]]; then rm -f "$SCRATCH/mps-running"
  else note "MPS did not stop: ${stage_end[mps-stop]}"; fail=1; fi
}

finish() {  # STATUS [complete]: the NCCL log's warnings, the table, the end
  local rc=$1 n
  n=$(cat "$OUT"/nccl/* 2>/dev/null | grep -c .)
  echo
  if ((n)); then note "NCCL logged $n lines (NCCL_DEBUG=WARN) in $OUT/nccl/; the first:"; cat "$OUT"/nccl/* 2>/dev/null | grep . | head -5
  else note "NCCL logged no warnings"; fi
  table_write "${2:-}"
  timeout -k 1 2 find "$OUT/daemons" "$OUT/scratch" -mindepth 1 -type d -empty -delete 2>/dev/null
  echo
  echo "## The device check's table ($( ((dry)) && echo "dry run, " )bundle $BUNDLE)"
  echo
  cat "$OUT/table.md"
  echo
  note "exit $rc; everything is under $OUT (run.log, preflight.txt, table.json, stages/, daemons/, nccl/)"
  : >"$SCRATCH/finished"
  exit "$rc"
}

on_bound() {  # the outer layer's TERM: the overall bound, or run.sh itself was interrupted
  trap '' TERM INT HUP
  set +u  # finish, whatever is unset
  [[ "${GRADSYNC_DEVICE_CHECK_FAKE_TRAP:-}" == hang ]] && sleep 100000
  local why="the overall bound ($BOUND s) was reached" cut="timed out: the overall bound ($BOUND s) ended it" rc=124
  if [[ -e "$SCRATCH/interrupted" ]]; then why="run.sh was interrupted ($(cat "$SCRATCH/interrupted"))" cut="cut: $why" rc=130; fi
  echo
  note "stopped: $why${current:+ during stage $current}"
  if [[ -n "$stage_pid" ]]; then end_group "$stage_pid"; rm -f "$SCRATCH/stage.pgid"; fi
  if [[ -n "$current" ]]; then
    stage_end[$current]=$cut
    stage_secs[$current]=$(secs_since "$stage_t0")
    keep_scratch "$current"
    fill_rows "$current" 2>/dev/null
    for id in $(rows_of "$current"); do [[ "${STATUS[$id]}" == measured ]] || STATUS[$id]=$cut; done
  fi
  mark_pending "not run: $why"
  finish "$rc" complete
}

main() {
  trap on_bound TERM INT HUP
  mkdir -p "$OUT/stages" "$OUT/daemons" "$OUT/nccl" "$OUT/scratch"
  export NCCL_DEBUG=WARN NCCL_DEBUG_FILE="$OUT/nccl/nccl.%h.%p.log"
  note "bundle $BUNDLE; output $OUT; $( ((dry)) && echo "dry run" || echo "GPU run")$( ((mps)) && echo ", with MPS")"
  local s total=0 line="" list=(preflight)
  if ((!dry)); then
    for s in "${STAGES[@]:1}"; do if [[ "$s" != mps ]] || ((mps)); then list+=("$s"); fi; done
  fi
  ((mps && !dry)) && list+=(mps-stop)
  for s in "${list[@]}"; do line+=" $s ${BUDGET[$s]} s,"; total=$((total + BUDGET[$s])); done
  ((mps && !dry)) && unset 'list[-1]'
  note "budgets:${line%,} (sum $total s); overall bound $BOUND s, then ${OUTER_KILL_GRACE} s to end"
  table_write
  echo "Rows known before any stage:"
  table_header
  for id in nc-multi-gpu nc-multi-node; do row_md "$id"; done

  stage preflight
  echo "-- preflight.txt:"
  cat "$OUT/preflight.txt"
  if ((dry)); then
    mark_pending "not run: dry run"
    finish "$fail" complete
  fi
  if [[ "${stage_end[preflight]}" != passed ]]; then
    note "the preflight failed (the FAIL lines above say what is wrong): no stage runs"
    mark_pending "not run: the preflight failed"
    finish 3 complete
  fi
  [[ -s "$SCRATCH/nccl-lib" ]] && NCCL_LIB=$(cat "$SCRATCH/nccl-lib")
  export LIBS="$BUNDLE/lib${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "our binaries run with LD_LIBRARY_PATH=$LIBS"

  # Warms torch's files into the page cache while the C++ stages run (bounded, output dropped):
  # the Python stages' budgets assume cold starts, this makes them warmer.
  timeout -k 2 120 python3 -c 'import torch' >/dev/null 2>&1 &
  for s in "${list[@]:1}"; do stage "$s"; done
  finish "$fail" complete
}

# ---------------------------------------------------------------------------------------------
# The outer layer: picks $OUT, copies all output to $OUT/run.log, runs the main layer under the
# overall bound, and if that layer could not finish (killed, or a bug), ends what it left and
# prints the last saved table, marking the rows it left running or pending.

outer() {
  local announce=""
  if [[ -z "${OUT:-}" ]]; then
    OUT="$PWD/device-out-$(date +%Y%m%d-%H%M%S)"
    announce="OUT was not set: the output goes to $OUT"
  fi
  mkdir -p "$OUT" || { echo "run.sh: cannot make $OUT" >&2; exit 2; }
  OUT=$(cd "$OUT" && pwd)
  exec > >(exec tee -a "$OUT/run.log") 2>&1
  local tee_pid=$!
  [[ -n "$announce" ]] && note "$announce"
  note "started $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n); overall bound $BOUND s"
  # Short and private: daemons' sockets go under it (108-byte limit, folders only we can write).
  SCRATCH=$(mktemp -d /tmp/gsdc.XXXXXX) || { note "mktemp failed"; exit 2; }
  export OUT SCRATCH GRADSYNC_DEVICE_CHECK_ROLE=main GRADSYNC_DEVICE_CHECK_DEADLINE=$(($(now_s) + BOUND))
  # In the background, so that an INT or TERM to run.sh reaches the main layer (its trap prints
  # and saves the table): `timeout` runs in a process group of its own, which a Ctrl-C misses.
  timeout -k "$OUTER_KILL_GRACE" "$BOUND" bash "$SELF" "$@" &
  local main_pid=$! rc
  trap 'echo SIGINT >"$SCRATCH/interrupted"; kill -TERM "$main_pid" 2>/dev/null' INT
  trap 'echo SIGTERM >"$SCRATCH/interrupted"; kill -TERM "$main_pid" 2>/dev/null' TERM
  trap 'echo SIGHUP >"$SCRATCH/interrupted"; kill -TERM "$main_pid" 2>/dev/null' HUP
  wait "$main_pid"
  rc=$?
  while kill -0 "$main_pid" 2>/dev/null; do wait "$main_pid"; rc=$?; done  # a trap interrupted the wait
  # A wait a trap interrupted says 128 + the signal, not how the main layer ended; if bash
  # reaped it meanwhile, one more wait gives its stored status (127: nothing stored).
  local stored i
  wait "$main_pid" 2>/dev/null
  stored=$?
  ((stored != 127)) && rc=$stored
  # Interrupted: the main layer's trap may still be saving the table (its children were told
  # too); give it the time its own grace allows before calling it unfinished.
  if [[ -e "$SCRATCH/interrupted" ]]; then
    for ((i = 0; i < 50; i++)); do [[ -e "$SCRATCH/finished" ]] && break; sleep 0.1; done
  fi
  trap - INT TERM HUP
  ((rc == 137)) && rc=124  # killed after the bound's grace: still "the bound was reached"
  if [[ -s "$SCRATCH/stage.pgid" ]]; then end_group "$(cat "$SCRATCH/stage.pgid")"; fi
  if [[ -e "$SCRATCH/mps-running" ]]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$SCRATCH/mps-pipe" timeout -k 1 4 nvidia-cuda-mps-control ||
      note "could not stop the MPS control daemon (pipe folder $SCRATCH/mps-pipe)"
  fi
  if [[ ! -e "$SCRATCH/finished" ]]; then
    local why="run.sh's main layer ended unexpectedly (exit $rc): a bug in run.sh"
    ((rc == 124 || rc == 137)) && why="the overall bound ($BOUND s) was reached and run.sh's own trap did not finish"
    [[ -e "$SCRATCH/interrupted" ]] && why="run.sh was interrupted ($(cat "$SCRATCH/interrupted")) and its trap did not finish"
    echo
    note "$why; the last saved table, with the rows it left running or pending marked:"
    if [[ -e "$OUT/table.json" ]]; then
      sed -i -e "s/\"status\": \"running\"/\"status\": \"cut: $why\"/" \
             -e "s/\"status\": \"pending\"/\"status\": \"not run: $why\"/" "$OUT/table.json"
      sed -i -e "s/| running |\$/| cut: $why |/" -e "s/| pending |\$/| not run: $why |/" "$OUT/table.md"
      echo
      cat "$OUT/table.md"
    else
      note "no table was saved"
    fi
    ((rc == 0)) && rc=1
  fi
  # The device tool brings back at most 8 files from $OUT, at most 2 folders down: keep the
  # summary files as they are and pack everything else into one archive. (run.log is still
  # being written by tee, so it stays out; tar exits 1 when a file changed while it read.)
  local archive="$SCRATCH/device-out.tar.gz" packed
  (cd "$OUT" && timeout -k 1 20 tar -czf "$archive" --exclude=./run.log --exclude=./device-out.tar.gz .)
  packed=$?
  if ((packed <= 1)) && mv -f "$archive" "$OUT/device-out.tar.gz"; then
    find "$OUT" -mindepth 1 -maxdepth 1 ! -name run.log ! -name table.json ! -name table.md \
      ! -name preflight.txt ! -name device-out.tar.gz -exec rm -rf {} +
    note "every log is in \$OUT/device-out.tar.gz (stages/, daemons/, nccl/, nvidia-smi-q.txt, mps/, scratch/); run.log, table.json, table.md and preflight.txt beside it"
  else
    note "packing \$OUT failed (tar exit $packed): the files stay as they are"
  fi
  timeout -k 1 3 rm -rf "$SCRATCH"
  # Let tee write the last lines before this process ends (bounded: 2 s).
  exec >&- 2>&-
  local i
  for ((i = 0; i < 20; i++)); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
  exit "$rc"
}

case "${GRADSYNC_DEVICE_CHECK_ROLE:-}" in
  "") outer "$@" ;;
  main) main ;;
  stage:*)
    name=${GRADSYNC_DEVICE_CHECK_ROLE#stage:}
    if [[ "$name" == mps-stop ]]; then echo quit | nvidia-cuda-mps-control; exit; fi
    "stage_$name" ;;
  *) echo "run.sh: unknown GRADSYNC_DEVICE_CHECK_ROLE ${GRADSYNC_DEVICE_CHECK_ROLE}" >&2; exit 2 ;;
esac
