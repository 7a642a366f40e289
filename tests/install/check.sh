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
fail() { echo "check.sh: $*" >&2; exit 1; }
# The unit names what was installed, under this prefix: the daemon, its configuration, the README.
unit="$prefix/lib/systemd/system/gradsyncd.service"
grep -q "^ExecStart=$prefix/sbin/gradsyncd --config $prefix/etc/gradsync/gradsyncd.toml " "$unit" ||
  fail "the unit's ExecStart does not follow the prefix: $(grep ^ExecStart "$unit")"
doc=$(sed -n 's#^Documentation=file://##p' "$unit")
[[ -f "$doc" && "$doc" == "$prefix/"* ]] || fail "the unit's Documentation= names '$doc', which was not installed"
[[ -f "$(dirname "$doc")/docs/troubleshooting.md" ]] || fail "docs/ was not installed beside the README"
# The shipped configuration starts as is (loopback peer service): checked by starting it below.
# The library: a versioned SONAME, and only the C API exported.
soname=$(objdump -p "$prefix/lib/libgradsync_client.so" | awk '$1 == "SONAME" {print $2}')
[[ "$soname" =~ ^libgradsync_client\.so\.[0-9]+\.[0-9]+$ ]] || fail "SONAME '$soname' has no version"
others=$(nm -D --defined-only "$prefix/lib/libgradsync_client.so" | awk '{print $3}' | grep -v '^gs_' | grep -v '^$' || true)
[[ -z "$others" ]] || fail "libgradsync_client.so exports more than gs_*: $(echo $others | head -c 400)"
# The Python package, with the daemon's version.
version=$("$prefix/sbin/gradsyncd" --version | awk '{print $2}')
pyversion=$(PYTHONPATH="$prefix/lib/python3/dist-packages" python3 -c 'import gradsync; print(gradsync.__version__)')
[[ "$pyversion" == "$version" ]] || fail "the installed Python package says $pyversion, gradsyncd $version"
# One way: CMake's find_package.
cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
# The other: pkg-config.
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists gradsync
cc -o "$work/trainer-pc" "$here/trainer.c" $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs gradsync)
# The installed configuration as shipped (peer port 0 only so that tests can run side by side).
sed 's/^peer-listen = .*/peer-listen = "127.0.0.1:0"/' "$prefix/etc/gradsync/gradsyncd.toml" >"$work/gradsyncd.toml"
grep -q '^peer-listen = "127.0.0.1:' "$prefix/etc/gradsync/gradsyncd.toml" || fail "the shipped config's peer service is not on loopback"
"$prefix/sbin/gradsyncd" --config "$work/gradsyncd.toml" --socket "$work/gradsync.sock" --admin none 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do [[ -S "$work/gradsync.sock" ]] && break; sleep 0.05; done
LD_LIBRARY_PATH="$prefix/lib" "$work/cmake-build/trainer" "$work/gradsync.sock"
LD_LIBRARY_PATH="$prefix/lib" "$work/trainer-pc" "$work/gradsync.sock"
echo "check.sh: installed package ok, both ways"
# The README's C++ example, exactly as printed, against the installed package: two ranks.
awk '/^```cpp$/ {on = 1; next} /^```$/ {on = 0} on' "$here/../../README.md" >"$work/readme_trainer.cc"
[[ -s "$work/readme_trainer.cc" ]] || fail "the README has no \`\`\`cpp example"
c++ -std=c++20 -o "$work/readme-trainer" "$work/readme_trainer.cc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs gradsync)
ranks=()
for rank in 0 1; do
  GRADSYNC_SOCKET="$work/gradsync.sock" LD_LIBRARY_PATH="$prefix/lib" timeout 60 "$work/readme-trainer" "$rank" 2 \
    >"$work/readme-$rank.out" 2>&1 &
  ranks+=($!)
done
wait "${ranks[@]}" || true
for rank in 0 1; do
  grep -q "^rank $rank: 0.5 (expected 0.5)$" "$work/readme-$rank.out" ||
    fail "the README's C++ example, rank $rank: $(cat "$work/readme-$rank.out")"
done
echo "check.sh: the README's C++ example builds against the installed package and averages"
