# SPDX-License-Identifier: Apache-2.0
# Sourced by the container tests: a throw-away $work, and the cleanup of what a container
# killed by its timeout leaves behind.
work=$(mktemp -d "/tmp/$1-XXXXXX")
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

# Boots systemd 252 in a throw-away container (the host's root, volatile, an empty /etc) on a
# unified cgroup v2 tree, so scopes have cgroup v2 directories and the freezer (see
# SYSTEMD-TESTING.md), with $units as /etc/systemd/system, $work/out as /out and the extra
# systemd-nspawn arguments given; its checks unit powers it off. Prints the results, or
# fails without any.
boot_container() {
    local machine=$1 status=0
    shift
    SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 timeout 150 systemd-nspawn --register=no --keep-unit --volatile=yes -D / \
        --machine="$machine-$$" --bind="$work/out:/out" --bind-ro="$units:/etc/systemd/system" "$@" \
        /bin/sh -c 'exec /lib/systemd/systemd --system systemd.firstboot=off' </dev/null >"$work/nspawn.log" 2>&1 || status=$?
    if [ ! -s "$work/out/results" ]; then
        echo "fail container: no results (systemd-nspawn exited $status)"
        tail -30 "$work/nspawn.log" | sed 's/^/  | /'
        return 1
    fi
    cat "$work/out/results"
}
