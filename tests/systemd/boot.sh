#!/bin/sh
# PID 1 of the namespaces msrd-unit.sh makes: prepares a container-like view of this
# machine (its /etc, /usr and /var stay untouched: overlays whose upper layers live in
# a tmpfs of this mount namespace only), installs msrd as the Debian package does,
# then execs a real systemd as PID 1. Usage: boot.sh STAGING_DIR
set -eu
D=$1                   # staging dir on the host (read before /tmp is covered)
mount --make-rprivate /

# Upper layers for the overlays, in a tmpfs that only this namespace sees.
mount -t tmpfs -o mode=0755 itcp-ovl "$D/ovl"
for d in etc usr var; do
  mkdir -p "$D/ovl/$d/up" "$D/ovl/$d/work"
  mount -t overlay "itcp-$d" -o "lowerdir=/$d,upperdir=$D/ovl/$d/up,workdir=$D/ovl/$d/work" "/$d"
done

# What the package installs (scripts/deb): binaries, the unit, the config.
install -m 0755 "$D/stage/msrd" "$D/stage/itcpctl" /usr/bin/
install -m 0644 "$D/stage/msrd.service" /lib/systemd/system/msrd.service
install -d /etc/itcp
install -m 0644 "$D/stage/msrd.toml" /etc/itcp/msrd.toml

# Fresh /run, /tmp, /dev/shm; sysfs of this network namespace, read-only (so udev &
# co. stay off, as in systemd-nspawn); a cgroup2 hierarchy rooted at our cgroup
# namespace; /proc/sys read-only but for /proc/sys/net (this netns's own).
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
# The package's postinst (makes the itcp user in this overlay /etc, /var/log/itcp).
sh "$D/stage/postinst" configure
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs /sys
mount -t cgroup2 -o rw,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys
mount --bind /proc/sys/net /proc/sys/net
mount -o remount,bind,ro /proc/sys

hostname msr-systemd-test
echo msr-systemd-test > /etc/hostname

# The cell interface of the config, with the gateway address: one end of a veth pair
# (this kernel has no dummy driver).
ip link set lo up
ip link add cell0 type veth peer name cellpeer
ip addr add 10.2.0.1/24 dev cell0
ip link set cellpeer up
ip link set cell0 up

# A private /etc/systemd/system: none of the host's enabled units, and everything
# that would touch the host or is pointless here masked. Only journald is kept.
rm -rf /etc/systemd/system
mkdir -p /etc/systemd/system
for u in $(cd /lib/systemd/system && ls sysinit.target.wants sockets.target.wants timers.target.wants \
              | grep -v -e ':$' -e '^$') \
         systemd-remount-fs.service systemd-tmpfiles-setup.service systemd-tmpfiles-clean.service \
         systemd-udevd.service systemd-udev-trigger.service systemd-networkd-wait-online.service \
         getty.target console-getty.service systemd-logind.service dbus.service; do
  case $u in
    systemd-journald.service|systemd-journald.socket|systemd-journald-dev-log.socket) ;;
    *.target) [ "$u" = getty.target ] && ln -sf /dev/null "/etc/systemd/system/$u" ;;
    *) ln -sf /dev/null "/etc/systemd/system/$u" ;;
  esac
done
cat > /etc/systemd/system/itcp-test.target <<'EOF'
[Unit]
Description=Minimal boot for the msrd.service test
Wants=systemd-journald.service systemd-journald.socket
AllowIsolate=yes
EOF

exec /lib/systemd/systemd --system --log-target=journal --log-level=info \
  --unit=itcp-test.target
