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

mkdir -p "$work/pkgtest"
cp "$repo/Tests/systemd/package-checks.sh" "$repo/Tests/systemd/package-checks-lib.sh" "$repo/Tests/systemd/term-app.py" \
    "$repo/examples/bgtask-example.c" "$work/pkgtest/"
boot_overlay_container bgtaskd-pkg "/bin/bash /pkgtest/package-checks.sh" \
    --bind-ro="$debs:/debs" --bind-ro="$work/pkgtest:/pkgtest" || exit 1
if grep -q "^fail" "$work/out/results"; then
    cat "$work/out/diagnostics" 2>/dev/null
    echo "--- the example's output"; sed 's/^/  | /' "$work/out/example.log" 2>/dev/null
    echo "--- bgtaskd's journal"; tail -40 "$work/out/journal" 2>/dev/null | sed 's/^/  | /'
fi
! grep -q "^fail" "$work/out/results"
