#!/usr/bin/env bash
# Boots a real systemd in a throw-away container (systemd-nspawn --volatile=yes: the host's
# /usr read-only, an empty /etc) with bgtaskd installed from this tree, runs checks.sh in it
# as a oneshot unit, and prints the results: one line per check, "ok NAME" or
# "fail NAME: why". Needs root and the release binaries (make release).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/bgtaskd-nspawn-XXXXXX)
# The container's cgroups live below ours, in payload/; if it is killed (the timeout), they
# outlive it, and a frozen one would trap the next container's unit of the same name.
cgroup_root=$(awk '{ for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") print $5; break } }' \
    /proc/self/mountinfo | head -1)$(sed -n 's/^0:://p' /proc/self/cgroup)
cleanup() {
    local payload=${cgroup_root%/}/payload
    if [ -d "$payload" ]; then
        find "$payload" -name cgroup.freeze -exec sh -c 'echo 0 > "$1"' _ {} \; 2>/dev/null || true
        find "$payload" -mindepth 1 -name cgroup.kill -exec sh -c 'echo 1 > "$1"' _ {} \; 2>/dev/null || true
        find "$payload" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

make -s -C "$repo" install-files DESTDIR="$work/dest" PREFIX=/opt/bgtaskd SYSCONFDIR=/opt/bgtaskd/etc >/dev/null
install -m755 "$repo/Tests/systemd/checks.sh" "$work/dest/opt/bgtaskd/checks.sh"
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

status=0
# A unified cgroup v2 tree in the container, so scopes have cgroup v2 directories and the
# freezer (see SYSTEMD-TESTING.md).
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 timeout 150 systemd-nspawn --register=no --keep-unit --volatile=yes -D / --machine="bgtaskd-test-$$" \
    --bind="$work/out:/out" --bind-ro="$units:/etc/systemd/system" --bind-ro="$work/dest/opt/bgtaskd:/opt/bgtaskd" \
    /bin/sh -c 'exec /lib/systemd/systemd --system systemd.firstboot=off' </dev/null >"$work/nspawn.log" 2>&1 || status=$?
if [ ! -s "$work/out/results" ]; then
    echo "fail container: no results (systemd-nspawn exited $status)"
    tail -30 "$work/nspawn.log" | sed 's/^/  | /'
    exit 1
fi
cat "$work/out/results"
