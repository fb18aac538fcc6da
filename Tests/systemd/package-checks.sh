#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the container of package-test.sh, as root under systemd 252.
. "$(dirname "$0")/package-checks-lib.sh"
check install dpkg -i /debs/bgtaskd_*.deb /debs/libbgtask0_*.deb /debs/libbgtask-dev_*.deb
check socket-enabled systemctl is-enabled bgtaskd.socket
check socket-listening within 50 systemctl is-active bgtaskd.socket
check socket-file test -S /run/bgtaskd/io.bgtaskd
check daemon-not-yet-started sh -c '! systemctl is-active -q bgtaskd.service'
check status-starts-daemon bgtaskctl status
check daemon-started within 50 systemctl is-active bgtaskd.service
# The service runs as the system user the package made (postinst: systemd-sysusers).
check service-user sh -c 'getent passwd _bgtaskd && [ "$(stat -c %U /proc/$(systemctl show -P MainPID bgtaskd.service))" = _bgtaskd ]'
# Every user reaches the system socket once the daemon runs.
check unprivileged-reaches-socket setpriv --reuid=65534 --regid=65534 --clear-groups bgtaskctl status
check config-is-conffile sh -c 'dpkg-query -W -f="\${Conffiles}" bgtaskd | grep -q /etc/bgtaskd/bgtaskd.conf'
check manpage test -e /usr/share/man/man8/bgtaskd.8.gz
check completion test -e /usr/share/bash-completion/completions/bgtaskctl
# The session agent: installed, its user unit enabled for every user's graphical session.
check session-agent sh -c 'bgtask-session --help | grep -q "Usage: bgtask-session" && test -e /usr/share/man/man1/bgtask-session.1.gz'
check session-unit-enabled systemctl --global is-enabled bgtask-session.service

# The C example, built against the installed libbgtask-dev, through its whole cycle.
cd /tmp
check example-builds sh -c 'cc -o bgtask-example /pkgtest/bgtask-example.c $(pkg-config --cflags --libs bgtask)'
export BGTASKD_SOCKET=/run/bgtaskd/io.bgtaskd
# In a scope of its own: started from this oneshot unit, it would otherwise share the
# unit's cgroup, and the unit (this script too) would be the app.
systemd-run --scope --quiet --collect --unit=bgtask-example ./bgtask-example > example.log 2>&1 &
app=$!
check example-registered within 50 grep -q "running in the foreground" example.log
# A budget for root's apps (this one only, here), suspended with SIGSTOP so /proc shows
# it (State T; the freezer would leave it sleeping in a frozen cgroup): a policy. (Executable= would need
# CAP_SYS_PTRACE to read another user's /proc/PID/exe, which the shipped unit does not hold.)
mkdir -p /etc/bgtaskd/policy.d
printf '[Match]\nUser=root\n[Policy]\nBackgroundTimeSec=120s\nExpirationWarningSec=2s\nSuspendMode=signal\n' > /etc/bgtaskd/policy.d/50-example.policy
check reload systemctl reload bgtaskd.service
check background bgtaskctl background "$app"
check example-began within 50 grep -q "began background task" example.log
# Running in the background, it keeps the machine from idle-suspending (KeepAwake=): logind's
# inhibitor, held by the service's user over the system bus, with polkit's leave.
check idle-inhibited within 50 sh -c 'systemd-inhibit --list --no-legend | grep -Eq "^bgtaskd +[0-9]+ _bgtaskd .* idle .* block$"'
# Upgrade in the middle of the task: the daemon is restarted and keeps it.
before=$(systemctl show -P MainPID bgtaskd.service)
check upgrade dpkg -i /debs/bgtaskd_*.deb
after=$(systemctl show -P MainPID bgtaskd.service)
if [ -n "$after" ] && [ "$after" != 0 ] && [ "$after" != "$before" ]; then ok daemon-restarted-on-upgrade; else fail daemon-restarted-on-upgrade "MainPID $before -> $after"; fi
first="status: $(bgtaskctl status 2>&1 | head -3 | tr '\n' ' ') mainpid $(systemctl show -P MainPID bgtaskd.service) pid: $(bgtaskctl --no-legend tasks "$app" 2>&1 | tr '\n' ' ') all: $(bgtaskctl --no-legend tasks 2>&1 | tr '\n' ' ') apps: $(bgtaskctl --no-legend apps 2>&1 | tr '\n' ' ')"
if within 50 sh -c "bgtaskctl tasks $app | grep -q upload"; then ok task-survives-upgrade; else
    echo "first look: $first" >> /out/diagnostics
    fail task-survives-upgrade "$(bgtaskctl tasks "$app" 2>&1 | tr '\n' ' ') all: $(bgtaskctl --no-legend tasks 2>&1 | tr '\n' ' ') apps: $(bgtaskctl --no-legend apps 2>&1 | tr '\n' ' ') cgroup: $(cat /proc/$app/cgroup)"; fi
# Its warning now (the debugger hook), not when a budget sized to outlast the upgrade runs
# out: dpkg -i takes from 1 to more than 5 s here (its triggers).
check expire bgtaskctl expire "$app"
check example-expired within 50 grep -q "expiration handler" example.log
# Ending its last task suspends the app at once (its end's reply waits for the foreground).
check example-suspended within 50 sh -c "grep -q '^State:.*T' /proc/$app/status"
check foreground bgtaskctl foreground "$app"
check example-ended within 30 grep -q "ended task 1: ok" example.log
if [ "$(grep -c 'expiration handler' example.log)" = 1 ]; then ok handler-ran-once; else fail handler-ran-once "$(grep -c 'expiration handler' example.log) times"; fi
kill "$app" 2>/dev/null
cp example.log /out/example.log
journalctl -u bgtaskd --no-pager -o short-monotonic > /out/journal 2>&1
rm -f /etc/bgtaskd/policy.d/50-example.policy

# The per-user daemon (the package's user units): socket-activated by a user's own manager
# (started without a session, as lingering starts it), found by `bgtaskctl --user`, running
# as that user, its state in the user's runtime directory; an app of that user, in a scope of
# its own (systemd-run --user), frozen by it in the background and thawed.
useradd --uid 4250 --create-home bgtaskuser
asuser() { setpriv --reuid=4250 --regid=4250 --init-groups env HOME=/home/bgtaskuser XDG_RUNTIME_DIR=/run/user/4250 "$@"; }
export -f asuser
check user-manager systemctl start user@4250.service
check user-socket-enabled asuser systemctl --user enable --now bgtaskd.socket
check user-socket-file within 50 test -S /run/user/4250/bgtaskd/io.bgtaskd
check user-status-starts-daemon bash -c 'asuser bgtaskctl --user status | grep -q "^bgtaskd .* on /run/user/4250/bgtaskd/io.bgtaskd$"'
user_daemon=$(asuser systemctl --user show -P MainPID bgtaskd.service)
check user-daemon-is-the-users sh -c "[ '$user_daemon' != 0 ] && [ \"\$(stat -c %u /proc/$user_daemon)\" = 4250 ] && grep -q 'user@4250.service' /proc/$user_daemon/cgroup && test -d /run/user/4250/bgtaskd-state/state"
# Sandboxed (PrivateUsers= and what it allows a user manager): a user namespace mapping
# only the user, and a read-only root.
check user-daemon-sandboxed sh -c "[ \"\$(awk '{print \$1, \$2, \$3}' /proc/$user_daemon/uid_map)\" = '4250 4250 1' ] && awk '\$5 == \"/\" {print \$6}' /proc/$user_daemon/mountinfo | grep -q '^ro'"
# `systemctl --user reload` runs the unit's `bgtaskctl reload` as the user: the daemon's own.
check user-reload bash -c "asuser systemctl --user reload bgtaskd.service && journalctl --no-pager _UID=4250 | grep -q 'Configuration reloaded'"
# The user's own ~/.config/bgtaskd/bgtaskd.conf is read over the admin's: a bad value there
# fails the reload, naming it (the old configuration kept); removed, the reload takes.
asuser mkdir -p /home/bgtaskuser/.config/bgtaskd
asuser sh -c 'printf "[Background]\nBackgroundTimeSec=soon\n" > /home/bgtaskuser/.config/bgtaskd/bgtaskd.conf'
check user-config-read bash -c "! asuser systemctl --user reload bgtaskd.service 2>/dev/null && journalctl --no-pager _UID=4250 | grep -q 'Configuration not reloaded, keeping the old one: /home/bgtaskuser/.config/bgtaskd/bgtaskd.conf:2: BackgroundTimeSec'"
rm -f /home/bgtaskuser/.config/bgtaskd/bgtaskd.conf
check user-config-removed asuser systemctl --user reload bgtaskd.service
# KeepAwake= from its user namespace: logind's idle inhibitor, held as the user, while the
# user's app runs in the background with a task. The app in a scope of its own: a process of
# the user's here in checks.service would make this whole unit its app, and the user's
# processes in it (these checks' own) would be stopped with it.
asuser systemd-run --user --scope --quiet --unit=awake-app bgtaskctl --user run --name awake -- sleep 60 &
check user-task-granted within 50 bash -c "asuser bgtaskctl --user --no-legend tasks | grep -q ' awake granted '"
check user-awake-background asuser bgtaskctl --user background --unit awake-app.scope
check user-keep-awake within 50 bash -c "asuser bgtaskctl --user status | grep -q '^   Keep awake: yes (logind.s idle inhibitor held' && systemd-inhibit --list --no-legend | grep -Eq '^bgtaskd +4250 bgtaskuser +$user_daemon +bgtaskd +idle '"
asuser systemctl --user stop awake-app.scope
asuser systemd-run --user --scope --quiet --unit=user-app sleep 600 &
scope=/sys/fs/cgroup/user.slice/user-4250.slice/user@4250.service/app.slice/user-app.scope
check user-app-in-its-scope within 50 grep -q . $scope/cgroup.procs
user_app=$(head -1 $scope/cgroup.procs)
check user-app-background asuser bgtaskctl --user background "$user_app"
check user-app-frozen within 50 bash -c "grep -qx 'frozen 1' $scope/cgroup.events && asuser bgtaskctl --user --no-legend apps | grep -q ' suspended '"
check user-app-foreground asuser bgtaskctl --user foreground "$user_app"
check user-app-thawed within 50 grep -qx 'frozen 0' $scope/cgroup.events
# A suspended (frozen) app whose unit is stopped: systemd thaws it and sends SIGTERM, and the
# daemon must not freeze it again before it acts on it (the stop then hung until systemd's
# SIGKILL, 90 s later). The app handles SIGTERM (term-app.py).
asuser systemd-run --user --scope --quiet --unit=stop-app python3 /pkgtest/term-app.py &
stop_scope=/sys/fs/cgroup/user.slice/user-4250.slice/user@4250.service/app.slice/stop-app.scope
check user-stop-app-in-its-scope within 50 grep -q . $stop_scope/cgroup.procs
check user-stop-app-frozen timeout 10 bash -c "asuser bgtaskctl --user background --unit stop-app.scope && until grep -qx 'frozen 1' $stop_scope/cgroup.events; do sleep 0.1; done"
check user-frozen-unit-stops timeout 20 bash -c "asuser systemctl --user stop stop-app.scope && journalctl --no-pager _UID=4250 | grep -q 'terminated with SIGTERM: stoppedWhileSuspended'"
kill "$user_app" 2>/dev/null
# What the user's manager starts finds that daemon without being told (the package's user
# environment generator, run again by enable's reload), and the system one once it is disabled.
check user-env-set bash -c 'asuser systemctl --user show-environment | grep -qx BGTASKD_SOCKET=/run/user/4250/bgtaskd/io.bgtaskd'
check user-service-finds-daemon bash -c 'asuser systemd-run --user --quiet --wait --pipe bgtaskctl status | grep -q "^bgtaskd .* on /run/user/4250/bgtaskd/io.bgtaskd$"'
check user-socket-disabled asuser systemctl --user disable --now bgtaskd.socket bgtaskd.service
check user-env-cleared bash -c '! asuser systemctl --user show-environment | grep -q ^BGTASKD_SOCKET='
check user-service-finds-system-daemon bash -c 'asuser systemd-run --user --quiet --wait --pipe bgtaskctl status | grep -q "^bgtaskd .* on /run/bgtaskd/io.bgtaskd$"'
if grep -q "^fail user-" "$out"; then
    { echo "--- the per-user daemon's journal"; journalctl --no-pager _UID=4250 | tail -40
      echo "--- the user's manager's environment"; asuser systemctl --user show-environment; } >> /out/diagnostics
fi
systemctl stop user@4250.service

check purge dpkg --purge bgtaskd libbgtask-dev libbgtask0
check no-units sh -c '! ls /lib/systemd/system/bgtaskd.* /etc/systemd/system/sockets.target.wants/bgtaskd.socket 2>/dev/null'
check no-socket-unit sh -c '! systemctl is-active -q bgtaskd.socket'
check no-socket test ! -e /run/bgtaskd/io.bgtaskd
check no-run-dir sh -c "test ! -e /run/bgtaskd && test ! -e /run/bgtaskd-state && test ! -e /run/private/bgtaskd-state"
check no-config test ! -e /etc/bgtaskd/bgtaskd.conf
check no-library test ! -e /usr/lib/x86_64-linux-gnu/libbgtask.so.0
echo done >> "$out.done"
