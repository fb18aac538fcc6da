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

check purge dpkg --purge bgtaskd libbgtask-dev libbgtask0
check no-units sh -c '! ls /lib/systemd/system/bgtaskd.* /etc/systemd/system/sockets.target.wants/bgtaskd.socket 2>/dev/null'
check no-socket-unit sh -c '! systemctl is-active -q bgtaskd.socket'
check no-socket test ! -e /run/bgtaskd/io.bgtaskd
check no-run-dir sh -c "test ! -e /run/bgtaskd && test ! -e /run/bgtaskd-state && test ! -e /run/private/bgtaskd-state"
check no-config test ! -e /etc/bgtaskd/bgtaskd.conf
check no-library test ! -e /usr/lib/x86_64-linux-gnu/libbgtask.so.0
echo done >> "$out.done"
