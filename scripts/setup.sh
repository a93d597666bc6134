#!/usr/bin/env bash
# Installs everything the project needs on Debian 12 (run as root) and builds it.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

# One line per step with the time since the start, so that a first run (minutes of
# downloads and compiling) never looks hung.
start=$SECONDS
step() { printf '[setup %3ds] %s\n' $((SECONDS - start)) "$*"; }

if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (the testbed creates network namespaces and TAP devices)" >&2
  exit 1
fi

# iproute2: namespaces, veth, bridge; nftables/iptables: msrd's interception (later
# issues); iperf3, socat, haproxy: benchmark peers; tcpdump: captures in tests;
# openssl: scripts/msr-certs makes the lab's CA and MSR certificates (channel TLS).
# iputils-ping, iputils-arping: an unmodified MH's ping across moves and its announcement
# on association (tests/tests/network.rs);
# dpkg-dev, binutils: scripts/deb (dpkg-shlibdeps, strip) and its test;
# man-db, groff-base: the man pages in docs/man render as man shows them (tests/tests/docs.rs);
# systemd: systemd-analyze verifies the units and scores msrd.service's sandbox
# (tests/tests/package.rs), and msrd runs under it through its unit
# (tests/tests/systemd_unit.rs; libcap2-bin's capsh decodes its capabilities); passwd: useradd for the package's itcp user;
# prometheus: promtool checks msrd's /metrics; chromium: loads msrd's status page
# headless (tests/tests/metrics.rs). Those two add ~150 MB of downloads, ~750 MB on
# disk and ~30 s of installing.
packages=(iproute2 nftables iptables iperf3 socat haproxy tcpdump iputils-ping iputils-arping openssl curl ca-certificates build-essential pkg-config procps kmod dpkg-dev binutils man-db groff-base systemd libcap2-bin passwd prometheus chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${#missing[@]} Debian package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update"
  apt-get update -qq
  # Packages with services (prometheus) must not start them here: a policy-rc.d that
  # refuses every start, for the time of the install only (unless one exists already).
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  rc=0
  step "apt-get install (downloads and unpacks; chromium and prometheus take longest)"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { echo "setup: apt-get install failed ($rc)" >&2; exit "$rc"; }
else
  step "Debian packages: all ${#packages[@]} present"
fi

# The Rust toolchain (rustup's stable), unless one is already there.
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  step "installing the Rust toolchain with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
fi

# TAP devices for the link emulator.
[ -e /dev/net/tun ] || modprobe tun || { echo "setup: /dev/net/tun is missing and the tun module cannot be loaded" >&2; exit 1; }

# Not --quiet: a first build compiles some 200 crates for minutes, each one a line.
step "building the workspace (cargo build --release; a first build takes a few minutes)"
cargo build --release --workspace --bins
step "setup done"
