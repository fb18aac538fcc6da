// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Whole process trees, the freezer and its fallback, escalation, stray SIGCONT, recycled
/// pids, history, monitor, and `bgtaskctl run` — against the built daemon.
@Suite(.serialized) struct EnforcementEndToEndTests {
    static let tree = "sleep 60 & sh -c 'sleep 60 & sleep 60 & wait' & echo ready; wait"

    @Test func wholeTreeIsStoppedResumedAndTerminated() throws {
        let daemon = try TestDaemon(["SuspendMode=signal"])
        let app = try Spawned("/bin/sh", ["-c", Self.tree])
        try app.expectLine("ready")
        try waitUntil("five processes") { processTree(of: app.pidfd).count == 5 }
        let members = ProcessTree.members(of: app.pidfd)
        try daemon.setState(app.pid, "background")
        try waitUntil("every process stopped") { members.allSatisfy { processState($0.pid) == "T" } }
        try daemon.setState(app.pid, "foreground")
        try waitUntil("every process running") { members.allSatisfy { processState($0.pid) != "T" } }
        let (code, _) = try daemon.ctl(["terminate", "\(app.pid)"])
        #expect(code == 0)
        try waitUntil("every process gone") { members.allSatisfy(\.hasExited) }
        #expect(try daemon.history().last?["reason"]?.stringValue == "manager")
    }

    @Test(.enabled(if: Capabilities.cgroupsWritable, "needs a writable cgroup v2 hierarchy (root)"))
    func appWithItsOwnCgroupIsFrozenAndThawed() throws {
        let cgroup = Cgroup(directory: Cgroup.mountPoint! + "/bgtaskd-test-\(getpid())-app")
        try systemCall("mkdir") { mkdir(cgroup.directory, 0o755) }
        defer { rmdir(cgroup.directory) }
        let daemon = try TestDaemon(["SuspendMode=freezer"])
        let app = try Spawned("/bin/sh", ["-c", "echo $$ > \(cgroup.directory)/cgroup.procs; " + Self.tree])
        try app.expectLine("ready")
        try waitUntil("five processes in the cgroup") { try cgroup.processes().count == 5 }
        try daemon.setState(app.pid, "background")
        try waitUntil("frozen 1") { try cgroup.isFrozen() }
        #expect(ProcessTree.members(of: app.pidfd).allSatisfy { processState($0.pid) != "T" })  // frozen, not stopped
        try app.signal(SIGCONT)  // a stray SIGCONT cannot undo the freezer
        #expect(try cgroup.isFrozen())
        try daemon.setState(app.pid, "foreground")
        try waitUntil("frozen 0") { try !cgroup.isFrozen() }
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try waitUntil("the cgroup empty") { try cgroup.processes().isEmpty }
        #expect(!daemon.log().contains { $0.contains("cannot be frozen") })
    }

    @Test func freezerFallsBackToSignalsWhenTheCgroupIsShared() throws {
        let daemon = try TestDaemon(["SuspendMode=freezer"])
        let app = try Spawned("/bin/sleep", ["60"])  // in the test's own cgroup, with the test
        try daemon.setState(app.pid, "background")
        try waitUntil("stopped by signal") { processState(app.pid) == "T" }
        // A pass's log records go out when it ends, just after what it did.
        try waitUntil("the fallback logged") {
            daemon.log().contains { $0.contains("App pid \(app.pid) (sleep) cannot be frozen: ") && $0.hasSuffix("; suspending with SIGSTOP") }
        }
    }

    /// The grace is a second: the shell must run its trap within it, and beside two CPU hogs
    /// and forty suites 300 ms was not always enough (SIGKILL came first).
    @Test func catchableTerminateSignalIsFollowedBySIGKILLAfterTheGrace() throws {
        let daemon = try TestDaemon(["TerminateSignal=SIGTERM", "TerminateGraceSec=1s"])
        let app = try Spawned("/bin/sh", ["-c", "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.02; done"])
        try app.expectLine("ready")
        try daemon.setState(app.pid, "background")  // suspended: it must be thawed to see SIGTERM
        // The shell stopped, or waiting ('D') for the child it vforked, stopped before its exec.
        try waitUntil("stopped") {
            let states = ProcessTree.members(of: app.pidfd).compactMap { processState($0.pid) }
            return states.contains("T") && states.allSatisfy { $0 == "T" || $0 == "D" }
        }
        #expect(!daemon.log().contains { $0.contains("a stray SIGCONT?") }, "a vfork's parent taken for resumed")
        let start = Clock.monotonicNanoseconds()
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try app.expectLine("got-term")
        let status = try app.wait(timeout: 5)
        let elapsed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(Spawned.terminatingSignal(status) == SIGKILL)
        #expect(elapsed >= 1, "SIGKILL came \(elapsed)s after SIGTERM; the grace is 1s")
        #expect(elapsed < 3, "SIGKILL came \(elapsed)s after SIGTERM")
    }

    /// An app suspended while it waits for the child it `vfork`ed (`posix_spawn`; a shell's
    /// commands) stays in `D`: a stop does not end that wait, and its child, stopped before
    /// its `exec`, keeps it there. Terminated with a catchable signal, it is signalled at
    /// once, not with the `SIGKILL` at its grace's end: its fork is done (the child is on its
    /// list), so the daemon does not wait for it to stop. (It waited until the grace ran out:
    /// a shell's loop caught so got no time to run its trap — CI, twice.) Here the child
    /// waits in its `open` of a FIFO (a file action before its `exec`, every signal blocked
    /// there): continued, it is let through by the test, and its parent, out of its wait,
    /// runs its handler. Also with the app uid 65534's, the daemon root's: what its `wchan`
    /// says is read across users, and nobody's vfork is no way around the termination.
    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon and setpriv to uid 65534"), arguments: [false, true])
    func aVforksParentSuspendedInItsWaitIsSignalledAtOnce(asNobody: Bool) throws {
        let directory = try temporaryDirectory("bgtaskd-vfork")
        let fifo = directory + "/fifo"
        defer { unlink(fifo); rmdir(directory) }
        try systemCall("mkfifo") { mkfifo(fifo, 0o600) }
        if asNobody {
            for path in [directory, fifo] { try systemCall("chown") { chown(path, 65534, 65534) } }
        }
        let daemon = try TestDaemon(["TerminateSignal=SIGTERM", "TerminateGraceSec=3s", "SuspendMode=signal"])
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        // Idle after the spawn in `signal.pause()`: until a signal, then again.
        let python = ["/usr/bin/python3", "-c", """
            import os, signal, sys
            signal.signal(signal.SIGTERM, lambda *_: print('got-term', flush=True))
            print('ready', flush=True)
            os.posix_spawn('/bin/true', ['true'], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)])
            while True: signal.pause()
            """, fifo]
        let command = (asNobody ? nobody : []) + python
        let app = try Spawned(command[0], Array(command.dropFirst()))
        try app.expectLine("ready")  // as uid 65534 already: setpriv changed it before its exec
        #expect(try ProcStatus.uids(pid: app.pid).effective == (asNobody ? 65534 : 0))
        func states() -> [Character] { processTree(of: app.pidfd).map(\.state) }
        try waitUntil("waiting for its child, in its open") { states() == ["D", "S"] }
        try daemon.setState(app.pid, "background")
        try waitUntil("its child stopped, itself still waiting") { states() == ["D", "T"] }
        let start = Clock.monotonicNanoseconds()
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try waitUntil("the child continued with its signal", timeout: 2) { states() == ["D", "S"] }
        let writer = FileDescriptor(try systemCall("open(fifo)") { open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC) })
        try app.expectLine("got-term")
        writer.close()
        let elapsed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(elapsed < 2, "the handler ran \(elapsed)s after the termination; the grace is 3s")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
    }

    /// A termination's process that cannot stop (long in the kernel: here a child of the
    /// app's the test moved into a cgroup it froze, `UnstoppableApp`) has its app signalled at the bound — a second after the termination, or half
    /// the grace if that is sooner — and the grace runs from that signal: the app's handler, a
    /// little shorter than the grace, runs to its end. (It got its `SIGTERM` with the
    /// `SIGKILL` at the grace's end: no time at all; with the grace counted from the
    /// termination, a second or half the grace too little.) What an app gains so is bounded:
    /// the `SIGKILL` comes the grace after the signal, no later — also for uid 65534's app,
    /// whose process kept from stopping is no way to outlive it.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"),
          arguments: [(grace: 2.0, handler: 1.5, bound: 1.0, asNobody: false), (grace: 0.8, handler: 0.4, bound: 0.4, asNobody: false),
                      (grace: 2.0, handler: 1.5, bound: 1.0, asNobody: true)])
    func aTerminationWhoseChildCannotStopIsSignalledAtTheBoundWithItsWholeGrace(grace: Double, handler: Double, bound: Double,
                                                                              asNobody: Bool) throws {
        let unstoppable = try UnstoppableApp("unstoppable-\(Int(grace * 1000))-\(asNobody)", handler: handler, asNobody: asNobody)
        let app = unstoppable.app
        let daemon = try TestDaemon(["TerminateSignal=SIGTERM", "TerminateGraceSec=\(Int(grace * 1000))ms"])
        try daemon.setState(app.pid, "foreground")  // known to the daemon; running
        let start = Clock.monotonicNanoseconds()
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        var line: String?
        repeat { line = try app.readLine(timeout: 5) } while line != nil && line != "got-term"
        guard line != nil else {
            // Seen once in CI (the sixty-third round, uid 65534's case, cause unknown): the app's
            // output ended before its handler's line. What the daemon did to it says why, next time.
            let status = try? app.wait(timeout: 1)
            Issue.record("the app's output ended before 'got-term' (wait status \(status.map { String($0) } ?? "unknown")); the daemon's log:\n\(daemon.log().suffix(30).joined(separator: "\n"))")
            return
        }
        let signalled = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(signalled >= bound - 0.1, "signalled after \(signalled)s, before the bound (\(bound)s)")
        try waitUntil("the wait logged") {
            daemon.log().contains { $0.contains("App pid \(app.pid) (python3): not every process of it had stopped") }
        }
        try app.expectLine("handled")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        let killed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        #expect(killed >= signalled + handler, "SIGKILL came \(killed)s after the termination, the signal \(signalled)s")
        #expect(killed < signalled + grace + 1, "SIGKILL came \(killed)s after the termination, the signal \(signalled)s")
        try waitUntil("the frozen child killed too") { unstoppable.child.hasExited }
    }

    /// A daemon held up (here stopped) while a termination waits for its processes' stops,
    /// past the whole grace: the signal's bound and the `SIGKILL` fall due in one late pass.
    /// The signal goes out and the grace runs from it: the handler runs to its end, then
    /// `SIGKILL`. Before, `SIGTERM` and `SIGKILL` went out back to back (the handler never
    /// printed a line) — what a restarted daemon held up on a loaded machine did once in the
    /// suite (`RestartTests`). Also for uid 65534's app.
    @Test(.enabled(if: Capabilities.cgroupsWritable && getuid() == 0, "needs a writable cgroup v2 hierarchy and setpriv (root)"),
          arguments: [false, true])
    func aDaemonHeldUpPastATerminationsGraceStillGivesItsSignalTheGrace(asNobody: Bool) throws {
        let unstoppable = try UnstoppableApp("held-up-\(asNobody)", handler: 1, asNobody: asNobody)
        let app = unstoppable.app
        let daemon = try TestDaemon(["TerminateSignal=SIGTERM", "TerminateGraceSec=2s"])
        try daemon.setState(app.pid, "foreground")  // known to the daemon; running
        let start = Clock.monotonicNanoseconds()
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        try waitUntil("the app stopped", timeout: 1) { processState(app.pid) == "T" }
        try daemon.process.signal(SIGSTOP)
        defer { try? daemon.process.signal(SIGCONT) }
        // The signal's bound (1s) and the grace (2s) pass while the daemon is stopped: the
        // precondition, not a wait for an event (a stopped daemon makes none).
        waitForInstant(start + 2_300_000_000)
        // Still stopped: the signal did not go out before the daemon was.
        try #require(processState(app.pid) == "T", "the app was signalled before the daemon was stopped")
        let continued = Clock.monotonicNanoseconds()
        try daemon.process.signal(SIGCONT)
        try app.expectLine("got-term")
        try app.expectLine("handled")
        #expect(Spawned.terminatingSignal(try app.wait(timeout: 5)) == SIGKILL)
        let killed = Double(Clock.monotonicNanoseconds() - continued) / 1e9
        #expect(killed >= 1 && killed < 2 + 1, "SIGKILL came \(killed)s after the daemon went on; the grace is 2s")
        #expect(daemon.logged { $0.contains("App pid \(app.pid) was still to be sent its SIGTERM when its terminate grace ran out, ")
            && $0.contains(" late (the daemon was held up): the grace from now, 2s") })
        try waitUntil("the frozen child killed too") { unstoppable.child.hasExited }
    }

    @Test func straySIGCONTIsNoticedAndTheAppStoppedAgain() throws {
        let daemon = try TestDaemon(["SuspendMode=signal"])
        let app = try Spawned("/bin/sleep", ["60"])
        try daemon.setState(app.pid, "background")
        try waitUntil("stopped") { processState(app.pid) == "T" }
        try app.signal(SIGCONT)
        try waitUntil("the stray SIGCONT logged") {
            daemon.log().contains { $0.contains("App pid \(app.pid) (sleep) was resumed while suspended") }
        }
        try waitUntil("stopped again") { processState(app.pid) == "T" }
        #expect(try daemon.app(app.pid)?["state"]?.stringValue == "suspended")
    }

    /// The daemon is stopped while an app it is about to kill dies and its pid goes to a new
    /// process; when the daemon runs again the deadline has passed, and the new process must
    /// be untouched.
    @Test(.enabled(if: Capabilities.canRecyclePids, "needs CAP_SYS_ADMIN to write /proc/sys/kernel/ns_last_pid"))
    func aRecycledPidIsNeverSignalled() throws {
        try Capabilities.retryingWhilePidTaken {
            let daemon = try TestDaemon(["BackgroundTimeSec=400ms", "ExpirationWarningSec=100ms", "GrantLatencyMaxSec=5ms"])
            let probe = try daemon.probe()
            _ = try probe.begin("held")
            try waitUntil("the task granted") { try daemon.tasks().first?["state"]?.stringValue == "granted" }
            try daemon.setState(probe.pid, "background")
            let backgrounded = Clock.monotonicNanoseconds()
            try daemon.process.signal(SIGSTOP)
            defer { try? daemon.process.signal(SIGCONT) }
            let pid = probe.pid
            try probe.process.signal(SIGKILL)
            try probe.process.wait(timeout: 5)
            let newcomer = try Capabilities.spawn(reusing: pid)
            try waitUntil("the deadline to pass while bgtaskd is stopped") {
                Clock.monotonicNanoseconds() - backgrounded > 600_000_000
            }
            try daemon.process.signal(SIGCONT)
            try waitUntil("bgtaskd to forget the dead app") { try daemon.app(pid) == nil }
            #expect(processState(newcomer.pid) == "S")
            #expect(!newcomer.hasExited)
        }
    }

    @Test func historyAndMonitorShowActionsWithReasonsAndTaskNames() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=500ms", "ExpirationWarningSec=200ms", "GrantLatencyMaxSec=5ms"])
        let monitor = try Spawned(Binaries.path("bgtaskctl"), ["--socket", daemon.socketPath, "--json", "monitor"])
        #expect(try JSON.parse(try #require(try monitor.readLine(timeout: 5)))["event"] == "monitoring")
        let probe = try daemon.probe()
        let id = try probe.begin("upload")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"]?.stringValue == "granted" }
        try daemon.setState(probe.pid, "background")
        try probe.process.wait(timeout: 5)  // killed at the deadline, still holding "upload"
        var events: [JSON] = []
        try waitUntil("the termination on the monitor") {
            if let line = try monitor.readLine(timeout: 5) { events.append(try JSON.parse(line)) }
            return events.last?["event"] == "terminated"
        }
        let names = events.compactMap { $0["event"]?.stringValue }
        #expect(names.contains("taskChanged") && names.contains("taskExpired"))
        #expect(events.contains { $0["task"]?["id"]?.intValue == id && $0["task"]?["state"] == "granted" })
        let entry = try #require(events.last?["entry"])
        #expect(entry["reason"] == "assertionsBeyondPermittedTime" && entry["tasks"] == .array(["upload"]))
        let (code, table) = try daemon.ctl(["history"])
        #expect(code == 0)
        #expect(table.contains("terminated assertionsBeyondPermittedTime upload"))
    }

    /// `bgtaskctl run` as a backgrounded app: the command keeps running while the task is
    /// held, gets SIGTERM at the warning, and its exit status is passed on.
    @Test func runHoldsATaskWhileTheCommandRunsAndPassesOnItsStatus() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1s", "ExpirationWarningSec=400ms", "GrantLatencyMaxSec=5ms"])
        let script = "trap 'echo got-term; exit 7' TERM; echo started; while :; do echo tick; sleep 0.02; done"
        let run = try Spawned(Binaries.path("bgtaskctl"), ["--socket", daemon.socketPath, "run", "--name", "job",
                                                          "--", "sh", "-c", script])
        try run.expectLine("started")
        try waitUntil("the task granted") { try daemon.tasks(run.pid).first?["state"]?.stringValue == "granted" }
        #expect(try daemon.tasks(run.pid).first?["name"] == "job")
        try daemon.setState(run.pid, "background")
        let backgrounded = Clock.monotonicNanoseconds()
        try run.expectLine("tick")
        try run.expectLine("tick")  // still running in the background
        #expect(try daemon.app(run.pid)?["phase"] == "running")
        try run.expectLine("got-term")
        let warnedAfter = Double(Clock.monotonicNanoseconds() - backgrounded) / 1e9
        #expect(warnedAfter >= 0.5, "SIGTERM \(warnedAfter)s after entering the background; the warning is at 0.6s")
        #expect(Spawned.exitCode(try run.wait(timeout: 5)) == 7)
    }
}
