#!/usr/bin/env bash
# Builds the bundle a lent GPU machine runs (tests/device/run.sh): the GPU test and benchmark
# binaries, stripped of debug info, plus every shared library they need that such a machine
# lacks (it has CUDA 13, Python 3.12 with PyTorch and nvidia-nccl-cu13, but none of our Debian
# packages). The CUDA driver (libcuda) and NCCL are left out: run.sh takes them from the machine.
# The bundle must stay within the device tool's 64 MiB.
#
#   tests/device/bundle.sh BUILD_DIR OUT_DIR     e.g. tests/device/bundle.sh build device-bundle
set -euo pipefail

build=${1:?usage: bundle.sh BUILD_DIR OUT_DIR}
out=${2:?usage: bundle.sh BUILD_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
limit=$((64 * 1024 * 1024))
binaries=(gradsync_gpu_tests gradsync_gpu_e2e_tests gradsync-gpu-bench gradsync-gpu-daemon-bench gradsync-gpu-ipc-floor
          gradsyncd)
# On every Linux machine, or provided by the GPU machine itself. libstdc++ too: Debian 12's needs
# glibc 2.36, which an Ubuntu 22.04 machine lacks, while our binaries need only GLIBC_2.34 and
# GLIBCXX_3.4.30, which the machine's own libstdc++ (GCC 12+) provides.
system='^(linux-vdso|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libnccl\.so)'

for b in "${binaries[@]}"; do
  if [[ ! -x "$build/bin/$b" ]]; then
    echo "bundle.sh: $build/bin/$b is missing: build with the CUDA backend first (GRADSYNC_CUDA=ON)" >&2
    exit 1
  fi
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "${binaries[@]}"; do
  objcopy --strip-debug "$build/bin/$b" "$out/bin/$b"
  ldd "$build/bin/$b" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $system ]]; then continue; fi
    [[ -e "$out/lib/$name" ]] || objcopy --strip-debug "$path" "$out/lib/$name"
  done
done
# run.sh, and what it runs: the torch peer, and the wrapper that keeps every test daemon's log.
cp "$here/run.sh" "$here/torch_flatten.py" "$here/gradsyncd-logged.sh" "$out/"
chmod +x "$out/run.sh" "$out/gradsyncd-logged.sh"
# The Python package with its C API library (found beside it; its own libraries come from
# lib/ through its RPATH, $ORIGIN/../../lib), and the CUDA training check with its workers.
pylib="$build/python/gradsync/libgradsync_client.so"
if [[ ! -e "$pylib" ]]; then
  echo "bundle.sh: $pylib is missing: build first" >&2
  exit 1
fi
mkdir -p "$out/python" "$out/python-tests/workers"
cp -r "$build/python/gradsync" "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
objcopy --strip-debug "$pylib" "$out/python/gradsync/libgradsync_client.so"
ldd "$pylib" | awk '/=> \// {print $1, $3}' | while read -r name path; do
  if [[ "$name" =~ $system ]]; then continue; fi
  [[ -e "$out/lib/$name" ]] || objcopy --strip-debug "$path" "$out/lib/$name"
done
cp "$here/../python/harness.py" "$here/../python/training_check.py" "$out/python-tests/"
cp "$here/../python/workers/train.py" "$here/../python/workers/sparse.py" "$here/../python/workers/ops.py" \
  "$here/../python/workers/backend.py" "$here/../python/workers/backend_errors.py" \
  "$here/../python/workers/backend_fsdp.py" \
  "$out/python-tests/workers/"

# Everything resolves from the bundle, except what the GPU machine provides.
missing=0
for b in "${binaries[@]}"; do
  while read -r line; do
    echo "bundle.sh: $b needs $line, which is neither in the bundle nor provided by the GPU machine" >&2
    missing=1
  done < <(LD_LIBRARY_PATH="$out/lib" ldd "$out/bin/$b" | awk '/=> \// {print $1, $3}' |
           grep -Ev "$system" | grep -v " $out/lib/" || true)
done
bundle_lib=$(readlink -f "$out/lib")
while read -r name path; do
  [[ "$(readlink -f "$path")" == "$bundle_lib"/* ]] && continue
  echo "bundle.sh: libgradsync_client.so needs $name ($path), which is neither in the bundle nor provided by the GPU machine" >&2
  missing=1
done < <(LD_LIBRARY_PATH="$out/lib" ldd "$out/python/gradsync/libgradsync_client.so" | awk '/=> \// {print $1, $3}' |
         grep -Ev "$system" || true)
size=$(du -sb "$out" | cut -f1)
echo "bundle: $out, $((size / 1024 / 1024)) MiB of at most 64 MiB"
find "$out/bin" "$out/lib" -maxdepth 1 -type f -printf '  %f %s\n'
if (( size > limit )); then
  echo "bundle.sh: the bundle is $size bytes, over the device tool's limit of $limit" >&2
  exit 1
fi
exit "$missing"
