#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the container (see container-test.sh) as a oneshot unit, as root.
# Every wait is a bounded poll; each check appends "ok NAME" or "fail NAME: why".
out=/out/results
: > "$out"
ctl=/opt/bgtaskd/bin/bgtaskctl
export BGTASKD_SOCKET=/run/bgtaskd/io.bgtaskd
ok() { echo "ok $1" >> "$out"; }
fail() { echo "fail $1: $2" >> "$out"; }
# until SECONDS COMMAND...: polls every 50 ms until COMMAND succeeds or SECONDS pass.
until_true() {
    local limit=$(( $1 * 20 )); shift
    for _ in $(seq "$limit"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.05; done
    return 1
}
main_pid() { systemctl show -p MainPID --value bgtaskd.service; }
# Every app here runs in a scope of its own, as a desktop launches apps: a process of this
# oneshot unit would make the whole unit (this script too) one app. Only as `scoped ... &`:
# it execs, so $! is the app's own pid.
scoped() { exec systemd-run --scope --quiet --collect "$@"; }
# Suspended: stopped (State T), or its cgroup frozen.
suspended() {
    grep -q '^State:[[:space:]]*T' "/proc/$1/status" \
        || grep -q '^frozen 1' "/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$1/cgroup")/cgroup.events"
}

# Socket activation: nothing runs until the first client connects.
state=$(systemctl is-active bgtaskd.service)
if [ "$state" = inactive ] && [ "$(systemctl is-active bgtaskd.socket)" = active ]; then
    ok not-running-before-first-client
else
    fail not-running-before-first-client "service is $state"
fi

if status_out=$("$ctl" status 2>&1) && echo "$status_out" | grep -q '^bgtaskd 0.1.0 on '; then
    ok ctl-status-activates
else
    fail ctl-status-activates "$status_out"
fi
[ "$(systemctl is-active bgtaskd.service)" = active ] && ok running-after-first-client \
    || fail running-after-first-client "$(systemctl is-active bgtaskd.service)"

# STATUS= shows in systemctl status.
if until_true 5 sh -c 'systemctl status bgtaskd.service | grep -q "Status: \"0 apps (0 background, 0 suspended), 0 tasks\""'; then
    ok status-line
else
    fail status-line "$(systemctl status bgtaskd.service | grep -i status: | head -1)"
fi

# Reload applies a new BackgroundTimeSec without dropping a connected client.
"$ctl" --json monitor > /tmp/monitor.log 2>&1 &
monitor=$!
until_true 5 grep -q monitoring /tmp/monitor.log
mkdir -p /etc/bgtaskd/bgtaskd.conf.d
printf '[Background]\nBackgroundTimeSec=7s\n' > /etc/bgtaskd/bgtaskd.conf.d/50-test.conf
pid_before=$(main_pid)
if systemctl reload bgtaskd.service && [ "$(main_pid)" = "$pid_before" ] && kill -0 "$monitor"; then
    ok reload-keeps-clients
else
    fail reload-keeps-clients "reload failed, restarted, or the monitor was dropped"
fi
scoped "$ctl" run --name held -- sleep 60 &
holder=$!
until_true 5 sh -c "\"$ctl\" --no-legend tasks | grep -q ' held granted '"
remaining=$("$ctl" --json background "$holder" | sed -n 's/.*"backgroundTimeRemaining":\([0-9.]*\).*/\1/p')
# (No awk here: it is an /etc/alternatives link, and this /etc is empty.)
milliseconds=$(printf '%.0f' "${remaining:-0}e3")
if [ "$milliseconds" -gt 6000 ] && [ "$milliseconds" -le 7000 ]; then
    ok reload-applies-background-time
else
    fail reload-applies-background-time "backgroundTimeRemaining=$remaining, expected 7s"
fi
if until_true 5 grep -q "\"pid\":$holder" /tmp/monitor.log; then
    ok monitor-still-served-after-reload
else
    fail monitor-still-served-after-reload "no event for pid $holder"
fi

# A bad configuration is refused and the old one kept.
printf '[Background]\nBackgroundTimeSec=soon\n' > /etc/bgtaskd/bgtaskd.conf.d/60-bad.conf
if ! systemctl reload bgtaskd.service 2>/dev/null && [ "$(systemctl is-active bgtaskd.service)" = active ] \
   && journalctl -u bgtaskd.service --no-pager | grep -q '60-bad.conf:2: BackgroundTimeSec'; then
    ok bad-reload-refused
else
    fail bad-reload-refused "$(journalctl -u bgtaskd.service --no-pager | tail -3 | tr '\n' ' ')"
fi
rm /etc/bgtaskd/bgtaskd.conf.d/60-bad.conf

# The journal gets structured fields for a termination.
"$ctl" terminate "$holder"
wait "$holder" 2>/dev/null
fields() { journalctl -u bgtaskd.service BGTASKD_EVENT=appTerminated -o export --no-pager; }
if until_true 5 sh -c "journalctl -u bgtaskd.service BGTASKD_EVENT=appTerminated -o export --no-pager | grep -q '^BGTASKD_PID=$holder\$'" \
   && fields | grep -q '^BGTASKD_REASON=manager$' && fields | grep -q '^BGTASKD_COMMAND=bgtaskctl$' \
   && fields | grep -q '^MESSAGE_ID=' && fields | grep -q '^PRIORITY=4$'; then
    ok journal-fields
else
    fail journal-fields "$(fields | grep -E '^(MESSAGE|BGTASKD_)' | tr '\n' ' ')"
fi

# A daemon that stops answering is restarted by the watchdog.
# (Never `kill 0`: with no main process, MainPID is 0, and that would stop this script's group.)
stuck=$(main_pid)
[ "${stuck:-0}" -gt 1 ] && kill -STOP "$stuck"
if until_true 20 sh -c "[ \"\$(systemctl show -p MainPID --value bgtaskd.service)\" != $stuck ] && [ \"\$(systemctl show -p MainPID --value bgtaskd.service)\" != 0 ] && systemctl is-active -q bgtaskd.service" \
   && [ "$(systemctl show -p NRestarts --value bgtaskd.service)" -ge 1 ]; then
    ok watchdog-restart
else
    fail watchdog-restart "MainPID=$(main_pid) NRestarts=$(systemctl show -p NRestarts --value bgtaskd.service)"
fi
if "$ctl" status >/dev/null 2>&1; then ok ctl-status-after-restart; else fail ctl-status-after-restart "no answer"; fi
journalctl -u bgtaskd.service --no-pager | grep -q 'Watchdog timeout' && ok watchdog-logged || fail watchdog-logged "no watchdog line"

# Restart without loss: killed with SIGKILL, systemd restarts it (Restart=on-failure) and it
# takes its state back from $RUNTIME_DIRECTORY: the task, the suspension, the ids.
coproc PROBE { exec systemd-run --scope --quiet --collect /opt/bgtaskd/bgtask-probe --socket "$BGTASKD_SOCKET"; }
read -r -t 5 _ <&"${PROBE[0]}"
echo "begin survivor" >&"${PROBE[1]}"
read -r -t 5 begun <&"${PROBE[0]}"
task_id=$(echo "$begun" | sed -n 's/.*"taskId":\([0-9]*\).*/\1/p')
scoped sleep 120 &
sleeper=$!
until_true 5 sh -c "grep -q '\.scope\$' /proc/$sleeper/cgroup"
"$ctl" background "$sleeper" >/dev/null
until_true 5 suspended "$sleeper"
until_true 5 sh -c "\"$ctl\" --no-legend tasks | grep -Eq '^ *$task_id .* survivor +granted'"
crashed=$(main_pid)
[ "${crashed:-0}" -gt 1 ] && kill -9 "$crashed"
if until_true 10 sh -c "p=\$(systemctl show -p MainPID --value bgtaskd.service); [ \"\$p\" != 0 ] && [ \"\$p\" != $crashed ] && systemctl is-active -q bgtaskd.service" \
   && "$ctl" --no-legend tasks | grep -Eq "^ *$task_id .* survivor +granted" \
   && "$ctl" --no-legend apps | grep -Eq "^ *$sleeper .* suspended" && suspended "$sleeper" \
   && journalctl -u bgtaskd.service --no-pager | grep -q 'Restored 2 apps (1 suspended) and 1 tasks'; then
    ok restart-keeps-state
else
    fail restart-keeps-state "tasks: $("$ctl" --no-legend tasks | tr '\n' ' ') apps: $("$ctl" --no-legend apps | tr '\n' ' ') $(journalctl -u bgtaskd.service --no-pager | grep Restored | tail -1)"
fi
"$ctl" foreground "$sleeper" >/dev/null
if until_true 5 sh -c "! { grep -q '^State:[[:space:]]*T' /proc/$sleeper/status || grep -q '^frozen 1' /sys/fs/cgroup\$(sed -n 's/^0:://p' /proc/$sleeper/cgroup)/cgroup.events; }"; then
    ok resumed-after-restart
else
    fail resumed-after-restart "pid $sleeper still stopped"
fi
echo "end $task_id" >&"${PROBE[1]}"
if read -r -t 5 ended <&"${PROBE[0]}" && echo "$ended" | grep -q '"call":"end","reply"'; then
    ok task-ended-after-restart
else
    fail task-ended-after-restart "$ended"
fi
kill "$sleeper" "$PROBE_PID" 2>/dev/null

# A unit app: systemd-run --scope starts a three-process app (two of its processes
# re-parented out of its tree); bgtaskctl names it by unit and the freezer takes all three.
app_scope=/sys/fs/cgroup/system.slice/bgtaskd-app.scope
scoped --unit=bgtaskd-app /bin/sh -c '(sleep 600 &); (setsid sleep 600 &); exec sleep 600' &
three() { [ "$(wc -l < "$app_scope/cgroup.procs")" -eq 3 ]; }
if until_true 5 three && "$ctl" background --unit bgtaskd-app.scope >/dev/null \
   && until_true 5 grep -q '^frozen 1' "$app_scope/cgroup.events"; then
    ok scope-frozen-by-unit
else
    fail scope-frozen-by-unit "$(cat "$app_scope/cgroup.events" 2>&1 | tr '\n' ' ') procs: $(cat "$app_scope/cgroup.procs" 2>&1 | tr '\n' ' ')"
fi
if "$ctl" --no-legend apps | grep -Eq ' bgtaskd-app\.scope +unit +.* suspended '; then
    ok scope-listed-as-unit
else
    fail scope-listed-as-unit "$("$ctl" --no-legend apps | tr '\n' ' ')"
fi
refused=0
for unit in init.scope bgtaskd.service system.slice; do
    "$ctl" background --unit "$unit" 2>&1 | grep -q 'invalid parameter: unit' || refused=1
done
if [ "$refused" = 0 ] && ! grep -q '^frozen 1' /sys/fs/cgroup/init.scope/cgroup.events; then
    ok unit-refusals
else
    fail unit-refusals "init.scope, bgtaskd.service or system.slice accepted"
fi
# systemd thawing a slice thaws its member units (newer systemd does it around system sleep):
# an app bgtaskd froze is frozen again, and the thaw logged.
thawed_scope=/sys/fs/cgroup/bgtaskd.slice/bgtaskd-thawed.scope
scoped --unit=bgtaskd-thawed --slice=bgtaskd.slice sleep 600 &
# The scope's process in it, not only its directory (systemd makes the cgroup, then moves the
# process in; once, under the full suite's load, the check found the scope empty).
if until_true 10 grep -q . "$thawed_scope/cgroup.procs" && "$ctl" background --unit bgtaskd-thawed.scope >/dev/null \
   && until_true 5 grep -q '^frozen 1' "$thawed_scope/cgroup.events" \
   && systemctl freeze bgtaskd.slice && systemctl thaw bgtaskd.slice \
   && until_true 5 sh -c "journalctl -u bgtaskd.service --no-pager | grep -q 'bgtaskd-thawed.scope/cgroup.freeze set to 0'" \
   && until_true 5 grep -q '^frozen 1' "$thawed_scope/cgroup.events"; then
    ok slice-thaw-frozen-again
else
    fail slice-thaw-frozen-again "$(cat "$thawed_scope/cgroup.events" 2>&1 | tr '\n' ' ') procs $(cat "$thawed_scope/cgroup.procs" 2>&1 | tr '\n' ' ') freeze $(cat "$thawed_scope/cgroup.freeze" 2>&1), slice's $(cat /sys/fs/cgroup/bgtaskd.slice/cgroup.freeze 2>&1); $(systemctl show -p FreezerState bgtaskd.slice bgtaskd-thawed.scope | tr '\n' ' ') $(journalctl -u bgtaskd.service --no-pager | tail -6 | tr '\n' ' ')"
fi
"$ctl" terminate --unit bgtaskd-thawed.scope >/dev/null
"$ctl" foreground --unit bgtaskd-app.scope >/dev/null
if until_true 5 grep -q '^frozen 0' "$app_scope/cgroup.events" && "$ctl" terminate --unit bgtaskd-app.scope \
   && until_true 5 sh -c "[ ! -d $app_scope ]"; then
    ok scope-terminated-whole
else
    fail scope-terminated-whole "$(cat "$app_scope/cgroup.procs" 2>&1 | tr '\n' ' ')"
fi
# systemd stopping a frozen unit thaws it, then sends SIGTERM: the daemon terminates the app
# with that signal, which it handles (term-app.py), instead of freezing it again until
# systemd's SIGKILL 90 s later.
stop_scope=/sys/fs/cgroup/system.slice/bgtaskd-stop.scope
scoped --unit=bgtaskd-stop python3 /opt/bgtaskd/term-app.py &
if until_true 10 grep -q . "$stop_scope/cgroup.procs" && "$ctl" background --unit bgtaskd-stop.scope >/dev/null \
   && until_true 5 grep -q '^frozen 1' "$stop_scope/cgroup.events" \
   && timeout 20 systemctl stop bgtaskd-stop.scope \
   && journalctl -u bgtaskd.service --no-pager | grep -q 'terminated with SIGTERM: stoppedWhileSuspended'; then
    ok frozen-scope-stops
else
    fail frozen-scope-stops "$(systemctl show -p ActiveState bgtaskd-stop.scope) $(journalctl -u bgtaskd.service --no-pager | tail -4 | tr '\n' ' ')"
fi

# Scope containment: a second bgtaskd, as root with IsolateApps=yes, moves a process app of
# a (stand-in) login session into a scope of its own through the system manager. Workers it
# forks afterwards, double-forked and setsid, stay in the app.
iso=/run/bgtaskd-iso/io.bgtaskd
systemd-run --unit=bgtaskd-iso --quiet /opt/bgtaskd/sbin/bgtaskd --socket "$iso" --set IsolateApps=yes
cat > /tmp/isolated-app.py <<'PY'
import os, signal, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b'{"method":"io.bgtaskd.App.GetTimeRemaining","parameters":{}}\0')
while not s.recv(4096).endswith(b"\0"): pass
# Bounded wait for the daemon to move it into its scope (the check fails if it never does).
deadline = time.monotonic() + 5
while "app-bgtaskd-" not in open("/proc/self/cgroup").read():
    if time.monotonic() > deadline: sys.exit("never moved into a scope")
    time.sleep(0.02)  # poll interval of the deadline wait
for detach in (False, True):
    if os.fork() == 0:
        if detach: os.setsid()
        if os.fork() == 0: signal.pause(); os._exit(0)  # a worker: idle until killed
        os._exit(0)
    os.wait()
signal.pause()  # the app: idle until frozen, thawed and killed
PY
until_true 5 test -S "$iso"
scoped --unit=session-99 /usr/bin/python3 /tmp/isolated-app.py "$iso" &
isolated=$!
iso_scope=/sys/fs/cgroup/system.slice/app-bgtaskd-$isolated.scope
in_scope() { [ "$(wc -l < "$iso_scope/cgroup.procs")" -eq 3 ]; }
if until_true 5 in_scope && "$ctl" --socket "$iso" --no-legend apps | grep -Eq "^ *$isolated .* app-bgtaskd-$isolated\.scope +scope "; then
    ok process-app-isolated-in-scope
else
    fail process-app-isolated-in-scope "$("$ctl" --socket "$iso" --no-legend apps | tr '\n' ' ') $(journalctl -u bgtaskd-iso --no-pager | tail -3 | tr '\n' ' ')"
fi
"$ctl" --socket "$iso" background "$isolated" >/dev/null
if until_true 5 grep -q '^frozen 1' "$iso_scope/cgroup.events"; then
    ok isolated-app-frozen-whole
else
    fail isolated-app-frozen-whole "$(cat "$iso_scope/cgroup.events" 2>&1 | tr '\n' ' ')"
fi
"$ctl" --socket "$iso" foreground "$isolated" >/dev/null
if until_true 5 grep -q '^frozen 0' "$iso_scope/cgroup.events" && "$ctl" --socket "$iso" terminate "$isolated" \
   && until_true 5 sh -c "[ ! -d $iso_scope ]"; then
    ok isolated-app-terminated-whole
else
    fail isolated-app-terminated-whole "$(cat "$iso_scope/cgroup.procs" 2>&1 | tr '\n' ' ')"
fi
systemctl stop bgtaskd-iso.service

# A unit app terminated with a catchable signal, its service started again by systemd
# (Restart=always) within the grace: the new instance is another app, which the grace's
# SIGKILL leaves running (systemd 252 makes the service's cgroup again; a cgroup.kill of
# that path at the grace's end killed the new instance).
term=/run/bgtaskd-term/io.bgtaskd
systemd-run --unit=bgtaskd-term --quiet /opt/bgtaskd/sbin/bgtaskd --socket "$term" --set TerminateSignal=SIGTERM --set TerminateGraceSec=1s
systemd-run --unit=bgtaskd-restarting --quiet -p Restart=always -p RestartSec=100ms /bin/sleep 600
restarting_pid() { systemctl show -p MainPID --value bgtaskd-restarting.service; }
until_true 5 test -S "$term"
first=$(restarting_pid)
started_again() { again=$(restarting_pid); [ "$again" != 0 ] && [ "$again" != "$first" ]; }
# After the grace's end (its log line) the new instance is given a second to die, bounded: it must not.
if [ "$first" != 0 ] && "$ctl" --socket "$term" background --unit bgtaskd-restarting.service >/dev/null \
   && "$ctl" --socket "$term" terminate --unit bgtaskd-restarting.service && until_true 5 started_again \
   && until_true 5 sh -c "journalctl -u bgtaskd-term --no-pager | grep -q 'bgtaskd-restarting.service was started again within its terminate grace'" \
   && ! until_true 1 sh -c "[ \"\$(systemctl show -p MainPID --value bgtaskd-restarting.service)\" != $again ] || ! kill -0 $again"; then
    ok unit-started-again-outlives-the-grace
else
    fail unit-started-again-outlives-the-grace "first $first, again ${again:-none}, now $(restarting_pid); $(journalctl -u bgtaskd-term --no-pager | tail -3 | tr '\n' ' ')"
fi
systemctl stop bgtaskd-restarting.service bgtaskd-term.service

# KeepAwake=: while an app runs in the background (uid 65534's here, holding a task), bgtaskd
# holds logind's idle inhibitor, as the service's user, with polkit's leave; once none
# does, it lets it go after its 2 s linger. Only idle: a suspend asked for is not delayed.
inhibitors() { systemd-inhibit --list --no-legend 2>&1; }
idle_held() { inhibitors | grep -Eq '^bgtaskd +[0-9]+ .* idle +Apps run in the background \(bgtaskctl apps\) +block$'; }
held_before=$(inhibitors)
scoped setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl" run --name awake -- sleep 60 &
awake_app=$!
until_true 5 sh -c "\"$ctl\" --no-legend tasks | grep -q ' awake granted '"
foreground_held=$(inhibitors)
"$ctl" background "$awake_app" >/dev/null
if ! echo "$held_before$foreground_held" | grep -q '^bgtaskd' && until_true 5 idle_held \
   && [ "$(inhibitors | grep '^bgtaskd' | sed -E 's/^bgtaskd +([0-9]+) .*/\1/')" = "$(stat -c %u /proc/"$(main_pid)")" ] \
   && journalctl -u bgtaskd.service --no-pager | grep -q 'kept from idle-suspending while apps run in the background' \
   && "$ctl" status | grep -q '^   Keep awake: yes (logind.s idle inhibitor held' \
   && setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl" --json status | grep -q '"idleInhibited":true' \
   && setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl" --json status | grep -q '"keepAwake":"held"'; then
    ok idle-inhibited-while-in-background
else
    fail idle-inhibited-while-in-background "before: $held_before; in the foreground: $foreground_held; now: $(inhibitors); $(journalctl -u bgtaskd.service --no-pager | grep -i 'idle-suspend' | tail -2 | tr '\n' ' ')"
fi
kill "$awake_app" 2>/dev/null
if until_true 5 sh -c "! \"$ctl\" --no-legend apps | grep -q '^ *$awake_app '" && idle_held \
   && until_true 5 sh -c "! systemd-inhibit --list --no-legend | grep -q '^bgtaskd '" \
   && journalctl -u bgtaskd.service --no-pager | grep -q 'may idle-suspend again' \
   && "$ctl" status | grep -q '^   Keep awake: no (no app runs in the background)$'; then
    ok idle-released-after-the-linger
else
    fail idle-released-after-the-linger "$(inhibitors); $("$ctl" --no-legend apps | tr '\n' ' ')"
fi

kill "$monitor" 2>/dev/null
echo done >> "$out"
