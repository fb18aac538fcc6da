#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the built .debs (make deb) in a real systemd 252, booted in a throw-away container
# whose root is the host's under an overlay on a tmpfs, in a mount namespace of its own
# (nspawn's --volatile=overlay refuses the host's root): dpkg can write to /usr and /etc,
# nothing reaches the host. Checks, as a oneshot unit there:
#   - after dpkg -i, bgtaskd.socket is enabled and listening, and the daemon is started by
#     the first `bgtaskctl status`;
#   - the C example builds with `cc $(pkg-config --cflags --libs bgtask)` against the
#     installed libbgtask-dev and completes its cycle (begin in did_enter_background, the
#     expiration handler once, end, suspended: State T in /proc);
#   - an upgrade (dpkg -i again) restarts the daemon and the app's task survives it;
#   - dpkg --purge leaves no unit, no socket, no /run/bgtaskd.
# Prints one line per check, "ok NAME" or "fail NAME: why". Needs root.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
debs=${1:-$repo/build/deb}
. "$repo/Tests/systemd/container-lib.sh" bgtaskd-pkgtest
ls "$debs"/bgtaskd_*.deb "$debs"/libbgtask0_*.deb "$debs"/libbgtask-dev_*.deb >/dev/null

mkdir -p "$work/out" "$work/wants" "$work/pkgtest"
cp "$repo/Tests/systemd/package-checks.sh" "$repo/examples/bgtask-example.c" "$work/pkgtest/"
cat > "$work/pkgtest.service" <<'UNIT'
[Unit]
Description=bgtaskd package checks
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/bash /pkgtest/package-checks.sh
ExecStopPost=/bin/systemctl --no-block poweroff
UNIT
ln -s /etc/systemd/system/pkgtest.service "$work/wants/pkgtest.service"
status=0
# The host's enabled units stay out (an empty multi-user.target.wants); /etc stays writable
# for dpkg and deb-systemd-helper.
root=$work/overlay/root
mkdir -p "$work/overlay"
unshare -m --propagation private sh -c '
    set -e
    mount -t tmpfs tmpfs "$1/overlay"
    mkdir -p "$1/overlay/upper" "$1/overlay/work" "$1/overlay/root"
    mount -t overlay overlay -o "lowerdir=/,upperdir=$1/overlay/upper,workdir=$1/overlay/work" "$1/overlay/root"
    export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
    exec timeout 240 systemd-nspawn --register=no --keep-unit -D "$1/overlay/root" --machine="bgtaskd-pkg-$$" \
        --bind="$1/out:/out" --bind-ro="$2:/debs" --bind-ro="$1/pkgtest:/pkgtest" \
        --bind-ro="$1/pkgtest.service:/etc/systemd/system/pkgtest.service" \
        --bind-ro="$1/wants:/etc/systemd/system/multi-user.target.wants" \
        /bin/sh -c "exec /lib/systemd/systemd --system systemd.firstboot=off"
' sh "$work" "$debs" </dev/null >"$work/nspawn.log" 2>&1 || status=$?
if [ ! -s "$work/out/results" ]; then
    echo "fail container: no results (systemd-nspawn exited $status)"
    tail -30 "$work/nspawn.log" | sed 's/^/  | /'
    exit 1
fi
cat "$work/out/results"
if grep -q "^fail" "$work/out/results"; then
    cat "$work/out/diagnostics" 2>/dev/null
    echo "--- the example's output"; sed 's/^/  | /' "$work/out/example.log" 2>/dev/null
    echo "--- bgtaskd's journal"; tail -40 "$work/out/journal" 2>/dev/null | sed 's/^/  | /'
fi
! grep -q "^fail" "$work/out/results"
