#!/usr/bin/env bash
# The .deb in a clean Debian 12 root, booted under a real systemd (systemd-nspawn):
#   1. build the .deb (cpack) and a clean root (debootstrap, kept in BUILD_DIR/deb-test/base);
#   2. install the .deb there with apt (it fetches the dependencies dpkg-shlibdeps named);
#   3. boot the root, start gradsyncd.service as shipped (its own user, its own config);
#   4. run the demo against it with --socket, ask `gradsyncctl status`, `systemctl reload`;
#   5. stop the service and check that it drained and exited cleanly.
#   tests/package/deb_test.sh BUILD_DIR
# Exits 77 (skipped) and says why when this machine cannot: not root, a tool missing, or no
# Debian mirror to make the root from. Anything else that fails is a failure.
set -euo pipefail
build=$(cd "${1:?usage: deb_test.sh BUILD_DIR}" && pwd)
skip() { echo "deb_test: SKIPPED: $*"; exit 77; }
fail() { echo "deb_test: FAILED: $*" >&2; exit 1; }
say() { echo "deb_test: $*"; }

[[ $EUID -eq 0 ]] || skip "needs root (debootstrap, systemd-nspawn)"
for tool in debootstrap systemd-nspawn nsenter cpack dpkg-deb; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (.ci/install-deps installs it)"
done

# 1. The package, and a clean root made once per build folder.
(cd "$build" && cpack -G DEB >"$build/deb-test.cpack.log" 2>&1) || fail "cpack: $(tail -5 "$build/deb-test.cpack.log")"
deb=$(ls -t "$build"/gradsync_*_amd64.deb | head -1)
say "package $(basename "$deb") ($(du -h "$deb" | cut -f1))"
base="$build/deb-test/base"
if [[ ! -f "$base/.complete" ]]; then
  rm -rf "$base"
  mkdir -p "$(dirname "$base")"
  say "making a clean Debian 12 root with debootstrap (once per build folder)"
  debootstrap --include=systemd,dbus bookworm "$base" http://deb.debian.org/debian >"$build/deb-test/debootstrap.log" 2>&1 ||
    skip "debootstrap could not make a Debian 12 root (no mirror?): $(tail -2 "$build/deb-test/debootstrap.log")"
  touch "$base/.complete"
fi
work=$(mktemp -d /var/tmp/gradsync-deb-XXXXXX)
nspawn=""
cleanup() {
  if [[ -n "$nspawn" ]] && kill -0 "$nspawn" 2>/dev/null; then
    kill -TERM "$nspawn" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
root="$work/root"
cp -a "$base" "$root"
cp "$deb" "$root/root/gradsync.deb"  # not /tmp: nspawn mounts a tmpfs there
container() { systemd-nspawn -q --register=no --keep-unit -D "$root" --pipe "$@"; }

# 2. apt installs it with what it depends on, as an operator would.
say "apt install ./gradsync.deb in the clean root"
container /bin/sh -c 'apt-get update -qq' >"$work/apt.log" 2>&1 ||
  skip "apt-get update failed in the clean root (no mirror?): $(tail -2 "$work/apt.log")"
container /bin/sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /root/gradsync.deb' \
  >>"$work/apt.log" 2>&1 || fail "apt could not install the .deb: $(tail -15 "$work/apt.log")"
container /usr/bin/getent passwd gradsync >/dev/null || fail "the package made no user gradsync"

# 3. Boot it.
say "booting the root under systemd"
# Its own network namespace: the shipped peer port (127.0.0.1:29590) must not meet the host's.
systemd-nspawn -q --register=no --keep-unit --private-network -b -D "$root" --console=passive >"$work/boot.log" 2>&1 &
nspawn=$!
leader=""
for _ in $(seq 200); do
  leader=$(pgrep -P "$nspawn" -x systemd | head -1 || true)  # the container's init, not a helper
  [[ -n "$leader" ]] && break
  sleep 0.1
done
[[ -n "$leader" ]] || fail "the container did not start: $(tail -5 "$work/boot.log")"
inside() { nsenter -t "$leader" -m -u -i -n -p -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
state=""
for _ in $(seq 300); do
  state=$(inside systemctl is-system-running 2>/dev/null || true)
  [[ "$state" == running || "$state" == degraded ]] && break
  sleep 0.2
done
[[ "$state" == running || "$state" == degraded ]] || fail "systemd in the container did not finish booting: '$state'"
say "systemd is up ($state)"

inside systemctl start gradsyncd.service || fail "systemctl start gradsyncd: $(inside journalctl -u gradsyncd --no-pager | tail -20)"
[[ "$(inside systemctl is-active gradsyncd.service)" == active ]] || fail "gradsyncd.service is not active"
main=$(inside systemctl show -p MainPID --value gradsyncd.service)
[[ "$(inside stat -c %U "/proc/$main")" == gradsync ]] || fail "the service's process (pid $main) does not run as gradsync"

# 4. The demo against the service's socket, the admin tool, a reload.
inside gradsync-demo --socket /run/gradsync/gradsync.sock --clients 2 --steps 3 --model tiny >"$work/demo.log" 2>&1 ||
  fail "the demo against the service failed: $(tail -10 "$work/demo.log")"
grep -q verified "$work/demo.log" || fail "the demo did not verify: $(tail -5 "$work/demo.log")"
say "demo: $(grep verified "$work/demo.log")"
inside gradsyncctl status >"$work/status.log" 2>&1 || fail "gradsyncctl status: $(cat "$work/status.log")"
say "gradsyncctl status: $(head -1 "$work/status.log")"
inside systemctl reload gradsyncd.service || fail "systemctl reload gradsyncd failed"
for _ in $(seq 50); do
  inside journalctl -u gradsyncd --no-pager | grep -q "SIGHUP: configuration reloaded" && break
  sleep 0.1
done
inside journalctl -u gradsyncd --no-pager | grep -q "SIGHUP: configuration reloaded" ||
  fail "the reload was not logged: $(inside journalctl -u gradsyncd --no-pager | tail -10)"
say "reload: logged"

# 5. Stop: drained, exit 0, socket gone.
inside systemctl stop gradsyncd.service || fail "systemctl stop gradsyncd failed"
journal=$(inside journalctl -u gradsyncd --no-pager)
grep -q "drained" <<<"$journal" || fail "no drain in the journal: $(tail -10 <<<"$journal")"
[[ "$(inside systemctl show -p Result --value gradsyncd.service)" == success ]] ||
  fail "the service did not stop cleanly: $(inside systemctl show -p Result -p ExecMainStatus gradsyncd.service)"
inside test ! -e /run/gradsync/gradsync.sock || fail "the control socket was left behind"
say "stop: drained, Result=success"
inside systemctl poweroff >/dev/null 2>&1 || true
for _ in $(seq 150); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.2; done
say "ok: installed, booted, served the demo, reloaded and drained under systemd"
