// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// Finding 15 of the second review: the README said "the freezer needs no check: SIGCONT
/// cannot thaw a frozen cgroup", but the owner of a delegated unit can write `0` to its
/// `cgroup.freeze`: the app ran while listed `suspended`. Now the daemon watches the frozen
/// unit's `cgroup.events` and freezes it again. (The other way, systemd thawing a slice's
/// units, is checked under a real systemd: Tests/systemd/checks.sh.)
extension ContainmentEndToEndTests {
    @Test func aUnitItsOwnerThawsIsFrozenAgain() throws {
        let unit = try TestUnit("thawed")
        for path in [unit.cgroup.directory, unit.cgroup.directory + "/cgroup.procs", unit.cgroup.directory + "/cgroup.freeze"] {
            try systemCall("chown(\(path))") { chown(path, 65534, 65534) }
        }
        let daemon = try TestDaemon()
        let app = try unit.spawn("exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sleep 600")
        try waitUntil("the sleep in its unit as uid 65534") {
            (try? ProcStatus.uids(pid: app.pid))?.real == 65534 && (try? ProcStat.read(pid: app.pid))?.command == "sleep"
        }
        #expect(try daemon.ctl(["background", "--unit", "/" + unit.name], asUser: 65534).0 == 0)
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        let thaw = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                   "echo 0 > \(unit.cgroup.directory)/cgroup.freeze"])
        #expect(try thaw.wait(timeout: 5) == 0)
        try waitUntil("the thaw noticed") { daemon.log().contains { $0.contains("was thawed while suspended") } }
        try waitUntil("the unit frozen again") { try unit.cgroup.isFrozen() }
        #expect(try daemon.app(app.pid)?["state"] == "suspended")
        // A resume by the daemon is not a thaw to undo.
        #expect(try daemon.ctl(["foreground", "--unit", "/" + unit.name], asUser: 65534).0 == 0)
        try waitUntil("the unit thawed") { try !unit.cgroup.isFrozen() }
        #expect(daemon.log().filter { $0.contains("was thawed while suspended") }.count == 1)
        #expect(try !unit.cgroup.isFrozen())
    }

    /// An app that handles `SIGTERM` at most `blocked` seconds after it comes (blocked
    /// meanwhile, so that it is still pending when the daemon looks, however fast the app is
    /// thawed): `handler` is the handler's Python, after it writes "handled" to `marker`.
    static func termHandlingApp(marker: String, blocked: Double = 0.5, handler: String) -> String {
        """
        import signal, sys, time
        def handled(*_):
            open("\(marker)", "w").write("handled")
            \(handler)
        signal.signal(signal.SIGTERM, handled)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        print("ready", flush=True)
        while True:
            time.sleep(\(blocked))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        """
    }

    /// What systemd does to a frozen unit it stops (`systemctl stop`, a logout): thaws it,
    /// then sends its `KillSignal=`. Frozen again at once, the app never acted on it, and the
    /// stop hung until systemd's `SIGKILL` 90 s later (found in the package test: a user's
    /// suspended scope stopped by `systemctl --user stop`). Now a thawed app with a signal to
    /// stop pending is terminated with it: it handles it, and is killed if still there when
    /// `TerminateGraceSec` runs out.
    @Test func aFrozenUnitThawedAndSentSIGTERMIsLetGoToHandleIt() throws {
        let unit = try TestUnit("stopping")
        let marker = try temporaryDirectory("bgtaskd-stopping") + "/handled"
        defer { removeTree(String(marker.dropLast(8))) }
        let daemon = try TestDaemon(["TerminateGraceSec=5s"])
        let app = try unit.spawn(["/usr/bin/python3", "-c", Self.termHandlingApp(marker: marker, handler: "sys.exit(0)")])
        #expect(try app.readLine(timeout: 10) == "ready")
        #expect(try daemon.ctl(["background", "--unit", "/" + unit.name]).0 == 0)
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        // As systemd stops it: the thaw, then the signal.
        try unit.cgroup.setFrozen(false)
        try app.signal(SIGTERM)
        try waitUntil("the app's handler ran", timeout: 5) { access(marker, F_OK) == 0 }
        try waitUntil("the unit empty", timeout: 5) { try unit.cgroup.processes().isEmpty }
        #expect(daemon.log().contains { $0.contains("terminated with SIGTERM: stoppedWhileSuspended") }, "\(daemon.log())")
        #expect(try daemon.app(app.pid) == nil)
    }

    /// The owner of a delegated unit cannot use that to run on: its suspended app, thawed and
    /// sent `SIGTERM` by its own user (uid 65534), handling it and going on, is killed when
    /// `TerminateGraceSec` runs out. (A thaw with no signal to stop is frozen again:
    /// `aUnitItsOwnerThawsIsFrozenAgain`.)
    @Test func anOwnerWhoThawsAndSignalsTheirSuspendedAppEndsIt() throws {
        let unit = try TestUnit("ownstop")
        for path in [unit.cgroup.directory, unit.cgroup.directory + "/cgroup.procs", unit.cgroup.directory + "/cgroup.freeze"] {
            try systemCall("chown(\(path))") { chown(path, 65534, 65534) }
        }
        let daemon = try TestDaemon(["TerminateGraceSec=300ms"])
        let app = try unit.spawn(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                                  Self.termHandlingApp(marker: "/dev/null", blocked: 0.1, handler: "pass")])
        #expect(try app.readLine(timeout: 10) == "ready")
        #expect(try daemon.ctl(["background", "--unit", "/" + unit.name], asUser: 65534).0 == 0)
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        let signalled = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                        "echo 0 > \(unit.cgroup.directory)/cgroup.freeze; kill -TERM \(app.pid)"])
        #expect(try signalled.wait(timeout: 5) == 0)
        try waitUntil("the app killed at the end of its grace", timeout: 5) { try unit.cgroup.processes().isEmpty }
        #expect(daemon.log().contains { $0.contains("terminated with SIGTERM: stoppedWhileSuspended") }, "\(daemon.log())")
    }
}
