#!/usr/bin/env bash
# `make setup`'s Debian packages, and nothing else: the packages named as arguments with what
# they depend on (no Recommends: on a fresh Debian, prometheus alone would bring avahi,
# printer tools, ipmitool, samba libraries and node-exporter, and upgrade systemd and perl),
# no service started while they install (a policy-rc.d that answers 101, "forbidden", the
# Debian way), and no unit they enable left enabled (a system Prometheus on :9090 is not
# what the tests or the demo want). One line says what is installed; apt's own output goes
# to $APT_LOG, shown (its end) only when apt fails.
#
# Environment (for tests and unusual machines): APT_GET, SYSTEMCTL, POLICY_RC_D, APT_LOG,
# APT_LOCK_WAIT, SUDO (unset: sudo when not root).
set -euo pipefail

APT_GET=${APT_GET:-apt-get}
SYSTEMCTL=${SYSTEMCTL:-systemctl}
POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
APT_LOG=${APT_LOG:-${TMPDIR:-/tmp}/gpufleet-apt.log}
APT_LOCK_WAIT=${APT_LOCK_WAIT:-300}
if [ -z "${SUDO+set}" ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi
fi
[ $# -gt 0 ] || exit 0

enabled_units() {  # enabled unit files, one a line (none where systemd is not in use)
  command -v "$SYSTEMCTL" >/dev/null 2>&1 || return 0
  "$SYSTEMCTL" list-unit-files --state=enabled --no-legend 2>/dev/null \
    | awk '{print $1}' | sort || true
}

echo "installing Debian packages: $* (no recommended packages; no service enabled or started; apt log: $APT_LOG)"
before=$(enabled_units)
made_policy=""
if [ ! -e "$POLICY_RC_D" ]; then
  printf '#!/bin/sh\n# made by gpufleet make setup while it installs packages: no service starts\nexit 101\n' \
    | $SUDO tee "$POLICY_RC_D" >/dev/null
  $SUDO chmod 755 "$POLICY_RC_D"
  made_policy=yes
fi
cleanup() { if [ -n "$made_policy" ]; then $SUDO rm -f "$POLICY_RC_D"; fi; }
trap cleanup EXIT

apt() {
  $SUDO env DEBIAN_FRONTEND=noninteractive "$APT_GET" -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" "$@"
}
: >"$APT_LOG"
if ! { apt update -qq && apt install -y -qq --no-install-recommends "$@"; } >>"$APT_LOG" 2>&1; then
  echo "error: apt-get could not install $* (the end of $APT_LOG follows)" >&2
  tail -n 20 "$APT_LOG" >&2
  exit 1
fi

after=$(enabled_units)
for unit in $(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after")); do
  $SUDO "$SYSTEMCTL" disable --now --quiet "$unit" >>"$APT_LOG" 2>&1 || true
done
