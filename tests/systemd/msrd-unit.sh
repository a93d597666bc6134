#!/bin/bash
# msrd under a real systemd, through the shipped unit: boots Debian's systemd as PID 1
# of new PID, mount, UTS, network, IPC and cgroup namespaces (this machine's own init
# need not be systemd), installs msrd as the package does (binaries, deploy/msrd.service,
# /etc/itcp/msrd.toml, the postinst that makes the itcp user), then
#   systemctl enable --now msrd; systemctl reload msrd (an upgrade); systemctl stop msrd;
#   systemctl start msrd; systemctl stop msrd
# and prints what each step came to as `RESULT key=value` lines (tests/tests/systemd_unit.rs
# checks them), with systemd's and msrd's journal after them. Everything it made is gone
# when it exits; the host's /etc, /usr and /var are never written.
# Usage (root): tests/systemd/msrd-unit.sh REPO_DIR BIN_DIR
set -u
REPO=$1 BIN=$2
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/itcp-systemd.XXXXXX)
# A cgroup (v2) of our own, the root of the namespace's cgroup namespace.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then V2=/sys/fs/cgroup; else V2=/sys/fs/cgroup/unified; fi
CG=$V2/itcp-systemd-$$
UPID= SYSD=

in_ns() { nsenter -t "$SYSD" -a "$@"; }
result() { echo "RESULT $1=$2"; }

cleanup() {
  set +e
  # SIGKILL to a PID namespace's init ends every process in it; the mount and network
  # namespaces go with the last of them.
  [ -n "$SYSD" ] && kill -KILL "$SYSD" 2>/dev/null
  [ -n "$UPID" ] && wait "$UPID" 2>/dev/null
  for _ in $(seq 100); do grep -q 'populated 0' "$CG/cgroup.events" 2>/dev/null && break; sleep 0.1; done
  [ -d "$CG" ] && find "$CG" -depth -type d -exec rmdir {} + 2>/dev/null
  [ -d "$CG" ] && echo "cgroup $CG not removed" >&2
  umount -R "$D/ovl" 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT

mkdir -p "$D/stage" "$D/ovl"
install -m 0755 "$BIN/msrd" "$BIN/itcpctl" "$D/stage/"
install -m 0644 "$REPO/deploy/msrd.service" "$D/stage/msrd.service"
install -m 0755 "$REPO/deploy/debian/postinst" "$D/stage/postinst"
{ cat "$REPO/config/examples/msrd.toml"
  printf '\n[[cell]]\ninterface = "cell0"\n'; } > "$D/stage/msrd.toml"
"$D/stage/msrd" --check-config "$D/stage/msrd.toml" >/dev/null || exit 1
[ -d "$V2" ] || { echo "no cgroup v2 hierarchy at $V2" >&2; exit 1; }
mkdir "$CG" || exit 1

( echo $BASHPID > "$CG/cgroup.procs"
  exec unshare --fork --pid --mount --uts --net --ipc --cgroup --mount-proc \
    --propagation private \
    env -i container=itcp-test PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb \
    /bin/sh "$HERE/boot.sh" "$D" ) </dev/null >"$D/boot.log" 2>&1 &
UPID=$!
for _ in $(seq 50); do SYSD=$(pgrep -P "$UPID"); [ -n "$SYSD" ] && break; sleep 0.1; done
[ -n "$SYSD" ] || { echo "the namespace's init did not start" >&2; cat "$D/boot.log" >&2; exit 1; }
for _ in $(seq 150); do
  kill -0 "$SYSD" 2>/dev/null || { echo "the namespace's init exited:" >&2; cat "$D/boot.log" >&2; exit 1; }
  case $(readlink "/proc/$SYSD/exe") in */systemd) in_ns test -S /run/systemd/private 2>/dev/null && break ;; esac
  sleep 0.2
done
result booted "$(in_ns timeout 60 systemctl is-system-running --wait)"

in_ns timeout 60 systemctl enable --now msrd >/dev/null 2>&1
result start_rc $?
MAIN=$(in_ns systemctl show msrd -p MainPID --value)
result active "$(in_ns systemctl show msrd -p ActiveState --value)"
if [ "${MAIN:-0}" != 0 ]; then
  result user "$(in_ns ps -o user= -p "$MAIN")"
  result group "$(in_ns ps -o group= -p "$MAIN")"
  for f in CapPrm CapEff CapBnd CapAmb NoNewPrivs; do
    v=$(in_ns awk -v f="$f:" '$1==f {print $2}' "/proc/$MAIN/status")
    case $f in Cap*) v=$(capsh --decode="$v" | sed 's/^0x[0-9a-f]*=//') ;; esac
    result "$f" "$v"
  done
fi

# An upgrade in place: the new msrd becomes the main process (MAINPID=), a process
# systemd did not start.
in_ns timeout 60 systemctl reload msrd >/dev/null 2>&1
result reload_rc $?
NEW=$(in_ns systemctl show msrd -p MainPID --value)
result main_changed "$([ "${NEW:-0}" != 0 ] && [ "$NEW" != "$MAIN" ] && echo yes || echo no)"
result active_after_reload "$(in_ns systemctl show msrd -p ActiveState --value)"

in_ns timeout 60 systemctl stop msrd >/dev/null 2>&1
result stop_rc $?
result stop_result "$(in_ns systemctl show msrd -p Result --value)"
result drained "$(in_ns journalctl -u msrd --no-pager -o cat | grep -c 'drained')"
result sigkilled "$(in_ns journalctl -b --no-pager -o cat | grep -c 'with signal SIGKILL')"

# And a stop with no upgrade before it, as before the ExecStop.
in_ns timeout 60 systemctl start msrd >/dev/null 2>&1
result restart_rc $?
in_ns timeout 60 systemctl stop msrd >/dev/null 2>&1
result plain_stop_result "$(in_ns systemctl show msrd -p Result --value)"
result drained_total "$(in_ns journalctl -u msrd --no-pager -o cat | grep -c 'drained')"

echo "== systemd and msrd, this boot"
in_ns journalctl -b --no-pager -o short-monotonic | grep -iE 'msrd|itcp' | tail -60
