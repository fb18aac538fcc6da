#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the container of upgrade-test.sh, as root under systemd 252.
. "$(dirname "$0")/package-checks-lib.sh"
diagnose() { echo "$1: $(ls -la /run/bgtaskd-state /run/bgtaskd-state/state /run/private 2>&1 | tr '\n' ' ')" >> /out/diagnostics; }

check install-old dpkg -i /old/bgtaskd_*.deb /old/libbgtask0_*.deb
check old-serves bgtaskctl status
diagnose before
# An app suspended by the old daemon (its scope's cgroup frozen), to be resumed by the new.
systemd-run --scope --quiet --collect --unit=upgrade-app sleep 600 &
app=$!
frozen() { grep -q '^frozen 1' "/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$app/cgroup")/cgroup.events"; }
check app-registered within 50 sh -c "grep -q upgrade-app /proc/$app/cgroup && bgtaskctl background $app"
check app-suspended within 50 frozen
check upgrade dpkg -i /new/bgtaskd_*.deb /new/libbgtask0_*.deb
diagnose after
check runs-as-bgtaskd within 50 sh -c '[ "$(stat -c %U /proc/$(systemctl show -P MainPID bgtaskd.service))" = _bgtaskd ]'
check state-directory-its-own sh -c '[ -d /run/bgtaskd-state ] && [ ! -L /run/bgtaskd-state ] && [ "$(stat -c %U /run/bgtaskd-state/state/bgtaskd.state)" = _bgtaskd ]'
check state-restored sh -c "journalctl -u bgtaskd --no-pager | grep -q 'Restored 1 apps (1 suspended)'"
listed_suspended() { bgtaskctl --no-legend apps | grep -Eq "^ *$app .* suspended"; }
check app-still-suspended within 50 listed_suspended
check app-still-frozen within 50 frozen
thawed() { ! frozen; }
check app-resumed-by-the-new sh -c "bgtaskctl foreground $app"
check app-thawed within 50 thawed
journalctl -u bgtaskd --no-pager | tail -20 >> /out/diagnostics
kill "$app" 2>/dev/null
