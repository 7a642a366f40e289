#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang-16 and runs them.
#   tests/fuzz/run.sh BUILD_DIR build            configure and build (once; then incremental)
#   tests/fuzz/run.sh BUILD_DIR run NAME SECONDS run one harness from its seed corpus
#                                                (tests/fuzz/corpus/NAME, copied: the repository's
#                                                seeds stay as they are) for SECONDS, then print
#                                                its executions; a crash fails with the input kept
#                                                under BUILD_DIR/crashes/NAME.
# NAME: frame, request or peer_store. A long run: tests/fuzz/run.sh build/fuzz run request 3600
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$1"
what="$2"
if [[ "$what" == build ]]; then
  if ! command -v clang++-16 >/dev/null; then
    echo "fuzz: clang++-16 is missing (.ci/install-deps installs clang-16 and libclang-rt-16-dev)" >&2
    exit 1
  fi
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  exec cmake --build "$build"
fi
name="$3"
seconds="$4"
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$here/corpus/$name/"* "$corpus/"
mkdir -p "$build/crashes/$name"
# One process, bounded input size and memory; ASan and UBSan abort on the first finding.
# Inputs as large as the code under test needs: a frame header decides everything past a few
# KiB, a peer call sequence fits in 4 KiB; requests get room for registrations of many tensors.
case "$name" in
  frame) max_len=8192 ;;
  peer_store) max_len=4096 ;;
  *) max_len=65536 ;;
esac
status=0
"$build/${name}_fuzzer" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$build/crashes/$name/" -print_final_stats=1 "$corpus" >"$corpus.log" 2>&1 || status=$?
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)|==[0-9]+==ERROR|^SUMMARY|Test unit written" "$corpus.log" || true
if ((status != 0)); then
  echo "fuzz: $name failed (exit $status); the last lines of its log:" >&2
  tail -n 40 "$corpus.log" >&2
fi
rm -f "$corpus.log"
exit "$status"
