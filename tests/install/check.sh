#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then a tiny trainer built against what it installed,
# both ways (find_package(gradsync) and pkg-config), each run against a real gradsyncd.
#   tests/install/check.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: check.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
daemon=""
trap '[[ -n "$daemon" ]] && kill "$daemon" 2>/dev/null; rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in sbin/gradsyncd bin/gradsyncctl include/gradsync/c_api.h lib/libgradsync_client.so \
         lib/cmake/gradsync/gradsyncConfig.cmake lib/pkgconfig/gradsync.pc lib/systemd/system/gradsyncd.service \
         lib/sysusers.d/gradsync.conf lib/tmpfiles.d/gradsync.conf etc/gradsync/gradsyncd.toml; do
  [[ -e "$prefix/$f" ]] || { echo "check.sh: cmake --install did not install $f" >&2; exit 1; }
done
# One way: CMake's find_package.
cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
# The other: pkg-config.
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists gradsync
cc -o "$work/trainer-pc" "$here/trainer.c" $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs gradsync)
"$prefix/sbin/gradsyncd" --socket "$work/gradsync.sock" --peer-listen 127.0.0.1:0 --admin none 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do [[ -S "$work/gradsync.sock" ]] && break; sleep 0.05; done
LD_LIBRARY_PATH="$prefix/lib" "$work/cmake-build/trainer" "$work/gradsync.sock"
LD_LIBRARY_PATH="$prefix/lib" "$work/trainer-pc" "$work/gradsync.sock"
echo "check.sh: installed package ok, both ways"
