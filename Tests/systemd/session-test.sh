#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The session agent under a real logind (systemd 252 in a throw-away container, as
# container-test.sh boots it): a PAM login session for a test user, a headless sway and a
# real foot window in it, bgtaskd as the system service, bgtask-session as the user — started
# by its shipped user unit in the session's user manager, as a desktop's session starts it. The
# session's LockedHint set to true (as a screen locker sets it) suspends foot; false brings
# it back; then a stopped agent leaves nothing stopped. Then the same with the user's own
# daemon (its user units, enabled), the agent started again reaching it. Prints "ok NAME" / "fail NAME: why"
# lines. Needs root, systemd-nspawn, sway and foot, and the release binaries.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
. "$repo/Tests/systemd/container-lib.sh" bgtaskd-session
command -v sway >/dev/null && command -v foot >/dev/null || { echo "skip session-test: sway and foot are not installed"; exit 0; }

prepare_session_container
uid=$session_uid

# Runs as the user in the PAM session: a compositor, a window, the agent.
cat > "$work/run/user.sh" <<'USER'
#!/bin/sh
export HOME=$XDG_RUNTIME_DIR XDG_CACHE_HOME=$XDG_RUNTIME_DIR WLR_BACKENDS=headless WLR_LIBINPUT_NO_DEVICES=1 WLR_RENDERER=pixman
echo "output HEADLESS-1 resolution 1280x720" > "$XDG_RUNTIME_DIR/sway.conf"
sway -c "$XDG_RUNTIME_DIR/sway.conf" > "$XDG_RUNTIME_DIR/sway.log" 2>&1 &
for i in $(seq 100); do ls "$XDG_RUNTIME_DIR"/sway-ipc.* >/dev/null 2>&1 && break; sleep 0.1; done
export SWAYSOCK=$(ls "$XDG_RUNTIME_DIR"/sway-ipc.* | head -1)
swaymsg exec "foot sleep 1000" > "$XDG_RUNTIME_DIR/swaymsg.log" 2>&1
echo "$XDG_SESSION_ID" > "$XDG_RUNTIME_DIR/session-id"
# The agent by its user unit (bgtask-session.service, WantedBy=graphical-session.target), told
# the compositor's socket as sway's systemd snippet tells the user manager; its settings
# from the user's file. The session lasts while sway runs.
mkdir -p "$HOME/.config/bgtaskd"
printf '[Session]\nBackgroundDelaySec=0\n' > "$HOME/.config/bgtaskd/session.conf"
systemctl --user import-environment SWAYSOCK WAYLAND_DISPLAY
systemctl --user start bgtask-session.service
wait
USER
# Another user's client on the system bus: signals addressed to the agent's connection, as
# if from the bus (NameOwnerChanged: this connection now owns org.freedesktop.login1) and
# then from logind (the session locked), as many times as asked.
cat > "$work/run/spoof.py" <<'SPOOF'
import sys
from gi.repository import Gio, GLib
bus = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)
agent, path = sys.argv[1], sys.argv[2]
bus.emit_signal(agent, "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged",
                GLib.Variant("(sss)", ("org.freedesktop.login1", "", bus.get_unique_name())))
for _ in range(int(sys.argv[3])):
    bus.emit_signal(agent, path, "org.freedesktop.DBus.Properties", "PropertiesChanged",
                    GLib.Variant("(sa{sv}as)", ("org.freedesktop.login1.Session", {"LockedHint": GLib.Variant("b", True)}, [])))
bus.flush_sync(None)
SPOOF
cat > "$work/run/checks.sh" <<CHECKS
#!/bin/bash
out=/out/results
: > "\$out"
ok() { echo "ok \$1" >> "\$out"; }
fail() { echo "fail \$1: \$2" >> "\$out"; }
within() { local n=\$1; shift; for _ in \$(seq "\$n"); do "\$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; "\$@"; }
run=/run/user/$uid
# The agent's lines: its unit's output, in the journal.
agentlog() { journalctl --no-pager -o cat -t bgtask-session; }
collect() {
    agentlog > /out/agent.log 2>&1
    cp \$run/sway.log /out/sway.log 2>/dev/null
    journalctl -u bgtaskd --no-pager > /out/journal 2>&1
    systemctl stop bgsession-desktop
    echo done >> "\$out.done"
}
systemctl start dbus.service systemd-logind.service
systemd-run -q -p PAMName=login -p User=bgsession -p Environment=XDG_SESSION_TYPE=wayland --unit=bgsession-desktop /opt/run/user.sh
tree() { setpriv --reuid=$uid --regid=$uid --clear-groups env SWAYSOCK=\$(ls \$run/sway-ipc.* | head -1) swaymsg -r -t get_tree; }
footpid() { tree 2>/dev/null | grep -o '"pid": [0-9]*' | head -1 | grep -o '[0-9]*'; }
# Each step waits for what the next one needs, with its own deadline: the agent connected to
# sway and logind, foot's window in sway's tree, then the agent following foot's process (its
# debug line), so the lock below finds foot on the screen, as a person's lock would.
if ! within 150 sh -c "ls \$run/sway-ipc.* && [ -s \$run/session-id ] && journalctl --no-pager -o cat -t bgtask-session | grep -q 'following logind session'"; then
    fail session-started "agent not following sway and logind: \$(loginctl list-sessions --no-legend | tr '\n' ' ') \$(agentlog | tail -3 | tr '\n' ' ')"
elif ! within 300 footpid; then
    fail session-started "no foot window in sway's tree: swaymsg \$(tr '\n' ' ' < \$run/swaymsg.log 2>&1); sway.log \$(tail -5 \$run/sway.log 2>&1 | tr '\n' ' ')"
else
    foot=\$(footpid)
    if within 100 sh -c "journalctl --no-pager -o cat -t bgtask-session | grep -q \"following pid \$foot's windows\""; then ok session-started; else
        fail session-started "the agent did not follow foot \$foot: \$(agentlog | tail -3 | tr '\n' ' ')"; fi
fi
if [ -z "\$foot" ]; then
    fail rest "not run: no foot window to lock away"
    collect
    exit 0
fi
session=\$(cat \$run/session-id 2>/dev/null)
path=/org/freedesktop/login1/session/_3\$(echo "\$session" | cut -c1)\$(echo "\$session" | cut -c2-)
state() { sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status; }
if [ "\$(state)" != T ]; then ok visible-runs; else fail visible-runs "foot \$foot is stopped"; fi
# A screen locker sets the hint as the session's own user.
setpriv --reuid=$uid --regid=$uid --clear-groups busctl call org.freedesktop.login1 "\$path" org.freedesktop.login1.Session SetLockedHint b true \
    > /tmp/lock.log 2>&1 || fail lock "\$(cat /tmp/lock.log)"
if within 50 sh -c "[ \"\\\$(sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status)\" = T ]"; then ok locked-suspends; else
    fail locked-suspends "state \$(state); \$(agentlog | tail -3 | tr '\n' ' ') \$(journalctl -u bgtaskd --no-pager | tail -3 | tr '\n' ' ')"; fi
journalctl -u bgtaskd --no-pager | grep -q "session locked" && ok journal-says-locked || fail journal-says-locked "\$(journalctl -u bgtaskd --no-pager | tail -3 | tr '\n' ' ')"
setpriv --reuid=$uid --regid=$uid --clear-groups busctl call org.freedesktop.login1 "\$path" org.freedesktop.login1.Session SetLockedHint b false
if within 30 sh -c "[ \"\\\$(sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status)\" != T ]"; then ok unlocked-resumes; else fail unlocked-resumes "state \$(state)"; fi
# Another user sends the agent a PropertiesChanged of its session saying LockedHint true, as
# if from logind (the system bus lets anyone send a signal, and a signal addressed to the
# agent's connection reaches it past its match's sender), after a NameOwnerChanged of its own
# naming itself logind's new owner: the agent drops both, foot runs on.
agentpid=\$(pgrep -u $uid -x bgtask-session | head -1)
agentbus=\$(busctl list --no-legend --unique | tr -s ' ' | grep "^:[0-9.]* \$agentpid " | cut -d' ' -f1)  # no awk: /etc is empty here
locks=\$(journalctl -u bgtaskd --no-pager | grep -c "session locked")
setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 /opt/run/spoof.py "\$agentbus" "\$path" 1 > /tmp/spoof.log 2>&1 \
    || fail spoofed-lock-ignored "spoof.py: \$(cat /tmp/spoof.log)"
sameagent() { [ "\$(pgrep -u $uid -x bgtask-session | head -1)" = "\$agentpid" ]; }
if within 50 sh -c "journalctl --no-pager -o cat -t bgtask-session | grep -q 'not from logind'" && [ "\$(state)" != T ] \
    && [ "\$(journalctl -u bgtaskd --no-pager | grep -c "session locked")" = "\$locks" ] && sameagent; then ok spoofed-lock-ignored; else
    fail spoofed-lock-ignored "agent \$agentpid (now \$(pgrep -u $uid -x bgtask-session | head -1)) at \$agentbus (\$(cat /tmp/spoof.log)); foot state \$(state); \$(agentlog | tail -3 | tr '\n' ' ')"; fi
# A flood of them costs the agent a comparison each and no line (one a minute).
setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 /opt/run/spoof.py "\$agentbus" "\$path" 2000 > /tmp/spoof.log 2>&1 \
    || fail spoofed-lock-ignored "spoof.py: \$(cat /tmp/spoof.log)"
# logind restarted (a new unique name on the bus): its signals are still followed.
old=\$(busctl status org.freedesktop.login1 2>/dev/null | sed -n 's/^UniqueName=//p')
systemctl restart systemd-logind.service
within 50 sh -c "busctl status org.freedesktop.login1 | grep -q '^UniqueName=' && ! busctl status org.freedesktop.login1 | grep -qx 'UniqueName=\$old'"
# Locked again, then the agent stopped: nothing is left stopped.
setpriv --reuid=$uid --regid=$uid --clear-groups busctl call org.freedesktop.login1 "\$path" org.freedesktop.login1.Session SetLockedHint b true
# logind's own signals are still followed, after another's were ignored and logind restarted;
# the flood before it logged nothing more.
ignoredlines() { journalctl --no-pager -o cat -t bgtask-session | grep -c 'not from logind'; }
if within 50 sh -c "[ \"\\\$(sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status)\" = T ]" && sameagent && [ "\$(ignoredlines)" = 1 ]; then ok restarted-logind-locks; else
    fail restarted-logind-locks "state \$(state); \$(ignoredlines) lines of ignored signals; agent \$agentpid now \$(pgrep -u $uid -x bgtask-session | head -1); logind \$old then \$(busctl status org.freedesktop.login1 2>&1 | sed -n 's/^UniqueName=//p'); \$(agentlog | tail -3 | tr '\n' ' ')"; fi
# As the session's end stops it (its unit is PartOf=graphical-session.target).
setpriv --reuid=$uid --regid=$uid --clear-groups env XDG_RUNTIME_DIR=\$run systemctl --user stop bgtask-session.service
if within 30 sh -c "[ \"\\\$(sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status)\" != T ]"; then ok stopped-agent-resumes; else fail stopped-agent-resumes "state \$(state)"; fi
# The same session with the user's own daemon (systemctl --user enable bgtaskd.socket, the
# user units and environment generator bound in as installed): the user's manager then has
# BGTASKD_SOCKET, and the agent started again — in the session still locked, as one restarted
# behind a locker — reaches that daemon, which suspends foot for the lock at once; unlocked,
# locked, unlocked again through it, the system daemon not involved.
asuser() { setpriv --reuid=$uid --regid=$uid --clear-groups env XDG_RUNTIME_DIR=\$run "\$@"; }
userlog() { journalctl --no-pager -o cat _SYSTEMD_USER_UNIT=bgtaskd.service; }
stopped() { [ "\$(sed -n 's/^State:\t\(.\).*/\1/p' /proc/\$foot/status)" = T ]; }
userlocks() { journalctl --no-pager -o cat _SYSTEMD_USER_UNIT=bgtaskd.service | grep -c "(foot) entered the background .*: session locked)"; }
export foot
export -f stopped userlocks
hint() { setpriv --reuid=$uid --regid=$uid --clear-groups busctl call org.freedesktop.login1 "\$path" org.freedesktop.login1.Session SetLockedHint b \$1; }
asuser systemctl --user enable --now bgtaskd.socket > /tmp/enable.log 2>&1 || fail user-daemon "\$(cat /tmp/enable.log)"
if asuser systemctl --user show-environment | grep -qx "BGTASKD_SOCKET=\$run/bgtaskd/io.bgtaskd"; then ok user-daemon-in-environment; else
    fail user-daemon-in-environment "\$(asuser systemctl --user show-environment | tr '\n' ' ')"; fi
system_locks=\$(journalctl -u bgtaskd --no-pager | grep -c "session locked")
asuser systemctl --user start bgtask-session.service
if within 100 sh -c "journalctl --no-pager -o cat -t bgtask-session | grep -q 'connected to bgtaskd at \$run/bgtaskd/io.bgtaskd'"; then ok agent-reaches-user-daemon; else
    fail agent-reaches-user-daemon "\$(agentlog | tail -3 | tr '\n' ' ')"; fi
# Both user units run sandboxed (PrivateUsers=: a user namespace mapping only the user);
# the daemon, activated by the agent's connection, may still be starting.
sandboxed() { [ "\$(tr -s ' ' < /proc/\$(asuser systemctl --user show -P MainPID \$1)/uid_map)" = " $uid $uid 1" ]; }
export run; export -f sandboxed asuser
if within 50 bash -c 'sandboxed bgtask-session.service && sandboxed bgtaskd.service'; then ok user-units-sandboxed; else
    fail user-units-sandboxed "\$(for unit in bgtask-session bgtaskd; do cat /proc/\$(asuser systemctl --user show -P MainPID \$unit.service)/uid_map; done | tr '\n' ' ')"; fi
if within 50 bash -c 'stopped && [ "\$(userlocks)" = 1 ]'; then ok user-daemon-suspends-on-locked-start; else
    fail user-daemon-suspends-on-locked-start "state \$(state); \$(agentlog | tail -3 | tr '\n' ' ') \$(userlog | tail -3 | tr '\n' ' ')"; fi
hint false
if within 30 bash -c '! stopped'; then ok user-daemon-resumes; else fail user-daemon-resumes "state \$(state); \$(userlog | tail -3 | tr '\n' ' ')"; fi
hint true
if within 50 bash -c 'stopped && [ "\$(userlocks)" = 2 ]'; then ok user-daemon-suspends-on-lock; else
    fail user-daemon-suspends-on-lock "state \$(state); \$(agentlog | tail -3 | tr '\n' ' ') \$(userlog | tail -3 | tr '\n' ' ')"; fi
if [ "\$(journalctl -u bgtaskd --no-pager | grep -c "session locked")" = "\$system_locks" ]; then ok system-daemon-not-involved; else
    fail system-daemon-not-involved "\$(journalctl -u bgtaskd --no-pager | tail -3 | tr '\n' ' ')"; fi
hint false
if within 30 bash -c '! stopped'; then ok user-daemon-resumes-again; else fail user-daemon-resumes-again "state \$(state)"; fi
asuser systemctl --user stop bgtask-session.service
userlog > /out/user-journal 2>&1
collect
CHECKS
chmod +x "$work/run/user.sh" "$work/run/checks.sh"
chmod 644 "$work/run/spoof.py"
cat > "$units/bgtaskd-session-checks.service" <<'UNIT'
[Unit]
Description=bgtask-session checks
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/opt/run/checks.sh
ExecStopPost=/bin/systemctl --no-block poweroff
UNIT
ln -s ../bgtaskd-session-checks.service "$units/multi-user.target.wants/bgtaskd-session-checks.service"

installed=$work/dest/opt/bgtaskd/lib/systemd
boot_session_container bgtaskd-session \
    --bind-ro="$installed/user/bgtask-session.service:/etc/systemd/user/bgtask-session.service" \
    --bind-ro="$installed/user/bgtaskd.service:/etc/systemd/user/bgtaskd.service" \
    --bind-ro="$installed/user/bgtaskd.socket:/etc/systemd/user/bgtaskd.socket" \
    --bind-ro="$installed/user-environment-generators/60-bgtaskd:/etc/systemd/user-environment-generators/60-bgtaskd" || exit 1
[ -s "$work/out/results.done" ] || echo "fail checks: did not finish"
if grep -q "^fail" "$work/out/results"; then
    echo "--- the agent's log"; sed 's/^/  | /' "$work/out/agent.log" 2>/dev/null
    echo "--- bgtaskd's journal"; tail -20 "$work/out/journal" 2>/dev/null | sed 's/^/  | /'
    echo "--- the per-user bgtaskd's journal"; tail -20 "$work/out/user-journal" 2>/dev/null | sed 's/^/  | /'
    echo "--- sway's log (foot's output included)"; tail -20 "$work/out/sway.log" 2>/dev/null | sed 's/^/  | /'
fi
! grep -q "^fail" "$work/out/results" && [ -s "$work/out/results.done" ]
