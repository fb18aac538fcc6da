// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import TestSupport
import Glibc
import Testing
import Varlink

/// The built daemon on a temporary socket, real child processes, budgets in milliseconds.
@Suite(.serialized) struct LifecycleEndToEndTests {
    static let budget = ["BackgroundTimeSec=1s", "ExpirationWarningSec=400ms", "TransitionTimeoutSec=400ms",
                         "GrantLatencyMinSec=5ms", "GrantLatencyMaxSec=20ms"]

    /// (a) A backgrounded app with no task is stopped; foreground makes it run again.
    @Test func backgroundedAppWithoutTasksIsStoppedAndResumed() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try Spawned("/bin/sleep", ["60"])
        try daemon.setState(app.pid, "background")
        try waitUntil("pid \(app.pid) stopped") { processState(app.pid) == "T" }
        #expect(try daemon.app(app.pid)?["state"]?.stringValue == "suspended")
        try daemon.setState(app.pid, "foreground")
        try waitUntil("pid \(app.pid) running again") { processState(app.pid) != "T" }
        #expect(!app.hasExited)
        let actions = try daemon.history().map { "\($0["action"]!.stringValue!) \($0["reason"]!.stringValue!)" }
        #expect(actions == ["suspended transitionFinished", "resumed foreground"])
    }

    /// (a2) Apps hidden and shown again leave the daemon asleep: the warnings and deadlines
    /// armed as they went to the background would do nothing when they fall due, and no
    /// longer wake it (20 apps: 42 wake-ups while they fell due, before; now 2, the state
    /// file's write and the last stray-`SIGCONT` check among them). The daemon in a
    /// network namespace of its own: `tree` apps, so that the forks of the tests running
    /// beside this one do not wake it (a `tracked` app's daemon reads every fork on the
    /// machine, 24 wake-ups in a loaded suite's window).
    @Test(.enabled(if: getuid() == 0, "needs root for a network namespace of the daemon's own (unshare --net)"))
    func appsShownAgainDoNotWakeTheDaemonAtTheirOldDeadlines() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=5s", "ExpirationWarningSec=2s"], wrapper: ["/usr/bin/unshare", "--net", "--"])
        let apps = try (0..<20).map { _ in try Spawned("/bin/sleep", ["60"]) }
        for app in apps { try daemon.setState(app.pid, "background") }
        let lastDeadline = Clock.monotonicNanoseconds() + 5_000_000_000  // BackgroundTimeSec after the last went
        for app in apps { try waitUntil("pid \(app.pid) stopped") { processState(app.pid) == "T" } }
        #expect(daemon.logged { $0.contains("(containment tree") })
        for app in apps { try daemon.setState(app.pid, "foreground") }
        let before = try voluntarySwitches(of: daemon.process.pid)
        waitForInstant(lastDeadline + 200_000_000)  // every old deadline passed
        let wakeUps = try voluntarySwitches(of: daemon.process.pid) - before
        #expect(wakeUps <= 8, "the daemon woke \(wakeUps) times while the old deadlines fell due")
        #expect(apps.allSatisfy { processState($0.pid) != "T" })
    }

    /// (b) A task ended after the warning: the app is stopped by the deadline, not killed.
    @Test func taskEndedAfterTheWarningStopsTheAppWithoutKillingIt() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        let id = try probe.begin("upload")
        try waitUntil("the task granted") { try daemon.tasks(probe.pid).first?["state"]?.stringValue == "granted" }
        let backgrounded = Clock.monotonicNanoseconds()
        try daemon.setState(probe.pid, "background")
        try waitUntil("the task expiring") { try daemon.tasks(probe.pid).first?["state"]?.stringValue == "expiring" }
        #expect(processState(probe.pid) != "T")
        // Ending its last task suspends the app at once: the reply waits until it resumes.
        try probe.send("end \(id)")
        try waitUntil("the probe stopped") { processState(probe.pid) == "T" }
        let stoppedAfter = Double(Clock.monotonicNanoseconds() - backgrounded) / 1e9
        #expect(stoppedAfter < 1.0, "stopped \(stoppedAfter)s after entering the background; the deadline was 1s")
        #expect(!probe.process.hasExited)
        #expect(try daemon.history().last?["reason"]?.stringValue == "tasksEnded")
        #expect(try daemon.app(probe.pid)?["state"]?.stringValue == "suspended")
    }

    /// (c) A task still held at the deadline: the app is killed by SIGKILL and forgotten.
    @Test func taskHeldAtTheDeadlineGetsTheAppKilled() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        _ = try probe.begin("sync")
        try waitUntil("the task granted") { try daemon.tasks(probe.pid).first?["state"]?.stringValue == "granted" }
        try daemon.setState(probe.pid, "background")
        let status = try probe.process.wait(timeout: 5)
        #expect(Spawned.terminatingSignal(status) == SIGKILL)
        #expect(try daemon.app(probe.pid) == nil)
        #expect(try daemon.tasks().isEmpty)
        let last = try daemon.history().last
        #expect(last?["action"]?.stringValue == "terminated")
        #expect(last?["reason"]?.stringValue == "assertionsBeyondPermittedTime")
        #expect(last?["tasks"] == .array(["sync"]))
        #expect(daemon.log().contains("<4>App pid \(probe.pid) (bgtask-probe) holding 'sync' terminated with SIGKILL: assertionsBeyondPermittedTime"))
    }

    /// `KeepAwake=` where logind cannot be reached (no system bus: every test daemon's, and
    /// this machine's): said once, not again within the minute, and nothing else changes —
    /// apps in the background are warned, suspended and resumed as ever. (Under a real logind:
    /// `SystemdTests.underARealSystemd`, `idle-inhibited-while-in-background`.)
    @Test func anUnreachableLogindIsSaidOnceAndChangesNothingElse() throws {
        let daemon = try TestDaemon(Self.budget)
        let error = "ask logind for an inhibitor on the system bus: No such file or directory"
        let line = "The machine may idle-suspend while apps run in the background: \(error); asking again in a minute"
        #expect(!daemon.log().contains { $0.contains("idle-suspend") })
        let keepAwake = { () throws -> [String?] in
            let status = try daemon.manager("GetStatus")
            return [status["keepAwake"]?.stringValue, status["keepAwakeError"]?.stringValue, status["idleInhibited"]?.boolValue.map { "\($0)" }]
        }
        #expect(try keepAwake() == ["idle", nil, "false"])
        for round in 1...2 {
            let probe = try daemon.probe()
            let id = try probe.begin("upload")
            try waitUntil("the task granted") { try daemon.tasks(probe.pid).first?["state"]?.stringValue == "granted" }
            try daemon.setState(probe.pid, "background")
            try waitUntil("the task expiring") { try daemon.tasks(probe.pid).first?["state"]?.stringValue == "expiring" }
            // Said to every caller alike, and by bgtaskctl.
            #expect(try keepAwake() == ["refused", error, "false"], "round \(round)")
            let (_, status) = try daemon.ctl(["status"], asUser: getuid() == 0 ? 65534 : nil)
            #expect(status.contains("   Keep awake: no: logind's idle inhibitor refused (\(error)); asked again each minute while apps run in the background\n"))
            try probe.send("end \(id)")
            try waitUntil("the probe stopped") { processState(probe.pid) == "T" }
            try daemon.setState(probe.pid, "foreground")
            try waitUntil("the probe running again") { processState(probe.pid) != "T" }
            #expect(daemon.log().filter { $0.contains("idle-suspend") } == ["<5>" + line], "round \(round)")
            #expect(try keepAwake() == ["idle", nil, "false"])
        }

        // `KeepAwake=no`: nothing asked for, nothing logged; "off".
        let off = try TestDaemon(Self.budget + ["KeepAwake=no"])
        let probe = try off.probe()
        _ = try probe.begin("upload")
        try waitUntil("the task granted") { try off.tasks(probe.pid).first?["state"]?.stringValue == "granted" }
        try off.setState(probe.pid, "background")
        try waitUntil("the task expiring") { try off.tasks(probe.pid).first?["state"]?.stringValue == "expiring" }
        let status = try off.manager("GetStatus")
        #expect(status["keepAwake"] == "off" && status["keepAwakeError"] == nil)
        #expect(try off.ctl(["status"]).1.contains("   Keep awake: no (KeepAwake=no)\n"))
        #expect(!off.log().contains { $0.contains("idle-suspend") })
    }

    /// (d) When the app's process exits, its tasks are gone.
    @Test func appExitRemovesItsTasks() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        _ = try probe.begin("a")
        _ = try probe.begin("b")
        #expect(try daemon.tasks().count == 2)
        try probe.send("exit 0")
        try probe.process.wait(timeout: 5)
        try waitUntil("the tasks gone") { try daemon.tasks().isEmpty }
        #expect(try daemon.apps().isEmpty)
    }

    /// (e) A subscriber sees didEnterBackground, taskGranted, taskExpiring in that order.
    @Test func subscriberReceivesEventsInOrder() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        try probe.send("subscribe")
        let subscribed = try probe.event("subscribed")
        #expect(subscribed["state"]?.stringValue == "foreground")
        try daemon.setState(probe.pid, "background")
        let entered = try probe.event("didEnterBackground")
        #expect(entered["transitionTimeout"]?.doubleValue == 0.4)
        #expect(entered["backgroundTimeRemaining"]?.doubleValue == 1.0)
        let id = try probe.begin("finish-upload")
        #expect(try probe.event("taskGranted")["taskId"]?.intValue == id)
        try probe.call("finish")
        let expiring = try probe.event("taskExpiring")
        #expect(expiring["taskIds"] == .array([.int(id)]))
        #expect(probe.eventNames == ["subscribed", "didEnterBackground", "taskGranted", "taskExpiring"])
        try probe.send("end \(id)")
        try waitUntil("the probe stopped") { processState(probe.pid) == "T" }
    }

    /// (f) A lifecycle-aware app that never finishes its transition is killed.
    @Test func unfinishedTransitionGetsTheAppKilled() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        try probe.send("subscribe")
        try probe.event("subscribed")
        try daemon.setState(probe.pid, "background")
        try probe.event("didEnterBackground")
        let status = try probe.process.wait(timeout: 5)
        #expect(Spawned.terminatingSignal(status) == SIGKILL)
        #expect(try daemon.history().last?["reason"]?.stringValue == "transitionTimeout")
    }

    /// A task requested too late in the transition window is denied and the app suspended.
    @Test func lateTaskIsDeniedAndTheAppSuspended() throws {
        let daemon = try TestDaemon(Self.budget.dropLast(2) + ["GrantLatencyMinSec=300ms", "GrantLatencyMaxSec=300ms"])
        let probe = try daemon.probe()
        try probe.send("subscribe")
        try probe.event("subscribed")
        try daemon.setState(probe.pid, "background")
        try probe.event("didEnterBackground")
        let id = try probe.begin("too-late")
        try probe.send("finish")  // suspends the app before its reply can be read
        try waitUntil("the probe stopped") { processState(probe.pid) == "T" }
        #expect(try daemon.tasks().isEmpty)
        #expect(try daemon.history().last?["reason"]?.stringValue == "transitionFinished")
        // Once resumed, the app reads what was sent while it was stopped.
        try daemon.setState(probe.pid, "foreground")
        let denied = try probe.event("taskDenied")
        #expect(denied["taskId"]?.intValue == id)
        #expect(denied["reason"]?.stringValue == "suspendedBeforeGrant")
        try probe.event("willEnterForeground")
    }

    /// A task begun with `more` streams its states and ends when its connection closes.
    @Test func streamedTaskFollowsItsStatesAndEndsWithItsConnection() throws {
        let daemon = try TestDaemon(Self.budget)
        let probe = try daemon.probe()
        try probe.send("begin-more streamed")
        let granted = try probe.next { $0["task"]?["state"]?.stringValue == "granted" }
        let id = try #require(granted["task"]?["taskId"]?.intValue)
        #expect(try daemon.tasks().map { $0["id"]?.intValue } == [id])
        try daemon.setState(probe.pid, "background")
        _ = try probe.next { $0["task"]?["state"]?.stringValue == "expiring" }
        try daemon.setState(probe.pid, "foreground")
        _ = try probe.next { $0["task"]?["state"]?.stringValue == "granted" }
        try probe.send("close-streams")
        try waitUntil("the streamed task gone") { try daemon.tasks().isEmpty }

        try probe.send("begin-more ended")
        let second = try probe.next { $0["task"]?["state"]?.stringValue == "granted" }["task"]!["taskId"]!
        try probe.call("end \(second.intValue!)")
        let ended = try probe.next { $0["task"]?["state"]?.stringValue == "ended" }
        #expect(ended["task"]?["reason"]?.stringValue == "endedByApp")
        #expect(try daemon.tasks().isEmpty)
    }
}
