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

# For the session containers (session-test.sh, scripts/bench-lock): the installed tree in
# $work/dest, bgtaskd's socket and service units in $units (the socket enabled), $work/out
# and $work/run, and a user `bgsession` (uid $session_uid) added to copies of the host's
# account files in $work/etc. Then `boot_session_container NAME [ARGS]` boots it with those
# and PAM bound in, $work/run as /opt/run.
session_uid=4242
daemon_uid=4243
prepare_session_container() {
    make -s -C "$repo" install-files DESTDIR="$work/dest" PREFIX=/opt/bgtaskd SYSCONFDIR=/opt/bgtaskd/etc >/dev/null
    units=$work/units
    mkdir -p "$units/sockets.target.wants" "$units/multi-user.target.wants" "$work/out" "$work/etc" "$work/run"
    cp "$work/dest/opt/bgtaskd/lib/systemd/system/bgtaskd.socket" "$work/dest/opt/bgtaskd/lib/systemd/system/bgtaskd.service" "$units/"
    ln -s ../bgtaskd.socket "$units/sockets.target.wants/bgtaskd.socket"
    cp /etc/passwd /etc/group /etc/shadow "$work/etc/"
    echo "bgsession:x:$session_uid:$session_uid:bgtaskd session:/run/user/$session_uid:/bin/sh" >> "$work/etc/passwd"
    echo "bgsession:x:$session_uid:" >> "$work/etc/group"
    echo "bgsession:!:19000:0:99999:7:::" >> "$work/etc/shadow"
    # The service's user (sysusers.d/bgtaskd.conf; these bound copies cannot be written at boot).
    echo "_bgtaskd:x:$daemon_uid:$daemon_uid:bgtaskd:/:/usr/sbin/nologin" >> "$work/etc/passwd"
    echo "_bgtaskd:x:$daemon_uid:" >> "$work/etc/group"
    echo "_bgtaskd:!:19000::::::" >> "$work/etc/shadow"
}

# The host's fontconfig (its configuration and its cache) comes along, as on a desktop: without
# them fontconfig falls back to no configuration and foot reads every font file each start.
boot_session_container() {
    local machine=$1 fonts=()
    shift
    for dir in /etc/fonts /var/cache/fontconfig; do [ -d $dir ] && fonts+=(--bind-ro=$dir); done
    boot_container "$machine" --bind-ro="$work/dest/opt/bgtaskd:/opt/bgtaskd" --bind-ro="$work/run:/opt/run" "${fonts[@]}" \
        --bind-ro=/etc/pam.d --bind-ro=/etc/security --bind-ro=/etc/login.defs \
        --bind-ro="$work/etc/passwd:/etc/passwd" --bind-ro="$work/etc/group:/etc/group" --bind-ro="$work/etc/shadow:/etc/shadow" "$@"
}

# Boots systemd 252 in a throw-away container whose root is the host's under an overlay on a
# tmpfs, in a mount namespace of its own (nspawn's --volatile=overlay refuses the host's
# root): dpkg can write to /usr and /etc, nothing reaches the host. COMMAND runs as a
# oneshot unit there, then powers it off; it writes its results to /out/results (at least
# one line) and anything else to /out. Prints the results, or fails without any.
boot_overlay_container() {
    local machine=$1 command=$2 status=0
    shift 2
    mkdir -p "$work/out" "$work/wants" "$work/overlay"
    cat > "$work/checks.service" <<UNIT
[Unit]
Description=bgtaskd checks
After=multi-user.target
[Service]
Type=oneshot
ExecStart=$command
ExecStopPost=/bin/systemctl --no-block poweroff
UNIT
    ln -sf /etc/systemd/system/checks.service "$work/wants/checks.service"
    unshare -m --propagation private sh -c '
        set -e
        work=$1 machine=$2
        shift 2
        mount -t tmpfs tmpfs "$work/overlay"
        mkdir -p "$work/overlay/upper" "$work/overlay/work" "$work/overlay/root"
        mount -t overlay overlay -o "lowerdir=/,upperdir=$work/overlay/upper,workdir=$work/overlay/work" "$work/overlay/root"
        export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
        exec timeout 240 systemd-nspawn --register=no --keep-unit -D "$work/overlay/root" --machine="$machine-$$" \
            --bind="$work/out:/out" --bind-ro="$work/checks.service:/etc/systemd/system/checks.service" \
            --bind-ro="$work/wants:/etc/systemd/system/multi-user.target.wants" "$@" \
            /bin/sh -c "exec /lib/systemd/systemd --system systemd.firstboot=off"
    ' sh "$work" "$machine" "$@" </dev/null >"$work/nspawn.log" 2>&1 || status=$?
    if [ ! -s "$work/out/results" ]; then
        echo "fail container: no results (systemd-nspawn exited $status)"
        tail -30 "$work/nspawn.log" | sed 's/^/  | /'
        return 1
    fi
    cat "$work/out/results"
}
