// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// BackgroundApplication, in a child app (`bgtask-libprobe`) against the real daemon.
@Suite(.serialized) struct ClientLibraryEndToEndTests {
    static let budget = ["BackgroundTimeSec=1s", "ExpirationWarningSec=400ms", "TransitionTimeoutSec=400ms",
                         "GrantLatencyMinSec=5ms", "GrantLatencyMaxSec=20ms"]

    func app(_ daemon: TestDaemon) throws -> Probe { try Probe(daemon: daemon, binary: "bgtask-libprobe") }

    /// The probe app, run as uid 65534 (`setpriv`) when `asNobody`.
    func app(_ daemon: TestDaemon, asNobody: Bool) throws -> Probe { try Probe.library(daemon, asNobody: asNobody) }

    func begin(_ app: Probe, _ command: String) throws -> Int64 {
        try app.send(command)
        return try #require(try app.next { $0["begin"] != nil }["begin"]?.intValue)
    }

    func granted(_ daemon: TestDaemon, _ id: Int64) throws {
        try waitUntil("task \(id) granted") {
            try daemon.tasks().contains { $0["id"]?.intValue == id && $0["state"] == "granted" }
        }
    }

    @Test func grantAndEnd() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try app(daemon)
        let id = try begin(app, "begin upload")
        #expect(id > 0)
        try granted(daemon, id)
        #expect(try daemon.tasks().first?["expirationHandler"] == true)
        try app.send("end \(id)")
        _ = try app.next { $0["end"] != nil }
        #expect(try daemon.tasks().isEmpty)
        try app.send("end \(id)")  // idempotent: only logs
        let log = try app.next { $0["log"] != nil }
        #expect(log["log"]?.stringValue?.hasPrefix("Can't end background task \(id)") == true)
    }

    @Test func handlerRunsOnceOnTheWarningAndTheAppIsSuspendedAfterItEndsTheTask() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try app(daemon)
        let id = try begin(app, "begin sync")
        try granted(daemon, id)
        try daemon.setState(app.pid, "background")
        let expired = try app.next { $0["expired"] != nil }
        #expect(expired["expired"]?.intValue == id && expired["reason"] == "expiring")
        try waitUntil("the app suspended") { processState(app.pid) == "T" }
        #expect(try daemon.history().last?["reason"] == "tasksEnded")
        try daemon.setState(app.pid, "foreground")
        try app.send("remaining")
        _ = try app.next { $0["remaining"] != nil }
        #expect(app.lines.filter { $0["expired"] != nil }.count == 1)
    }

    /// `bgtaskctl expire`, the debugger hook: the handler runs now, long before the budget is
    /// spent, and once, however often the manager asks.
    @Test func bgtaskctlExpireRunsTheHandlerOnce() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=5min", "GrantLatencyMaxSec=5ms"])
        let app = try app(daemon)
        let id = try begin(app, "begin upload keep")
        try granted(daemon, id)
        try daemon.setState(app.pid, "background")
        _ = try app.next { $0["delegate"] == "didEnterBackground" }
        var (code, output) = try daemon.ctl(["expire", "\(app.pid)"])
        #expect(code == 0, "\(output)")
        let expired = try app.next { $0["expired"] != nil }
        #expect(expired["expired"]?.intValue == id && expired["reason"] == "expiring")
        (code, output) = try daemon.ctl(["expire", "\(app.pid)"])  // again: already warned
        #expect(code == 0, "\(output)")
        #expect(try daemon.app(app.pid)?["phase"] == "expiring")
        try app.send("end \(id)")
        try waitUntil("the app suspended") { processState(app.pid) == "T" || (try? daemon.app(app.pid)?["state"]) == "suspended" }
        try daemon.setState(app.pid, "foreground")
        try app.send("remaining")
        _ = try app.next { $0["remaining"] != nil }
        #expect(app.lines.filter { $0["expired"] != nil }.count == 1)
        (code, output) = try daemon.ctl(["expire", "\(app.pid)", "--deadline"])  // in the foreground: nothing to expire
        #expect(code == 1 && output.contains("only a background app"), "\(output)")
    }

    @Test func handlerRunsWhenALateRequestIsDenied() throws {
        let daemon = try TestDaemon(["TransitionTimeoutSec=1s", "GrantLatencyMinSec=2s", "GrantLatencyMaxSec=2s"])
        let app = try app(daemon)
        try app.send("on-background late")
        _ = try app.next { $0["onBackground"] != nil }  // set before the background arrives
        try daemon.setState(app.pid, "background")
        // The delegate began "late"; the library waited for its grant until just before the
        // transition deadline, then reported the transition: denied, suspended.
        try waitUntil("the app suspended", timeout: 5) { processState(app.pid) == "T" }
        #expect(try daemon.history().last?["reason"] == "transitionFinished")
        try daemon.setState(app.pid, "foreground")
        let expired = try app.next { $0["expired"] != nil }
        #expect(expired["reason"] == "denied:suspendedBeforeGrant")
    }

    @Test func handlerThatDoesNotEndTheTaskGetsTheProcessKilled() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try app(daemon)
        let id = try begin(app, "begin stubborn keep")
        try granted(daemon, id)
        try daemon.setState(app.pid, "background")
        #expect(try app.next { $0["expired"] != nil }["reason"] == "expiring")
        #expect(Spawned.terminatingSignal(try app.process.wait(timeout: 5)) == SIGKILL)
        #expect(try daemon.history().last?["reason"] == "assertionsBeyondPermittedTime")
    }

    @Test func backgroundTimeRemainingInBothStates() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=30s", "GrantLatencyMaxSec=5ms"])
        let app = try app(daemon)
        try app.send("remaining")
        let foreground = try app.next { $0["remaining"] != nil }
        #expect(foreground["remaining"] == "max" && foreground["state"] == "active")
        let id = try begin(app, "begin hold")
        try granted(daemon, id)
        try daemon.setState(app.pid, "background")
        _ = try app.next { $0["delegate"] == "didEnterBackground" }
        try app.send("remaining")
        let background = try app.next { $0["remaining"] != nil }
        let left = try #require(background["remaining"]?.doubleValue)
        #expect(left > 25 && left <= 30, "remaining \(left)")
        #expect(background["state"] == "background")
    }

    @Test func delegateAndNotificationsFollowTheLifecycle() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try app(daemon)
        try daemon.setState(app.pid, "background")
        try waitUntil("the app suspended after its delegate returned") { processState(app.pid) == "T" }
        try daemon.setState(app.pid, "foreground")
        _ = try app.next { $0["notification"] == "BackgroundApplicationWillEnterForeground" }
        let lifecycle = app.lines.compactMap { $0["delegate"]?.stringValue ?? $0["notification"]?.stringValue }
        #expect(lifecycle == ["didEnterBackground", "BackgroundApplicationDidEnterBackground",
                              "willEnterForeground", "BackgroundApplicationWillEnterForeground"])
    }

    @Test func withBackgroundTaskIsCancelledWhenTimeExpiresAndAlwaysEnds() throws {
        let daemon = try TestDaemon(Self.budget)
        let app = try app(daemon)
        try app.send("with-task scoped")
        _ = try app.next { $0["withTask"] == "running" }
        try waitUntil("the scoped task granted") { try daemon.tasks().first?["state"] == "granted" }
        #expect(try daemon.tasks().first?["name"] == "scoped")
        try daemon.setState(app.pid, "background")
        try waitUntil("the app suspended once the task ended") { processState(app.pid) == "T" }
        #expect(try daemon.tasks().isEmpty)
        #expect(try daemon.history().last?["reason"] == "tasksEnded")
        try daemon.setState(app.pid, "foreground")
        _ = try app.next { $0["withTask"] == "cancelled" }
    }

    @Test func tasksSurviveADaemonRestartAndEndsWhileItWasAwayAreSent() throws {
        let first = try TestDaemon(Self.budget)
        let app = try app(first)
        let kept = try begin(app, "begin kept keep")
        let endedMeanwhile = try begin(app, "begin ended-meanwhile keep")
        try granted(first, kept)
        try granted(first, endedMeanwhile)
        try first.crash()
        // While the daemon is away calls fail at once, and an end is remembered.
        #expect(try begin(app, "begin nowhere") == 0)
        try app.send("end \(endedMeanwhile)")
        _ = try app.next { $0["end"] != nil }
        let daemon = try first.restart(Self.budget)  // same socket and state, well within the grace
        try waitUntil("the library reconnected") {
            try app.send("connected")
            return try app.next { $0["connected"] != nil }["connected"] == true
        }
        try waitUntil("the end sent once back") { try daemon.tasks().map { $0["id"]!.intValue! } == [kept] }
        #expect(!app.lines.contains { $0["expired"] != nil }, "no handler ran: the daemon kept the task")
        let again = try begin(app, "begin again")
        #expect(again > endedMeanwhile)
        try granted(daemon, again)
        try daemon.setState(app.pid, "background")
        _ = try app.next { $0["delegate"] == "didEnterBackground" }  // resubscribed
        // The task held across the restart expires like any other.
        let warned = try app.next(timeout: 5) { $0["expired"]?.intValue == kept }
        #expect(warned["reason"] == "expiring")
    }

    @Test func handlersRunWhenTheDaemonStaysAway() throws {
        let first = try TestDaemon(Self.budget)
        let app = try app(first)
        let id = try begin(app, "begin held")
        try granted(first, id)
        let lost = Clock.monotonicNanoseconds()
        try first.crash()
        let gone = try app.next(timeout: 10) { $0["expired"] != nil }
        let waited = Double(Clock.monotonicNanoseconds() - lost) / 1e9
        #expect(gone["expired"]?.intValue == id && gone["reason"] == "daemonUnavailable")
        #expect(waited >= 2.9, "the handler ran \(waited)s after the daemon went away; the grace is 3s")
        // The handler ended the task while the daemon was away: once back, the end is sent.
        let daemon = try first.restart(Self.budget)
        try waitUntil("the task ended once the daemon is back") { try daemon.tasks().isEmpty }
    }

    /// Rule 7a across a restart: the daemon is killed before a background app's warning and
    /// started again after its deadline (2.3 s later, within the library's 3 s wait). The app is
    /// warned a second after the restart (when its library is back at the latest) with its
    /// whole warning (1.5 s) from then; the library runs the handler, which ends the task, and
    /// the app is suspended, not terminated. (Before:
    /// the restarted daemon terminated it at once, unwarned.) Also for uid 65534's app.
    @Test(arguments: getuid() == 0 ? [false, true] : [false])
    func anAppWhoseWarningFellDueWhileNoDaemonRanIsWarnedOnceItIsBack(asNobody: Bool) throws {
        let budget = ["BackgroundTimeSec=2s", "ExpirationWarningSec=1500ms", "GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"]
        let first = try TestDaemon(budget)
        let app = try self.app(first, asNobody: asNobody)
        let id = try begin(app, "begin held")
        try granted(first, id)
        try first.setState(app.pid, "background")
        let backgrounded = Clock.monotonicNanoseconds()
        try first.crash()  // well before the warning, 0.5 s after the background
        #expect(Clock.monotonicNanoseconds() - backgrounded < 400_000_000, "the daemon outlived the app's warning")
        // Past the deadline, then back.
        waitForInstant(backgrounded + 2_300_000_000)
        let daemon = try first.restart(budget)
        let warned = try app.next(timeout: 5) { $0["expired"] != nil }
        #expect(warned["expired"]?.intValue == id && warned["reason"] == "expiring")
        try waitUntil("the app suspended once its handler ended the task") { processState(app.pid) == "T" }
        let last = try #require(try daemon.history().last)
        #expect(last["pid"]?.intValue == Int64(app.pid) && last["action"] == "suspended" && last["reason"] == "tasksEnded")
        #expect(!app.process.hasExited)
        try daemon.setState(app.pid, "foreground")
    }

    /// Rule 7a when the daemon is held up: stopped (`SIGSTOP`) before an app's warning and
    /// continued after its deadline, the daemon's first pass would have sent the warning and
    /// the kill together. Now the warning goes out with a second left, the library runs the
    /// handler, which ends the task, and the app is suspended, not terminated. (Before: the
    /// app was killed with its warning.) Also for uid 65534's app.
    @Test(arguments: getuid() == 0 ? [false, true] : [false])
    func anAppWhoseWarningAndDeadlinePassedWhileTheDaemonWasStoppedIsWarnedFirst(asNobody: Bool) throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=2s", "ExpirationWarningSec=1500ms", "GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let app = try self.app(daemon, asNobody: asNobody)
        let id = try begin(app, "begin held")
        try granted(daemon, id)
        try daemon.setState(app.pid, "background")
        let backgrounded = Clock.monotonicNanoseconds()
        // Its delegate returned (the transition finished): the task's end is what suspends it.
        try waitUntil("the transition finished") { try daemon.app(app.pid)?["phase"] == "running" }
        try daemon.process.signal(SIGSTOP)
        #expect(Clock.monotonicNanoseconds() - backgrounded < 400_000_000, "the daemon ran to the app's warning")
        waitForInstant(backgrounded + 2_300_000_000)  // past the deadline
        try daemon.process.signal(SIGCONT)
        let warned = try app.next(timeout: 5) { $0["expired"] != nil }
        #expect(warned["expired"]?.intValue == id && warned["reason"] == "expiring", "\(warned)")
        try waitUntil("the app suspended once its handler ended the task") { processState(app.pid) == "T" }
        let last = try #require(try daemon.history().last)
        #expect(last["pid"]?.intValue == Int64(app.pid) && last["action"] == "suspended" && last["reason"] == "tasksEnded")
        #expect(!app.process.hasExited)
        let log = String(decoding: try readFile(daemon.logPath), as: UTF8.self)
        #expect(log.contains(" late (the daemon was held up): its deadline moved to 1s after the warning"))
        try daemon.setState(app.pid, "foreground")
    }

    /// Rule 3 when the daemon is held up: the delegate begins a task in
    /// `applicationDidEnterBackground` (iOS's way) and waits for the answer; the daemon,
    /// stopped just after the background began, is continued a second past the transition's
    /// end. It answers, and the transition has a second more: the delegate returns, the
    /// library reports the transition, the app runs on with its task. (Before: terminated,
    /// `transitionTimeout`, its task never begun.)
    @Test func aDelegateWaitingOnAStoppedDaemonFinishesItsTransitionOnceItIsContinued() throws {
        let daemon = try TestDaemon(["TransitionTimeoutSec=2s", "GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let app = try self.app(daemon)
        try app.send("on-background save")
        _ = try app.next { $0["onBackground"] != nil }
        try daemon.setState(app.pid, "background")
        let backgrounded = Clock.monotonicNanoseconds()
        try daemon.process.signal(SIGSTOP)
        #expect(Clock.monotonicNanoseconds() - backgrounded < 1_000_000_000, "the daemon ran to the transition's end")
        waitForInstant(backgrounded + 3_000_000_000)
        try daemon.process.signal(SIGCONT)
        try waitUntil("the transition finished") { try daemon.app(app.pid)?["phase"] == "running" }
        #expect(try daemon.tasks(app.pid).map { $0["name"] } == ["save"])
        #expect(try daemon.history().isEmpty && !app.process.hasExited)
        #expect(daemon.logged { $0.contains("is given 1s more to finish its background transition") })
        try daemon.setState(app.pid, "foreground")
    }

    /// An ended task wakes the library's event thread only if the transition (or a wake)
    /// waits for it (`ClientState.endingSettles`). What the kernel counts for that thread over
    /// 300 Begin+End pairs in the foreground: its `read(2)`s (`syscr` in its `io`; the
    /// daemon's events come by `recv`, which it does not count), that is the reads of its
    /// wake-up pipe: 0 now, 300 when every end wrote it (checked); and its sleeps, about one
    /// a pair for each grant's event (305–308, debug build; 404 once under ASan, its lock
    /// contended longer), against 596–604 with the pipe.
    @Test func endingATaskInTheForegroundLeavesTheEventThreadAsleep() throws {
        let daemon = try TestDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let app = try app(daemon)
        let tasks = "/proc/\(app.pid)/task"
        func eventThread() throws -> String? {
            try ProcessTree.directoryNames(tasks).first {
                String(decoding: try readFile("\(tasks)/\($0)/comm"), as: UTF8.self) == "bgtask-events\n"
            }
        }
        // The thread names itself once it runs, which may be after the app said it is ready.
        try waitUntil("the library's thread named bgtask-events") { try eventThread() != nil }
        let thread = try #require(try eventThread())
        func reads() throws -> Int { try readCalls("\(tasks)/\(thread)/io") }
        let (readsBefore, sleepsBefore) = (try reads(), try voluntarySwitches("\(tasks)/\(thread)/status"))
        try app.send("stress 1 300")
        let stress = try app.next(timeout: 60) { $0["stress"] != nil }["stress"]
        #expect(stress?["begun"] == 300 && stress?["invalid"] == 0)
        let piped = try reads() - readsBefore
        let slept = try voluntarySwitches("\(tasks)/\(thread)/status") - sleepsBefore
        #expect(piped <= 5, "the event thread read its wake-up pipe \(piped) times in 300 pairs")
        #expect(slept <= 480, "the event thread slept \(slept) times in 300 pairs")
    }

    @Test func concurrentBeginAndEndFromManyThreads() throws {
        let daemon = try TestDaemon(["GrantLatencyMaxSec=1ms"])
        let app = try app(daemon)
        try app.send("stress 16 50")
        let stress = try app.next(timeout: 60) { $0["stress"] != nil }["stress"]
        #expect(stress?["begun"] == 800 && stress?["invalid"] == 0)
        #expect(try daemon.tasks().isEmpty)
        #expect(!app.lines.contains { $0["log"] != nil }, "\(app.lines.filter { $0["log"] != nil })")
    }
}
