// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// Scheduled work (`BackgroundModel+Requests`, iOS's BGTaskScheduler) with explicit instants:
/// when a request is due, its conditions, coalescing, budgets, periodic requests, limits,
/// a condition lost mid-launch, and what survives a restart. Refresh window 30 s,
/// processing 10 min, coalescing window 60 s, warning 5 s.
@Suite struct RequestModelTests {
    static func harness(_ configure: (inout Configuration) -> Void = { _ in }) -> ModelHarness {
        ModelHarness { $0.grantLatencyMax = .zero; $0.grantLatencyMin = .zero; configure(&$0) }
    }

    /// An app (pid, key "uid 1000 exe /usr/bin/appPID") suspended at instant 1.
    static func suspended(_ harness: inout ModelHarness, pid: Int32 = 100) throws -> ProcessIdentity {
        let app = try harness.app(pid: pid, subscribed: true)
        harness.model.attach(app, key: key(pid), at: harness.now)
        harness.at(1)
        try harness.background(app)
        harness.finishTransition(app)
        #expect(harness.state(app) == .suspended)
        _ = harness.take()
        return app
    }

    static func key(_ pid: Int32) -> String { "uid 1000 exe /usr/bin/app\(pid)" }

    static func submit(_ harness: inout ModelHarness, _ app: ProcessIdentity, _ identifier: String,
                       kind: TaskRequestKind = .refresh, at seconds: Double, power: Bool = false, network: Bool = false,
                       interval: Duration? = nil) throws {
        let request = TaskRequest(identifier: identifier, kind: kind, earliestBegin: .seconds(seconds),
                                  requiresExternalPower: power, requiresNetworkConnectivity: network, interval: interval)
        try harness.model.submitTaskRequest(request, from: app, key: key(app.pid), at: harness.now, effects: &harness.effects)
    }

    /// The launches in these effects: (identifier, task id).
    static func launches(_ effects: [Effect]) -> [(String, TaskID)] {
        effects.lifecycle.compactMap { if case let .launchTask(identifier, _, id, _) = $0 { (identifier, id) } else { nil } }
    }

    @Test func aDueRequestWakesTheSuspendedAppAndCompletingItSuspendsItAgain() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "refresh", at: 10)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.date])
        harness.at(9.999)
        #expect(Self.launches(harness.take()).isEmpty && harness.state(app) == .suspended)
        harness.at(10)
        let effects = harness.take()
        let launched = Self.launches(effects)
        #expect(launched.map(\.0) == ["refresh"])
        #expect(effects.actions.map(\.0) == [.woken] && effects.actions.map(\.1) == [.launch])
        #expect(harness.state(app) == .background && harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(30))
        #expect(harness.model.pendingTaskRequests(of: app).isEmpty)  // launched: no longer pending
        harness.at(10.5)
        try harness.model.setTaskCompleted("refresh", success: true, of: app, at: harness.now, effects: &harness.effects)
        #expect(harness.state(app) == .suspended)
        #expect(throws: BGTaskError.noSuchTaskRequest("refresh")) {
            try harness.model.setTaskCompleted("refresh", success: true, of: app, at: harness.now, effects: &harness.effects)
        }
    }

    /// Three due at t, t+20, t+50 go in one pass at t+50 (a 60 s window); t+70 in its own.
    @Test func requestsDueWithinTheWindowAreLaunchedTogetherNeverBeforeTheirDate() throws {
        var harness = Self.harness()
        let apps = try [100, 101, 102, 103].map { try Self.suspended(&harness, pid: $0) }
        for (app, date) in zip(apps, [100.0, 120, 150, 170]) { try Self.submit(&harness, app, "r", at: date) }
        harness.at(1)  // the pass the submissions asked for
        #expect(harness.model.requestPassAt == .seconds(150))  // one wake-up for the first three
        harness.at(149.9)
        #expect(Self.launches(harness.take()).isEmpty)
        harness.at(150)
        let first = harness.take()
        #expect(Self.launches(first).count == 3)
        #expect(Set(first.compactMap { if case let .lifecycle(app, _, .launchTask) = $0 { app } else { nil } }) == Set(apps.prefix(3)))
        #expect(harness.state(apps[3]) == .suspended)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.date])
        harness.at(170)
        #expect(Self.launches(harness.take()).count == 1)
    }

    @Test func aForegroundAppsDueRequestWaitsUntilItLeavesTheForeground() throws {
        var harness = Self.harness()
        let app = try harness.app(subscribed: true)
        harness.model.attach(app, key: Self.key(app.pid), at: harness.now)
        try Self.submit(&harness, app, "r", at: 5)
        harness.at(6)
        #expect(Self.launches(harness.take()).isEmpty)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.foreground])
        try harness.background(app)  // it leaves: the request goes, in the background period
        harness.at(6)
        #expect(Self.launches(harness.take()).map(\.0) == ["r"])
    }

    @Test func conditionsHoldBackAndReleaseAndALostOneWarnsTheLaunchAtOnce() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        harness.model.setConditions(Conditions(externalPower: false, network: false), at: harness.now, effects: &harness.effects)
        try Self.submit(&harness, app, "backup", kind: .processing, at: 2, power: true, network: true)
        harness.at(100)
        #expect(Self.launches(harness.take()).isEmpty)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.power])
        harness.model.setConditions(Conditions(externalPower: true, network: false), at: harness.now, effects: &harness.effects)
        harness.at(101)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.network])
        harness.model.setConditions(Conditions(externalPower: true, network: true), at: harness.now, effects: &harness.effects)
        harness.at(101)
        let launched = Self.launches(harness.take())
        #expect(launched.map(\.0) == ["backup"])
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(600))
        // Unplugged mid-run: warned now (the handler runs), then as at its deadline.
        harness.at(200)
        harness.model.setConditions(Conditions(externalPower: false, network: true), at: harness.now, effects: &harness.effects)
        let warned = harness.take()
        #expect(warned.lifecycle.contains(.taskExpiring([launched[0].1], backgroundTimeRemaining: .seconds(5))))
        harness.at(205)
        #expect(harness.state(app) == .terminated || harness.state(app) == nil)  // still held at its deadline
    }

    /// A condition lost while the launch's task still waits for its grant denies the task
    /// (pending tasks are, rule 6), but the app's `SetTaskCompleted` for it still finishes
    /// the wake: the app is suspended then, not at its deadline. Once only.
    @Test func completingALaunchDeniedBeforeItsGrantStillFinishesTheWake() throws {
        var harness = ModelHarness()  // grant latency 50 ms
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "backup", kind: .processing, at: 2, power: true)
        harness.at(2)
        let launched = Self.launches(harness.take())
        #expect(launched.map(\.0) == ["backup"] && harness.state(app) == .background)
        harness.at(2.01)  // within the grant latency: the task is pending
        harness.model.setConditions(Conditions(externalPower: false, network: true), at: harness.now, effects: &harness.effects)
        _ = harness.take()
        #expect(harness.model.tasks[launched[0].1] == nil, "the pending launch was denied")
        harness.at(2.5)
        try harness.model.setTaskCompleted("backup", success: false, of: app, at: harness.now, effects: &harness.effects)
        #expect(harness.state(app) == .suspended)
        #expect(throws: BGTaskError.noSuchTaskRequest("backup")) {
            try harness.model.setTaskCompleted("backup", success: false, of: app, at: harness.now, effects: &harness.effects)
        }
    }

    @Test func periodicRequestsComeBackAfterEachLaunch() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        #expect(throws: BGTaskError.invalidParameter("interval")) {
            try Self.submit(&harness, app, "p", at: 10, interval: .seconds(60))
        }
        try Self.submit(&harness, app, "p", at: 10, interval: .seconds(900))
        harness.at(10)
        #expect(Self.launches(harness.take()).map(\.0) == ["p"])
        #expect(harness.model.pendingTaskRequests(of: app).map(\.earliestBegin) == [.seconds(910)])
        try harness.model.setTaskCompleted("p", success: true, of: app, at: harness.now, effects: &harness.effects)
        harness.at(910)
        #expect(Self.launches(harness.take()).map(\.0) == ["p"])
    }

    @Test func limitsAndBadInputChangeNothing() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "r", at: 10)
        try Self.submit(&harness, app, "r", at: 20)  // the same identifier: replaced
        #expect(harness.model.pendingTaskRequests(of: app).map(\.earliestBegin) == [.seconds(20)])
        #expect(throws: BGTaskError.tooManyPendingTaskRequests("refresh")) { try Self.submit(&harness, app, "r2", at: 10) }
        for index in 0..<10 { try Self.submit(&harness, app, "p\(index)", kind: .processing, at: 10) }
        #expect(throws: BGTaskError.tooManyPendingTaskRequests("processing")) {
            try Self.submit(&harness, app, "p10", kind: .processing, at: 10)
        }
        for bad in ["", String(repeating: "x", count: 257), "a\u{7}b"] {
            #expect(throws: BGTaskError.invalidParameter("identifier")) { try Self.submit(&harness, app, bad, at: 10) }
        }
        #expect(harness.model.pendingTaskRequests(of: app).count == 11)
        #expect(harness.model.requestCount(ownedBy: 1000) == 11)
        harness.model.cancelTaskRequest("p3", from: app, at: harness.now)
        #expect(harness.model.requestCount(ownedBy: 1000) == 10)
        harness.model.cancelAllTaskRequests(from: app, at: harness.now)
        #expect(harness.model.requestCount(ownedBy: 1000) == 0)
        harness.at(10_000)
        #expect(Self.launches(harness.take()).isEmpty)
    }

    @Test func aUsersRequestsAreBounded() throws {
        var harness = Self.harness { $0.maxTaskRequestsPerUser = 2 }
        let apps = try [100, 101, 102].map { try Self.suspended(&harness, pid: $0) }
        try Self.submit(&harness, apps[0], "r", at: 10)
        try Self.submit(&harness, apps[1], "r", at: 10)
        #expect(throws: BGTaskError.limitExceeded("MaxTaskRequestsPerUser=2 reached for uid 1000")) {
            try Self.submit(&harness, apps[2], "r", at: 10)
        }
    }

    /// A user minting executables (each a key of its own) cannot grow the table: keys with
    /// nothing pending are bounded per user.
    @Test func idleKeysOfAUserAreBounded() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        for index in 0..<300 {
            // Each key launched once (its launch counted for a day), then left.
            let key = "uid 1000 exe /tmp/copy\(index)"
            let request = TaskRequest(identifier: "r", kind: .refresh, earliestBegin: harness.now)
            try harness.model.submitTaskRequest(request, from: app, key: key, at: harness.now, effects: &harness.effects)
            harness.at(Double(harness.now.nanoseconds) / 1e9 + 0.001)
            try harness.model.setTaskCompleted("r", success: true, of: app, at: harness.now, effects: &harness.effects)
            harness.model.detachRequests(of: app, at: harness.now)
            harness.model.apps[app]?.requestKey = nil
        }
        #expect(Self.launches(harness.take()).count == 300)
        #expect(harness.model.requestBook.count == BackgroundModel.maximumIdleKeysPerUser)
    }

    /// The window passes awake, or asleep (`BackgroundModel+Sleep`: it counts the sleep).
    @Test(arguments: [false, true]) func dailyLaunchesUsedUpWaitForTheWindow(asleep: Bool) throws {
        var harness = Self.harness { $0.dailyLaunches = 1; $0.quotaWindow = .seconds(3600) }
        harness.model.machineSlept(total: .zero, at: harness.now)
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "p", at: 10, interval: .seconds(900))
        harness.at(10)
        #expect(Self.launches(harness.take()).count == 1)
        try harness.model.setTaskCompleted("p", success: true, of: app, at: harness.now, effects: &harness.effects)
        harness.at(910)
        #expect(Self.launches(harness.take()).isEmpty)
        #expect(harness.model.listTaskRequests(at: harness.now).map(\.waitingFor) == [.quota])
        if asleep {
            harness.model.machineSlept(total: .seconds(3600), at: harness.now)  // an hour asleep
        }
        harness.at(asleep ? 910 : 3611)  // the first launch left the window
        #expect(Self.launches(harness.take()).count == 1)
    }

    @Test func launchNowRunsAPendingRequestWhateverItsDate() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "later", kind: .processing, at: 86_400, power: true)
        harness.model.setConditions(Conditions(externalPower: false), at: harness.now, effects: &harness.effects)
        try harness.model.launchNow("later", of: app, at: harness.now, effects: &harness.effects)
        #expect(Self.launches(harness.take()).map(\.0) == ["later"])
        #expect(throws: BGTaskError.noSuchTaskRequest("other")) {
            try harness.model.launchNow("other", of: app, at: harness.now, effects: &harness.effects)
        }
    }

    @Test func requestsSurviveARestartAndARelaunchAndAreForgottenAfterTheRetention() throws {
        var harness = Self.harness { $0.requestRetention = .seconds(1000) }
        let app = try Self.suspended(&harness)
        try Self.submit(&harness, app, "r", at: 50)
        // The daemon restarts: the app and its request come back.
        var restarted = Self.harness { $0.requestRetention = .seconds(1000) }
        restarted.now = .seconds(5)
        restarted.model.restore(harness.model.savedState(), at: restarted.now, effects: &restarted.effects)
        #expect(restarted.model.pendingTaskRequests(of: app).map(\.identifier) == ["r"])
        restarted.at(50)
        #expect(Self.launches(restarted.take()).map(\.0) == ["r"])
        // The app exits and is relaunched: the new process of the same key has the requests.
        try Self.submit(&restarted, app, "again", at: 500)
        restarted.model.processExited(app, at: restarted.now, effects: &restarted.effects)
        #expect(restarted.model.listTaskRequests(at: restarted.now).map(\.waitingFor) == [.app])
        let relaunched = try restarted.app(pid: 200)
        restarted.model.attach(relaunched, key: Self.key(100), at: restarted.now)
        #expect(restarted.model.pendingTaskRequests(of: relaunched).map(\.identifier) == ["again"])
        // Gone for good: forgotten RequestRetentionSec after its last process.
        restarted.model.processExited(relaunched, at: restarted.now, effects: &restarted.effects)
        restarted.at(1049)
        #expect(restarted.model.requestCount(ownedBy: 1000) == 1)
        restarted.at(1051)
        #expect(restarted.model.requestCount(ownedBy: 1000) == 0)
    }
}
