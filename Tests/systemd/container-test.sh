#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Boots a real systemd in a throw-away container (systemd-nspawn --volatile=yes: the host's
# /usr read-only, an empty /etc) with bgtaskd installed from this tree, runs checks.sh in it
# as a oneshot unit, and prints the results: one line per check, "ok NAME" or
# "fail NAME: why". Needs root and the release binaries (make release).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
. "$repo/Tests/systemd/container-lib.sh" bgtaskd-nspawn

make -s -C "$repo" install-files DESTDIR="$work/dest" PREFIX=/opt/bgtaskd SYSCONFDIR=/opt/bgtaskd/etc >/dev/null
install -m755 "$repo/Tests/systemd/checks.sh" "$work/dest/opt/bgtaskd/checks.sh"
install -m644 "$repo/Tests/systemd/term-app.py" "$work/dest/opt/bgtaskd/term-app.py"
# The scriptable test app, for a task that is not bound to a connection (one that survives a restart).
install -m755 "$repo/.build/release/bgtask-probe" "$work/dest/opt/bgtaskd/bgtask-probe"

units=$work/units
mkdir -p "$units/sockets.target.wants" "$units/multi-user.target.wants" "$units/bgtaskd.service.d" "$work/out"
cp "$work/dest/opt/bgtaskd/lib/systemd/system/bgtaskd.socket" "$work/dest/opt/bgtaskd/lib/systemd/system/bgtaskd.service" "$units/"
ln -s ../bgtaskd.socket "$units/sockets.target.wants/bgtaskd.socket"
# Only the watchdog is sped up for the test; everything else is the shipped unit.
printf '[Service]\nWatchdogSec=1s\nTimeoutAbortSec=1s\n' > "$units/bgtaskd.service.d/50-test.conf"
cat > "$units/bgtaskd-checks.service" <<'UNIT'
[Unit]
Description=bgtaskd checks
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/opt/bgtaskd/checks.sh
ExecStopPost=/bin/systemctl --no-block poweroff
UNIT
ln -s ../bgtaskd-checks.service "$units/multi-user.target.wants/bgtaskd-checks.service"

# The service's user, made at boot by systemd-sysusers in the empty /etc (as polkitd's, from
# the host's /usr/lib/sysusers.d: logind asks polkit whether bgtaskd may take its idle
# inhibitor).
boot_container bgtaskd-test --bind-ro="$work/dest/opt/bgtaskd:/opt/bgtaskd" \
    --bind-ro="$work/dest/opt/bgtaskd/lib/sysusers.d/bgtaskd.conf:/etc/sysusers.d/bgtaskd.conf" || exit 1
