// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import TestSupport
import Glibc
import Testing
import Varlink

/// Restart without loss: the daemon is killed with `SIGKILL` (it cleans nothing up) and
/// started again on the same socket and state directory.
@Suite(.serialized) struct RestartTests {
    /// What a listing says, in a form two daemons' listings can be compared in.
    struct Listing: Equatable, CustomStringConvertible {
        var apps: [String]
        var tasks: [String]
        /// Background time left per app pid, and the monotonic instants just before the apps
        /// were asked for and just after the answer: the daemon read its clock between them.
        var remaining: [Int64: Double]
        var asked: Int64, at: Int64

        init(_ daemon: TestDaemon) throws {
            asked = Clock.monotonicNanoseconds()
            let apps = try daemon.apps()
            at = Clock.monotonicNanoseconds()
            let tasks = try daemon.tasks()
            self.apps = apps.map { "\($0["pid"]!.intValue!) \($0["state"]!.stringValue!) \($0["phase"]?.stringValue ?? "-") \($0["tasks"]!.intValue!)" }.sorted()
            self.tasks = tasks.map { "\($0["id"]!.intValue!) \($0["pid"]!.intValue!) \($0["name"]!.stringValue!) \($0["state"]!.stringValue!)" }.sorted()
            remaining = [:]
            for app in apps where app["state"] == "background" {  // suspended: zero, not a deadline
                if let left = app["backgroundTimeRemaining"]?.doubleValue { remaining[app["pid"]!.intValue!] = left }
            }
        }

        var description: String { "apps \(apps), tasks \(tasks)" }

        /// Every deadline is where it was: the time left went down by exactly the time that passed.
        /// The time between the daemon's two readings lies between the end of the first call
        /// and the start of the second, and the start of the first and the end of the second
        /// (a reply's latency is not the daemon's: under TSan one call took 0.1 s longer than
        /// the other, and a check against the client's instants alone failed); 50 ms beyond.
        func deadlinesAgree(with later: Listing) -> [String] {
            let least = Double(later.asked - at) / 1e9, most = Double(later.at - asked) / 1e9
            return remaining.compactMap { pid, left in
                guard let after = later.remaining[pid] else { return "pid \(pid) lost its deadline" }
                let went = left - after
                return went >= least - 0.05 && went <= most + 0.05 ? nil
                    : "pid \(pid): \(left)s left before, \(after)s after, \(least)–\(most)s later"
            }
        }
    }

    @Test func appsInEveryStateComeBackAfterAKill() throws {
        // The warned app has up to 4 s left at the crash: more than what a restart gives a warned
        // app at least (the minimum grace once its library can be back, 2 s), so its deadline
        // stays where it was.
        let settings = ["BackgroundTimeSec=8s", "ExpirationWarningSec=4s", "TransitionTimeoutSec=30s",
                        "GrantLatencyMinSec=1s", "GrantLatencyMaxSec=1s"]
        let first = try TestDaemon(settings)
        let foreground = try first.probe(), running = try first.probe(), suspended = try first.probe()
        let expiring = try first.probe(), transition = try first.probe(), dies = try first.probe()
        try transition.send("subscribe")
        try transition.event("subscribed")
        let dormant = try foreground.begin("dormant")
        try foreground.send("begin-more streamed")
        _ = try running.begin("upload")
        _ = try expiring.begin("sync")
        _ = try transition.begin("held")
        _ = try dies.begin("doomed")
        try waitUntil("six tasks granted", timeout: 10) { try first.tasks().filter { $0["state"] == "granted" }.count == 6 }
        try first.setState(expiring.pid, "background")
        try waitUntil("the warning", timeout: 10) { try first.app(expiring.pid)?["phase"] == "expiring" }
        for probe in [running, suspended, transition] { try first.setState(probe.pid, "background") }
        try transition.event("didEnterBackground")
        try waitUntil("pid \(suspended.pid) stopped") { processState(suspended.pid) == "T" }
        let late = try running.begin("late")  // pending for a second
        let history = try first.history()

        let before = try Listing(first)
        try first.crash()
        try dies.process.signal(SIGKILL)  // while no daemon runs
        _ = try dies.process.wait(timeout: 5)
        let daemon = try first.restart(settings)
        let after = try Listing(daemon)

        // Every app and task is back, as it was, but for what a restart necessarily ends.
        #expect(before.deadlinesAgree(with: after) == [])
        let expectedApps = before.apps.map { line in
            // Its subscriber's connection closed with the old daemon: the transition counts as
            // finished, and the granted task keeps it running.
            line.hasPrefix("\(transition.pid) ") ? "\(transition.pid) background running 1" : line
        }.map { line in
            line.hasPrefix("\(foreground.pid) ") ? "\(foreground.pid) foreground - 1" : line  // "streamed" ended
        }.filter { !$0.hasPrefix("\(dies.pid) ") }  // it died meanwhile: cleaned up
        #expect(after.apps == expectedApps)
        #expect(after.tasks == before.tasks.filter { !$0.contains(" streamed ") && !$0.contains(" doomed ") })
        #expect(after.tasks.contains("\(late) \(running.pid) late pending"))
        #expect(try daemon.history().count == history.count)
        #expect(processState(suspended.pid) == "T")

        // The restored timers fire: the grant, then the deadline of the app still holding "sync".
        try waitUntil("the late task granted", timeout: 10) {
            try daemon.tasks(running.pid).first { $0["id"]?.intValue == late }?["state"] == "expiring"
        }
        try daemon.setState(suspended.pid, "foreground")
        try waitUntil("pid \(suspended.pid) resumed") { processState(suspended.pid) != "T" }
        try waitUntil("pid \(expiring.pid) terminated at its deadline", timeout: 10) { expiring.process.hasExited }
        let last = try daemon.history().map { "\($0["pid"]!.intValue!) \($0["action"]!.stringValue!) \($0["reason"]!.stringValue!)" }
        #expect(last.contains("\(expiring.pid) terminated assertionsBeyondPermittedTime"))
        #expect(try daemon.tasks(foreground.pid).map { $0["id"]!.intValue! } == [dormant])
        // Ids go on from where they were.
        #expect(try foreground.begin("next") > late)
    }

    /// A restored deadline fires by itself: the restarted daemon arms its timer at once, not
    /// at the first call some client happens to make.
    @Test func aRestoredDeadlineFiresWithNoCallAfterTheRestart() throws {
        let settings = ["BackgroundTimeSec=1s", "ExpirationWarningSec=0"]
        let daemon = try TestDaemon(settings)
        let probe = try daemon.probe()
        _ = try probe.begin("held")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        try daemon.setState(probe.pid, "background")
        try daemon.crash()
        // The same settings: warnings off, no warning's length for the restart to give back
        // (with the default 5 s, the app is warned at the restart and killed 5 s later).
        let restarted = try daemon.restart(settings, connecting: false)
        defer { withExtendedLifetime(restarted) {} }  // dropping it stops the daemon
        // Not a single connection from here on: only the log and /proc are read.
        try waitUntil("the app held past its restored deadline killed") { probe.process.hasExited }
    }

    /// A daemon killed while a catchable termination waits for its processes' stops (the
    /// app's child cannot stop: `UnstoppableApp`) had not sent the signal; the daemon after it
    /// sends it, and the grace runs from then: the app's handler runs to its end before the
    /// `SIGKILL`. (The next daemon left the app stopped and sent the `SIGKILL` at the saved
    /// instant: no handler at all.) Also for uid 65534's app.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"),
          arguments: [false, true])
    func aTerminationsSignalNotSentByAKilledDaemonIsSentByTheNext(asNobody: Bool) throws {
        let unstoppable = try UnstoppableApp("restart-\(asNobody)", handler: 1.5, asNobody: asNobody)
        let app = unstoppable.app
        let settings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=3s"]
        let first = try TestDaemon(settings)
        try first.setState(app.pid, "foreground")  // known to the daemon; running
        let start = Clock.monotonicNanoseconds()
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        // Its processes stopped; the daemon waits for the child's stop (a second at most).
        try waitUntil("the app stopped", timeout: 1) { processState(app.pid) == "T" }
        try first.crash()
        let crashed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        try #require(crashed < 0.9, "the daemon was killed \(crashed)s after the termination, maybe after its signal")
        let second = try first.restart(settings)
        try app.expectLine("got-term")
        let signalled = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(second.logged { $0.contains("App pid \(app.pid) (python3) was being terminated when ") && $0.contains("its SIGTERM not sent yet") })
        try app.expectLine("handled")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        let killed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(killed >= signalled + 1.5, "SIGKILL came \(killed)s after the termination, the signal \(signalled)s")
        #expect(killed < signalled + 3 + 1, "SIGKILL came \(killed)s after the termination, the signal \(signalled)s")
        try waitUntil("the frozen child killed too") { unstoppable.child.hasExited }
    }

    /// A daemon killed while a termination waits for its processes' stops, and the app's own
    /// process killed by someone before the next daemon starts: what was stopped for the
    /// termination (here the app's child, which cannot stop: `UnstoppableApp`; re-parented,
    /// found by no walk) is the next daemon's to signal — the catchable signal, then
    /// `SIGKILL` at the grace's end; or `SIGKILL` at the termination's bound. Before, it was
    /// left stopped for ever. Also for uid 65534's app.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"),
          arguments: zip(["SIGTERM", "SIGKILL", "SIGTERM"], [false, false, true]))
    func whatAKilledDaemonStoppedIsSignalledByTheNextThoughTheAppIsGone(signal: String, asNobody: Bool) throws {
        let unstoppable = try UnstoppableApp("gone-\(signal)-\(asNobody)", handler: 0.1, asNobody: asNobody)
        let app = unstoppable.app
        let settings = ["TerminateSignal=\(signal)", "TerminateGraceSec=2s"]
        let first = try TestDaemon(settings)
        try first.setState(app.pid, "foreground")
        let start = Clock.monotonicNanoseconds()
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try waitUntil("the app stopped", timeout: 1) { processState(app.pid) == "T" }
        _ = try first.apps()  // answered in a later pass than the stops': their record is written
        try first.crash()
        let crashed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        try #require(crashed < 0.9, "the daemon was killed \(crashed)s after the termination, maybe after its signal")
        try app.signal(SIGKILL)  // someone else's doing
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        #expect(!unstoppable.child.hasExited)
        let restarted = Clock.monotonicNanoseconds()
        let second = try first.restart(settings)
        try waitUntil("the stopped child killed", timeout: 6) { unstoppable.child.hasExited }
        let killed = Double(Clock.monotonicNanoseconds() - restarted) / 1e9
        if signal == "SIGTERM" {
            // Signalled once the wait for its stop ended (half the grace: it cannot stop); a
            // `sleep` takes `SIGTERM`'s default action, frozen or not.
            #expect(second.logged { $0.contains("App pid \(app.pid) (?) was being terminated when ") && $0.contains("its SIGTERM not sent yet") })
            #expect(second.logged { $0.contains("App pid \(app.pid) (?): not every process of it had stopped 1s after its termination; signalled all the same") })
            #expect(killed >= 0.9 && killed < 2.5, "killed \(killed)s after the restart: by SIGTERM a second after it, not by SIGKILL the grace after that")
        } else {
            #expect(second.logged { $0.contains("App pid \(app.pid) still had 1 process(es) after the termination's bound; sent SIGKILL") })
        }
    }

    /// What a killed daemon's catchable termination signalled is killed by the next daemon
    /// when the grace ends: here a child that ignores `SIGTERM` and outlives its parent's
    /// handler, re-parented away from the app's tree (no walk finds it; the next daemon
    /// re-proves the saved process by pid, start time and pidfs inode). Before, it lived on.
    /// Also for uid 65534's app.
    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon and setpriv to uid 65534"), arguments: [false, true])
    func whatAKilledDaemonSignalledIsKilledByTheNextWhenTheGraceEnds(asNobody: Bool) throws {
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let command = (asNobody ? nobody : []) + ["/usr/bin/python3", "-c", """
            import os, signal, subprocess
            def handler(*_):
                print('got-term', flush=True)
                os._exit(0)
            signal.signal(signal.SIGTERM, handler)
            child = subprocess.Popen(['/bin/sleep', '1000'], stdout=subprocess.DEVNULL,
                                     preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
            print('child', child.pid, flush=True)
            while True: signal.pause()
            """]
        let app = try Spawned(command[0], Array(command.dropFirst()))
        let line = try #require(try app.readLine(timeout: 5))
        let child = try Pidfd.open(pid: try #require(Int32(line.split(separator: " ").last ?? ""), "not a pid: \(line)"))
        defer { try? child.send(signal: SIGKILL) }  // the test's own, if the daemon missed it
        try #require(processTree(of: app.pidfd).map(\.pid).contains(child.pid))
        let settings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=2s"]
        let first = try TestDaemon(settings)
        try first.setState(app.pid, "foreground")
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try app.expectLine("got-term")
        let signalled = Clock.monotonicNanoseconds()
        #expect(Spawned.exitCode(try app.wait(timeout: 5)) == 0)  // its handler's exit; the child lives on
        #expect(!child.hasExited)
        _ = try first.apps()  // answered in a later pass than the signal's: its record is written
        try first.crash()
        let second = try first.restart(settings)
        try waitUntil("the signalled child killed at the grace's end", timeout: 5) { child.hasExited }
        let killed = Double(Clock.monotonicNanoseconds() - signalled) / 1e9
        #expect(killed >= 1.9, "killed \(killed)s after the signal; the grace is 2s")
        #expect(second.logged { $0.contains("App pid \(app.pid) still had 1 process(es) after the terminate grace; sent SIGKILL") })
    }

    /// A killed daemon's catchable termination of a unit app is finished by the next daemon
    /// as it would have been: the unit's cgroup killed whole when the grace ends, if it is
    /// still the one signalled (saved with its inode). Here the app's handler forks a process
    /// that ignores `SIGTERM` into a session of its own and exits: in no list of what was
    /// signalled, found by no walk, only the cgroup holds it. Before, it lived on. Also for
    /// uid 65534's app in a unit delegated to it.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"),
          arguments: [false, true])
    func aKilledDaemonsUnitAppIsKilledWholeByTheNextWhenTheGraceEnds(asNobody: Bool) throws {
        let unit = try TestUnit("restart-whole-\(asNobody)")
        let (first, escaped, signalled) = try Self.unitAppSignalledByAKilledDaemon(unit, asNobody: asNobody)
        let second = try first.restart(Self.unitSettings)
        defer { withExtendedLifetime(second) {} }
        try waitUntil("the escaped process killed with its unit at the grace's end", timeout: 5) { escaped.hasExited }
        let killed = Double(Clock.monotonicNanoseconds() - signalled) / 1e9
        #expect(killed >= 1.5, "killed \(killed)s after the signal; the grace is 2s")
    }

    /// The same unit started again while no daemon ran (its cgroup made anew at its path, a
    /// new process in it, as systemd's `Restart=` does) is not the cgroup the killed daemon
    /// signalled (another inode): the next daemon does not kill it when the grace ends.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"))
    func aUnitStartedAgainBeforeTheNextDaemonIsNotKilledByIt() throws {
        let unit = try TestUnit("restart-again"), elsewhere = try TestUnit("restart-elsewhere")
        let (first, escaped, _) = try Self.unitAppSignalledByAKilledDaemon(unit, asNobody: false)
        // The old instance's last process moved out (the test's own, killed with `elsewhere`),
        // its cgroup removed and made again.
        try writeFile(elsewhere.cgroup.directory + "/cgroup.procs", Array("\(escaped.pid)".utf8))
        try waitUntil("the old instance empty") { try unit.cgroup.processes().isEmpty }
        try systemCall("rmdir(\(unit.cgroup.directory))") { rmdir(unit.cgroup.directory) }
        try systemCall("mkdir(\(unit.cgroup.directory))") { mkdir(unit.cgroup.directory, 0o755) }
        let again = try unit.spawn(["/bin/sleep", "600"])
        try waitUntil("the new instance's process in it") { try unit.cgroup.processes() == [again.pid] }
        let second = try first.restart(Self.unitSettings)
        func toldApart() -> Bool {
            second.logged { $0.contains("\(unit.cgroup.directory) was started again within its terminate grace") }
        }
        try waitUntil("the grace's end", timeout: 5) { toldApart() || again.pidfd.hasExited }
        #expect(!again.pidfd.hasExited, "the unit's new instance was killed")
        #expect(toldApart())
        #expect(!escaped.hasExited)  // not in the cgroup any more, nor signalled
    }

    static let unitSettings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=2s"]

    /// A unit app in `unit` whose `SIGTERM` handler forks a process that ignores it into a
    /// session of its own, then exits; terminated by a daemon that is killed once it has
    /// written the termination. The escaped process, and when its line was read.
    private static func unitAppSignalledByAKilledDaemon(_ unit: TestUnit, asNobody: Bool) throws -> (TestDaemon, Pidfd, Int64) {
        if asNobody {
            for path in [unit.cgroup.directory, unit.cgroup.directory + "/cgroup.procs", unit.cgroup.directory + "/cgroup.freeze"] {
                try systemCall("chown(\(path))") { chown(path, 65534, 65534) }
            }
        }
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let app = try unit.spawn((asNobody ? nobody : []) + ["/usr/bin/python3", "-c", """
            import os, signal
            def handler(*_):
                child = os.fork()
                if child == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    os.setsid()
                    if os.fork() == 0:
                        os.write(1, b'escaped %d\\n' % os.getpid())  # one write: the lines race
                        os.execv('/bin/sleep', ['sleep', '1000'])
                    os._exit(0)
                os.waitpid(child, 0)
                os.write(1, b'got-term\\n')
                os._exit(0)
            signal.signal(signal.SIGTERM, handler)
            print('ready', flush=True)
            while True: signal.pause()
            """])
        try app.expectLine("ready")
        let first = try TestDaemon(unitSettings)
        try first.setState(app.pid, "foreground")
        try #require(try first.app(app.pid)?["containment"] == "unit", "not taken for a unit app")
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        // The escaped process's line and the handler's, in either order (they race).
        func line() throws -> String {
            if let line = try app.readLine(timeout: 5) { return line }
            // Seen once in CI (the sixty-fourth round, uid 65534's case, beside the whole suite;
            // not reproduced alone): the app's output ended before either line. How it ended,
            // what the unit held and what the daemon did say why, next time.
            let status = try? app.wait(timeout: 1)
            throw TestFailure("the app's output ended before its handler's lines: wait status \(status.map { String($0) } ?? "unknown")"
                + " (signal \(status.flatMap(Spawned.terminatingSignal).map { String($0) } ?? "none")); the unit's processes "
                + "\((try? unit.cgroup.processes()) ?? []); the daemon's log:\n\(first.log().suffix(30).joined(separator: "\n"))")
        }
        let lines = [try line(), try line()]
        let signalled = Clock.monotonicNanoseconds()
        #expect(lines.contains("got-term"))
        let line = try #require(lines.first { $0.hasPrefix("escaped ") }, "\(lines)")
        let escaped = try Pidfd.open(pid: try #require(Int32(line.split(separator: " ").last ?? ""), "not a pid: \(line)"))
        #expect(Spawned.exitCode(try app.wait(timeout: 5)) == 0)  // its handler's exit; the escaped one lives on
        #expect(!escaped.hasExited)
        _ = try first.apps()  // answered in a later pass than the signal's: its record is written
        try first.crash()
        return (first, escaped, signalled)
    }

    /// A stopping daemon signals at once the terminations still waiting for their stops, and
    /// saves them as signalled: the next daemon does not send the signal again (the app's
    /// handler, still running, would have been called a second time), and its `SIGKILL` comes
    /// the grace after the stopping daemon's signal.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"))
    func aTerminationSignalledByAStoppingDaemonIsNotSignalledAgain() throws {
        let unstoppable = try UnstoppableApp("stopped", handler: 1.5, asNobody: false)
        let app = unstoppable.app
        let settings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=3s"]
        let first = try TestDaemon(settings)
        try first.setState(app.pid, "foreground")
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try waitUntil("the app stopped", timeout: 1) { processState(app.pid) == "T" }
        try first.stop()
        try app.expectLine("got-term")  // sent by the stopping daemon
        let signalled = Clock.monotonicNanoseconds()
        let second = try first.restart(settings)
        defer { withExtendedLifetime(second) {} }
        #expect(try app.readLine(timeout: 5) == "handled")
        #expect(try app.readLine(timeout: 5) == nil, "a second signal")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        let killed = Double(Clock.monotonicNanoseconds() - signalled) / 1e9
        #expect(killed >= 2.5 && killed < 4, "SIGKILL came \(killed)s after the stopping daemon's signal; the grace is 3s")
    }

    /// A termination's signal sent before the daemon was killed is not sent again by the next
    /// one, whose `SIGKILL` comes at the saved instant: the grace after the first signal.
    @Test func aTerminationsSignalSentBeforeAKillIsNotSentAgain() throws {
        let app = try Spawned("/usr/bin/python3", ["-c", """
            import signal
            signal.signal(signal.SIGTERM, lambda *_: print('got-term', flush=True))
            print('ready', flush=True)
            while True: signal.pause()
            """])
        try app.expectLine("ready")
        let settings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=2s"]
        let first = try TestDaemon(settings)
        try first.setState(app.pid, "foreground")
        let start = Clock.monotonicNanoseconds()
        try first.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try app.expectLine("got-term")
        _ = try first.apps()  // answered in a later pass than the signal's: its record is written
        try first.crash()
        let second = try first.restart(settings)
        defer { withExtendedLifetime(second) {} }
        #expect(try app.readLine(timeout: 5) == nil, "a second signal")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        let killed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(killed >= 2 && killed < 3, "SIGKILL came \(killed)s after the termination; the grace is 2s")
    }

    @Test func nothingIsLostOverManyKills() throws {
        let settings = ["BackgroundTimeSec=5min", "GrantLatencyMinSec=1ms", "GrantLatencyMaxSec=20ms"]
        var daemon = try TestDaemon(settings)
        let worker = try daemon.probe(), sleeper = try daemon.probe(), idle = try daemon.probe()
        let first = try worker.begin("first")
        // Granted before the background, or it is denied and the worker suspended (rule 4).
        try waitUntil("task \(first) granted") { try daemon.tasks().first { $0["id"]?.intValue == first }?["state"] == "granted" }
        try daemon.setState(worker.pid, "background")
        try daemon.setState(sleeper.pid, "background")
        try waitUntil("pid \(sleeper.pid) stopped") { processState(sleeper.pid) == "T" }
        var held: [Int64] = []
        for round in 1...25 {
            // Change something every round: a task begun, one ended, the idle app moved.
            held.append(try idle.begin("round \(round)"))
            if round % 3 == 0 { try idle.call("end \(held.removeFirst())") }
            if round % 2 == 0 {  // as for the worker: a pending task would be denied and the app suspended
                try waitUntil("round \(round): the idle app's tasks granted") {
                    try daemon.tasks(idle.pid).allSatisfy { $0["state"] == "granted" }
                }
            }
            try daemon.setState(idle.pid, round % 2 == 0 ? "background" : "foreground")
            let before = try Listing(daemon)
            try daemon.crash()
            // Another process: not its pid (with pid_max 32,768 a busy machine reuses the killed
            // one's — a CI run did), its pidfs inode, never reused while the machine runs.
            let killed = daemon.process.pidfd.inode
            daemon = try daemon.restart(settings)
            #expect(daemon.process.pidfd.inode != killed)
            let after = try Listing(daemon)
            // A task begun just before the kill may have been granted since; nothing else moves.
            #expect(after.apps == before.apps, "round \(round)")
            #expect(after.tasks.map { $0.replacingOccurrences(of: " pending", with: " granted") }
                    == before.tasks.map { $0.replacingOccurrences(of: " pending", with: " granted") }, "round \(round)")
            #expect(before.deadlinesAgree(with: after) == [], "round \(round)")
            #expect(processState(sleeper.pid) == "T", "round \(round)")
        }
        try daemon.setState(sleeper.pid, "foreground")
        try waitUntil("pid \(sleeper.pid) resumed") { processState(sleeper.pid) != "T" }
        #expect(try daemon.tasks(idle.pid).map { $0["id"]!.intValue! } == held)
    }

    /// The state file's inode (0 while there is none): a rewrite makes a new file.
    static func stateInode(_ daemon: TestDaemon) -> UInt {
        var info = stat()
        return stat(daemon.statePath, &info) == 0 ? UInt(info.st_ino) : 0
    }

    /// The inode once the state file is written.
    static func writtenStateInode(_ daemon: TestDaemon) throws -> UInt {
        try waitUntil("the state file written") { stateInode(daemon) != 0 }
        return stateInode(daemon)
    }

    /// The log grows past its bound (4,096 lines here) and is rewritten once the calls pause,
    /// as a new file (another inode) that a restarted daemon reads whole.
    @Test func aGrownLogIsRewrittenOnceCallsPauseAndStaysWhole() throws {
        var daemon = try TestDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let app = try daemon.connect()
        let kept = try app.call("io.bgtaskd.App.BeginTask", ["name": "kept"])["taskId"]!.intValue!
        let first = try Self.writtenStateInode(daemon)
        func inode() -> UInt { Self.stateInode(daemon) }
        // Each pair writes two task lines: 2,100 pairs are past 4,096 lines.
        for round in 0..<2_100 {
            let id = try app.call("io.bgtaskd.App.BeginTask", ["name": .string("round \(round)")])["taskId"]!.intValue!
            _ = try app.call("io.bgtaskd.App.EndTask", ["taskId": .int(id)])
        }
        try waitUntil("the log rewritten", timeout: 10) { inode() != first }
        let before = try Listing(daemon)
        #expect(before.tasks.count == 1)
        try daemon.crash()
        daemon = try daemon.restart(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        // The app's connection went with the old daemon; the task was not bound to it.
        let after = try Listing(daemon)
        #expect(after.tasks == before.tasks)
        #expect(after.tasks.first?.hasPrefix("\(kept) ") == true)
    }

    /// Under calls that never pause, a due rewrite waits only until the log has doubled:
    /// its size is bounded whatever the rate (a flood cannot grow it without end). Due at
    /// some 4,100 lines past the last rewrite here (two task lines a pair), doubled at some
    /// 4,100 pairs, looked at every 100 ms while calls go on: rewritten well before 6,000.
    @Test func aLogUnderCallsThatNeverPauseIsRewrittenOnceItDoubles() throws {
        let daemon = try TestDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let app = try daemon.connect()
        _ = try app.call("io.bgtaskd.App.BeginTask", ["name": "kept"])
        let first = try Self.writtenStateInode(daemon)
        func inode() -> UInt { Self.stateInode(daemon) }
        var rewrittenAt: Int?
        for round in 0..<8_000 where rewrittenAt == nil {
            let id = try app.call("io.bgtaskd.App.BeginTask", ["name": .string("round \(round)")])["taskId"]!.intValue!
            _ = try app.call("io.bgtaskd.App.EndTask", ["taskId": .int(id)])
            if inode() != first { rewrittenAt = round }
        }
        let at = try #require(rewrittenAt, "not rewritten in 8,000 pairs without a pause")
        #expect(at < 6_000, "rewritten after \(at) pairs")
        #expect(try Listing(daemon).tasks.count == 1)
    }

    /// The daemon's page faults so far (`/proc/PID/stat` field 10, `minflt`).
    static func pageFaults(_ daemon: TestDaemon) throws -> Int {
        let stat = String(decoding: try readFile("/proc/\(daemon.process.pid)/stat"), as: UTF8.self)
        let fields = stat[stat.range(of: ")", options: .backwards)!.upperBound...].split(separator: " ")
        return Int(fields[7])!  // field 10, counting from the pid as 1
    }

    /// Pages of the state file in the daemon's mapping of it (`Rss` in `/proc/PID/smaps`).
    static func stateResidentPages(_ daemon: TestDaemon) throws -> Int {
        let smaps = String(decoding: try readFile("/proc/\(daemon.process.pid)/smaps", limit: 16 << 20), as: UTF8.self)
        var inState = false
        for line in smaps.split(separator: "\n") {
            if let first = line.first, first.isHexDigit, line.contains("-") {
                inState = line.hasSuffix(daemon.statePath)
            } else if inState, line.hasPrefix("Rss:") {
                return (Int(line.split(separator: " ")[1]) ?? 0) / 4
            }
        }
        return 0
    }

    /// The log's text length: the file up to its first NUL (`MappedLog` reserves room as zeros).
    static func stateTextBytes(_ daemon: TestDaemon) throws -> Int {
        let bytes = try readFile(daemon.statePath, limit: 64 << 20)
        return bytes.firstIndex(of: 0) ?? bytes.count
    }

    /// Once calls pause, the log's next appends are prepared: a run of appends like the one
    /// before the pause takes its page faults then, not one per page as it goes, and room
    /// for more than a slice (`Daemon.roomSlice`, 1 MiB) is prepared a slice per pass until
    /// it is all there. A first run of 5,000 tasks begun and kept (long names: ~2.3 MB of
    /// task lines, short of a rewrite at 4 lines per live task), a pause: the room's pages,
    /// as many as the run appended, come into the daemon's mapping (a slice alone: under
    /// half of them); then a second run of 1,000 pairs takes fewer page faults in the daemon,
    /// log and all, than a fifth of the pages it appends (each one a fault unprepared).
    ///
    /// The first run must not pause: 100 ms between two of its calls and the daemon prepares
    /// there, for the run so far. Beside the other suites on a loaded machine it can (the
    /// client is not the only one on the CPUs): such a run is not measured, and another daemon
    /// tries again, six times at most (three were not enough in one CI run of the fifty-third
    /// round: each first run had a gap of 80 ms or more; a try takes about 2 s).
    ///
    /// A try over the bound is tried again too, within the six: faults from elsewhere only
    /// add, while a log whose room was not prepared takes one a page in every try. Twice a
    /// second run took more than the preparation leaves — 70 for 121 pages beside `make deb`
    /// and two containers (fifty-seventh round), 35 in a CI run of the fifty-eighth — where
    /// every other run here takes 4 or 5 (the heap's 16 KiB), the daemon idle takes none in
    /// 25 s, and the kernel migrated, collapsed or swapped nothing (`/proc/vmstat`). Not
    /// found since; a failure lists each try's mappings that grew, for the next one to say.
    ///
    /// The state file is on a tmpfs, as under systemd (`/run/bgtaskd-state`) and in the bench.
    /// On a disk file system the kernel's writeback marks the pages it wrote read-only again
    /// (to see the next change), and the next append to each takes a fault no preparation
    /// saves: a CI run just after the build's writes took 72 faults for 121 pages in /tmp on
    /// ext4, and `sync` in a loop beside it makes 132–138.
    @Test(.disabled(if: Capabilities.sanitized, "a sanitizer's shadow memory faults beside the log's pages"),
          .disabled(if: tmpfs == nil, "no tmpfs at /dev/shm for the state file"))
    func aPauseAfterARunOfAppendsPreparesItsPagesForTheNext() throws {
        var over: [String] = []
        for _ in 1...6 {
            guard let run = try Self.preparationMeasured() else { continue }
            if run.taken < run.pages / 5 { return }
            over.append("\(run.taken) page faults for \(run.pages) pages appended (grew: \(run.grew.joined(separator: ", ")))")
        }
        if over.isEmpty { Issue.record("six first runs each paused 80 ms or more between two calls: nothing measured") }
        else { Issue.record("no second run took fewer page faults than a fifth of its pages: \(over.joined(separator: "; "))") }
    }

    /// Resident kilobytes of each of the daemon's mappings (`/proc/PID/smaps`), by its line.
    static func residentMappings(_ daemon: TestDaemon) -> [String: Int] {
        let smaps = String(decoding: (try? readFile("/proc/\(daemon.process.pid)/smaps", limit: 16 << 20)) ?? [], as: UTF8.self)
        var resident: [String: Int] = [:], mapping = ""
        for line in smaps.split(separator: "\n") {
            if let first = line.first, first.isHexDigit, line.contains("-") {
                let fields = line.split(separator: " ")
                mapping = fields[0] + " " + (fields.count > 5 ? fields[5] : "[anonymous]")
            } else if line.hasPrefix("Rss:") {
                resident[mapping] = Int(line.split(separator: " ")[1]) ?? 0
            }
        }
        return resident
    }

    /// /dev/shm if a tmpfs is mounted there (`/proc/self/mounts`), else nil.
    static let tmpfs: String? = {
        let mounts = (try? readFile("/proc/self/mounts")).map { String(decoding: $0, as: UTF8.self) } ?? ""
        let onShm = mounts.split(separator: "\n").filter { $0.split(separator: " ").dropFirst().first == "/dev/shm" }
        return onShm.last?.split(separator: " ").dropFirst(2).first == "tmpfs" ? "/dev/shm" : nil
    }()

    /// One try of the test above: the second run's page faults and pages appended, and the
    /// mappings whose resident size changed meanwhile; nil if the first run paused.
    private static func preparationMeasured() throws -> (taken: Int, pages: Int, grew: [String])? {
        var template = Array((tmpfs! + "/bgtaskd-test-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
        let daemon = try TestDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "MaxTasksPerApp=10000"],
                                    directory: String(cString: made))
        let app = try daemon.connect()
        let first = try Self.writtenStateInode(daemon)
        let long = String(repeating: "a task with a long name, ", count: 8)
        let start = try Self.stateTextBytes(daemon)
        var last: Int64 = 0, answered = Clock.monotonicNanoseconds(), longestGap: Int64 = 0
        for round in 0..<5_000 {
            last = try app.call("io.bgtaskd.App.BeginTask", ["name": .string("\(long)\(round)")])["taskId"]!.intValue!
            let now = Clock.monotonicNanoseconds()
            longestGap = max(longestGap, now - answered)
            answered = now
        }
        // One ended, and 5,000 of them: the second run's pairs then hold no more tasks at
        // once than the first did, and their entries in the model's age queue fit the room
        // the first run left it (after 4,000 the queue's storage doubled in the second run:
        // 16 page faults of its own).
        _ = try app.call("io.bgtaskd.App.EndTask", ["taskId": .int(last)])
        guard longestGap < 80_000_000 else { return nil }
        let text = try Self.stateTextBytes(daemon)
        let pages = (text - start) / 4096
        try #require(pages > 2 * 256, "\(pages) pages appended: not more than two slices (Daemon.roomSlice: 1 MiB)")
        // 100 ms after the last append the room is prepared, a slice per pass, as much as
        // the run appended: then every page of the log up to there is in the daemon's
        // mapping (the text's through the appends, the room's through the preparation).
        let prepared = (text + (text - start)) / 4096
        try waitUntil("the next run's pages prepared", timeout: 5) { try Self.stateResidentPages(daemon) >= prepared }
        let residentBefore = Self.residentMappings(daemon)
        let before = try Self.pageFaults(daemon)
        for round in 0..<1_000 {
            let id = try app.call("io.bgtaskd.App.BeginTask", ["name": .string("\(long)second \(round)")])["taskId"]!.intValue!
            _ = try app.call("io.bgtaskd.App.EndTask", ["taskId": .int(id)])
        }
        let appended = try Self.stateTextBytes(daemon) - text
        let taken = try Self.pageFaults(daemon) - before
        try #require(Self.stateInode(daemon) == first, "rewritten: the runs are not one log's")
        let grew = Self.residentMappings(daemon).filter { $0.value != residentBefore[$0.key] ?? 0 }
            .map { "\($0.key) \(residentBefore[$0.key] ?? 0) → \($0.value) KiB" }.sorted()
        return (taken, appended / 4096, grew)
    }

    /// A daemon killed between binding its socket and renaming it into place leaves the
    /// socket under its staging name: the next daemon on that directory removes it and says
    /// so.
    @Test func aStagingSocketLeftByAKilledDaemonIsRemovedAtTheNextStart() throws {
        let daemon = try TestDaemon()
        try daemon.crash()
        let gone = daemon.process.pid  // killed and reaped: as one killed while it started
        let stale = daemon.directory + "/.bgtaskd-\(gone)-1"
        try UnixSocket.listen(path: stale).close()
        let restarted = try daemon.restart()
        #expect(!FileSystem.exists(stale))
        #expect(restarted.logged { $0.contains("Removed \(stale), a socket left by a bgtaskd killed while it was starting") })
    }

    /// An app whose lines in the state file cannot be read back (a state this daemon does not
    /// know: a newer daemon's file, a corrupt one) is kept in the foreground, its process
    /// continued: dropped, the process the last daemon stopped stayed stopped, with nobody to
    /// resume it. So is one of a file of this boot in another format, refused whole.
    @Test(arguments: [false, true]) func anAppWhoseLinesCannotBeReadBackIsKeptInTheForegroundAndContinued(wholeFile: Bool) throws {
        let first = try TestDaemon()
        let probe = try first.probe()
        try first.setState(probe.pid, "background")  // no task: suspended at once
        try waitUntil("pid \(probe.pid) stopped") { processState(probe.pid) == "T" }
        try first.crash()
        let bytes = try readFile(first.statePath, limit: 64 << 20)
        let text = String(decoding: bytes[..<(bytes.firstIndex(of: 0) ?? bytes.count)], as: UTF8.self)
        var edited = 0
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
            if wholeFile, line.hasPrefix(#"{"#), line.contains(#""format":1"#) {  // the header
                edited += 1
                return String(line).replacing(#""format":1"#, with: #""format":2"#)
            }
            guard !wholeFile, line.hasPrefix(#"{"app":"#), line.contains(#""pid":\#(probe.pid),"#), line.contains(#""suspended""#) else {
                return String(line)
            }
            edited += 1
            return String(line).replacing(#""suspended""#, with: #""hibernating""#)
        }
        #expect(edited > 0, "no app line of pid \(probe.pid) in \(text)")
        let file = try FileDescriptor(systemCall("open") { open(first.statePath, O_WRONLY | O_TRUNC) })
        try file.writeAll(Array(lines.joined(separator: "\n").utf8))
        let daemon = try first.restart()
        try waitUntil("pid \(probe.pid) continued") { processState(probe.pid) != "T" }
        #expect(try daemon.app(probe.pid)?["state"] == "foreground")
        #expect(daemon.logged {
            $0.contains(wholeFile ? "starting afresh; 1 of its apps kept, in the foreground"
                                  : "unknown AppState 'hibernating'; app pid \(probe.pid) kept, in the foreground")
        })
        unlink(daemon.statePath + ".unreadable")
        try daemon.setState(probe.pid, "background")  // and it is the daemon's again
        try waitUntil("pid \(probe.pid) stopped again") { processState(probe.pid) == "T" }
        try daemon.setState(probe.pid, "foreground")
    }

    @Test func aSecondDaemonOnTheSameStateIsRefusedAndABadFileIsSetAside() throws {
        let daemon = try TestDaemon()
        let second = try Spawned(Binaries.path("bgtaskd"), ["--socket", daemon.directory + "/other"],
                                 environment: ["RUNTIME_DIRECTORY=\(daemon.directory)"], standardError: .mergeIntoOutput)
        let output = try second.readAll(timeout: 10)
        #expect(Spawned.exitCode(try second.wait(timeout: 10)) == 1)
        #expect(output.contains("another bgtaskd keeps its state in \(daemon.directory)"), "\(output)")
        #expect(UnixSocket.isAnswering(path: daemon.socketPath))

        try daemon.crash()
        let garbage = "not a state file\n\u{1b}[2J\0\n"
        let file = try FileDescriptor(systemCall("open") { open(daemon.statePath, O_WRONLY | O_TRUNC) })
        try file.writeAll(Array(garbage.utf8))
        let restarted = try daemon.restart()
        #expect(try restarted.apps().isEmpty)
        #expect(String(decoding: try readFile(daemon.statePath + ".unreadable"), as: UTF8.self) == garbage)
        unlink(daemon.statePath + ".unreadable")
        try waitUntil("the warning logged") { restarted.log().contains { $0.contains("is not a bgtaskd state file") } }
    }
}
