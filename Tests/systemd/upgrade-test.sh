#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An upgrade from older packages to these, in a real systemd 252 (boot_overlay_container):
# Tests/systemd/upgrade-checks.sh installs OLD_DEBS, suspends an app, installs NEW_DEBS (by
# default build/deb, make deb) and checks that the new daemon took the state back and
# resumes the app. Written for the move from DynamicUser= to the _bgtaskd user: the state's
# directory moved back from /run/private and owned by the new user. Not in make check:
# the older packages are built from an older commit, e.g.
#   git worktree add /tmp/old COMMIT && make -C /tmp/old deb
#   bash Tests/systemd/upgrade-test.sh /tmp/old/build/deb
# Prints one line per check, "ok NAME" or "fail NAME: why". Needs root.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
old=$(cd "${1:?usage: upgrade-test.sh OLD_DEBS [NEW_DEBS]}" && pwd)
new=$(cd "${2:-$repo/build/deb}" && pwd)
. "$repo/Tests/systemd/container-lib.sh" bgtaskd-upgrade
ls "$old"/bgtaskd_*.deb "$old"/libbgtask0_*.deb "$new"/bgtaskd_*.deb "$new"/libbgtask0_*.deb >/dev/null
mkdir -p "$work/checks"
cp "$repo/Tests/systemd/upgrade-checks.sh" "$repo/Tests/systemd/package-checks-lib.sh" "$work/checks/"
boot_overlay_container bgtaskd-upgrade "/bin/bash /checks/upgrade-checks.sh" \
    --bind-ro="$old:/old" --bind-ro="$new:/new" --bind-ro="$work/checks:/checks" || exit 1
if grep -q "^fail" "$work/out/results"; then cat "$work/out/diagnostics" 2>/dev/null; fi
! grep -q "^fail" "$work/out/results"
