// SPDX-License-Identifier: Apache-2.0
import Testing
@testable import BGTaskCore

/// Restart without loss, in the model: what the daemon saves change by change adds up to
/// the whole state, and a model restored from it behaves as the original would have.
@Suite struct RestoreTests {
    /// Apps in every state at t = 10 s, none subscribed (a restart drops subscribers, which
    /// changes behaviour by design; that is tested on its own below).
    static func everyState(terminateSignal: TerminateSignal = .term) throws -> (ModelHarness, [String: ProcessIdentity]) {
        var h = ModelHarness {
            $0.terminateSignal = terminateSignal
            $0.grantLatencyMin = .milliseconds(10)
            $0.grantLatencyMax = .milliseconds(900)
        }
        var apps: [String: ProcessIdentity] = [:]
        apps["foreground"] = try h.app(pid: 100)
        try h.begin(apps["foreground"]!, "dormant")
        apps["suspended"] = try h.app(pid: 101)
        apps["running"] = try h.app(pid: 102)
        apps["expiring"] = try h.app(pid: 103)
        apps["terminating"] = try h.app(pid: 104)
        apps["helped"] = try h.app(pid: 105)
        h.at(1)
        try h.begin(apps["running"]!, "upload")
        try h.begin(apps["expiring"]!, "sync")
        let helper = h.process(pid: 200, ancestors: [apps["helped"]!])
        _ = try h.model.beginTask(in: apps["helped"]!, owner: helper.identity, name: "helper", expirationHandler: false,
                              connection: nil, at: h.now, effects: &h.effects)
        h.at(2)
        try h.background(apps["expiring"]!)
        h.at(7)
        for name in ["suspended", "running", "helped"] { try h.background(apps[name]!) }
        try h.begin(apps["running"]!, "late")  // still pending at 10 s unless its latency was short
        h.at(9)
        try h.model.terminate(apps["terminating"]!, at: h.now, effects: &h.effects)  // SIGKILL due at 11 s
        h.model.terminationSignalled(apps["terminating"]!, at: h.now)  // the daemon's signal, at once
        h.at(10)
        return (h, apps)
    }

    /// An app whose policy warns 2 s before its deadline (the configuration says 5 s) is
    /// warned 2 s before it after a restart too: its policy is matched before its timers
    /// are armed.
    @Test func aRestoredAppIsWarnedAsItsPolicySays() throws {
        let policy = try PolicySet(files: [(path: "p.policy", text: "[Match]\nUser=*\n[Policy]\nExpirationWarningSec=2s\n")],
                                   base: Configuration()).policies[0]
        var h = ModelHarness()
        let app = try h.app(pid: 100)
        h.model.setPolicy(policy, quotaKey: nil, of: app, at: h.now)
        try h.begin(app)
        h.at(1)
        try h.background(app)  // deadline at 31 s, warning at 29 s
        var restored = ModelHarness()
        restored.model.restore(h.model.savedState(), at: .seconds(2), policy: { _ in policy }, effects: &restored.effects)
        _ = restored.take()
        restored.at(28.9)
        #expect(restored.take().isEmpty)
        restored.at(29)
        #expect(restored.take().contains { if case let .taskChanged(task) = $0 { task.state == .expiring } else { false } })
    }

    @Test func changesAddUpToTheWholeState() throws {
        var (h, apps) = try Self.everyState()
        var saved = SavedState()
        func replay() {
            let changes = h.model.takeChanges()
            for change in changes.processes { saved.apply(change) }
            for change in changes.tasks { saved.apply(change) }
            saved.nextTaskID = h.model.nextTaskIdentifier
            #expect(saved == h.model.savedState())
        }
        replay()
        for t in stride(from: 10.0, through: 45, by: 0.5) {
            h.at(t)
            if t == 20 { try h.foreground(apps["suspended"]!) }
            if t == 21 { try h.background(apps["suspended"]!) }
            if t == 30, let id = h.model.listTasks(of: apps["expiring"]!, at: h.now).first?.id {
                try h.end(id, in: apps["expiring"]!)
            }
            replay()
        }
        #expect(saved.apps.isEmpty == false)
    }

    @Test func restoredModelActsAsTheOriginalWouldHave() throws {
        let (original, _) = try Self.everyState()
        var h = original
        var restored = ModelHarness()
        restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
        restored.now = h.now
        restored.model.restore(h.model.savedState(), at: h.now, effects: &restored.effects)

        #expect(restored.model.listApps(at: h.now) == h.model.listApps(at: h.now))
        #expect(restored.model.listTasks(at: h.now) == h.model.listTasks(at: h.now))
        #expect(restored.model.stateCounts == h.model.stateCounts)
        #expect(restored.model.nextTaskIdentifier == h.model.nextTaskIdentifier)
        let watched = Set(restored.take().compactMap { if case let .watch(p) = $0 { p } else { nil } })
        #expect(watched.count == 7)  // six apps (one terminating) and the helper

        // Every later timer fires at the same instant with the same outcome.
        _ = h.take()
        for t in stride(from: 10.0, through: 60, by: 0.25) {
            h.at(t)
            restored.at(t)
            // Timers due at one instant may fire in another order across apps (the restored
            // heap was filled app by app), never at another instant.
            let expected = h.take().filter(\.isDecision).map { "\($0)" }.sorted()
            #expect(restored.take().filter(\.isDecision).map { "\($0)" }.sorted() == expected, "at \(t)s")
        }
        #expect(restored.model.appCount == h.model.appCount)
    }

    /// Rule 7a across a restart: the daemon was down from 10 s to 50 s, past three apps'
    /// warnings (27 and 32 s) and deadlines (32 and 37 s). Their libraries may take a second
    /// to be back (`reconnection`): they are warned then, at 51 s, with their whole warning
    /// (5 s), and only what still holds a task when it ends is terminated; an app that ends
    /// its task meanwhile is suspended. (Before: all three terminated at the restart, their
    /// `taskExpiring` microseconds before.)
    @Test func anAppWhoseWarningFellDueWhileNoDaemonRanIsWarnedOnceItsLibraryCanBeBackAndGivenItsLength() throws {
        let (h, apps) = try Self.everyState(terminateSignal: .kill)
        var restored = ModelHarness()
        restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
        restored.now = .seconds(50)
        #expect(restored.model.restore(h.model.savedState(), at: restored.now, reconnection: .seconds(1),
                                       effects: &restored.effects) == 3)
        restored.at(50.999)
        #expect(!restored.take().contains { if case .act = $0 { true } else if case .lifecycle = $0 { true } else { false } })
        restored.at(51)
        let warned = restored.take().compactMap { effect -> String? in
            guard case let .lifecycle(app, _, .taskExpiring(_, left)) = effect else { return nil }
            return "\(app.pid) \(left)"
        }
        #expect(warned.sorted() == ["expiring", "running", "helped"].map { "\(apps[$0]!.pid) 5.0 seconds" }.sorted())
        let expiring = try #require(restored.model.listTasks(of: apps["expiring"]!, at: restored.now).first)
        #expect(expiring.state == .expiring)
        restored.at(53)
        try restored.end(expiring.id, in: apps["expiring"]!)
        #expect(restored.state(apps["expiring"]!) == .suspended)
        restored.at(55.999)
        #expect(!restored.take().contains { if case .act(let record, _) = $0 { record.action == .terminated } else { false } })
        restored.at(56)
        let acts = restored.take().compactMap { if case let .act(r, _) = $0 { "\(r.app.pid) \(r.action) \(r.reason)" } else { nil } }
        #expect(acts.sorted() == ["running", "helped"].map { "\(apps[$0]!.pid) terminated assertionsBeyondPermittedTime" }.sorted())
        #expect(restored.state(apps["suspended"]!) == .suspended)
        #expect(restored.state(apps["foreground"]!) == .foreground)
    }

    /// An app warned before the daemon went down, whose deadline passed while it was down, has
    /// the minimum grace once its library can be back (for the ends it kept meanwhile); one
    /// whose deadline is further off keeps it; with warnings off (`ExpirationWarningSec=0`) a
    /// deadline that passed fires at the restart, as saved.
    @Test(arguments: [true, false])
    func aWarnedAppWhoseDeadlinePassedWhileNoDaemonRanHasTheMinimumGrace(warningsOn: Bool) throws {
        var h = ModelHarness { $0.expirationWarning = warningsOn ? .seconds(5) : .zero }
        let late = try h.app(pid: 100), early = try h.app(pid: 101)
        try h.begin(late)
        try h.begin(early)
        h.at(1)
        try h.background(late)  // deadline 31 s, warned at 26 s
        h.at(20)
        try h.background(early)  // deadline 50 s
        h.at(27)
        var restored = ModelHarness()
        restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
        restored.now = .seconds(40)  // down from 27 s to 40 s
        #expect(restored.model.restore(h.model.savedState(), at: restored.now, reconnection: .seconds(1),
                                       effects: &restored.effects) == (warningsOn ? 1 : 0))
        restored.at(40)
        let terminatedAtOnce = restored.effects.actions.contains { $0 == (.terminated, .assertionsBeyondPermittedTime) }
        #expect(terminatedAtOnce == !warningsOn)
        guard warningsOn else { return }
        #expect(restored.model.snapshot(of: late, at: restored.now)?.backgroundTimeRemaining == BackgroundModel.minimumGrace + .seconds(1))
        #expect(restored.model.snapshot(of: early, at: restored.now)?.backgroundTimeRemaining == .seconds(10))
        _ = restored.take()
        restored.at(41.999)
        #expect(restored.effects.actions.isEmpty)
        restored.at(42)
        #expect(restored.effects.actions.map(\.0) == [.terminated])
    }

    /// A `SIGKILL` termination waits for the app's processes to stop (the daemon sends it
    /// once they have); a daemon restarted before it went kills what was left stopped: the
    /// restored model watches the app, and says `kill` at the bound.
    @Test func aKillUnderWayIsFinishedByARestartedDaemon() throws {
        var h = ModelHarness { $0.terminateSignal = .kill }
        let app = try h.app(pid: 100)
        h.at(1)
        try h.model.terminate(app, at: h.now, effects: &h.effects)
        var restored = ModelHarness()
        restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
        restored.now = .seconds(1.5)
        restored.model.restore(h.model.savedState(), at: restored.now, effects: &restored.effects)
        #expect(restored.take().contains(.watch(app)))
        restored.at(1 + BackgroundModel.terminationStopBound.seconds - 0.001)
        #expect(restored.take().isEmpty)
        restored.at(1 + BackgroundModel.terminationStopBound.seconds)
        #expect(restored.take() == [.kill(app, uid: 1000), .unwatch(app)])
    }

    @Test func aRestartEndsConnectionTasksAndTransitions() throws {
        var h = ModelHarness()
        let app = try h.app(pid: 100, subscribed: true)
        let streamed = try h.begin(app, "streamed", connection: ConnectionID(9))
        let held = try h.begin(app, "held")
        h.at(1)
        try h.background(app)
        #expect(h.phase(app) == .transition)
        var restored = ModelHarness()
        restored.now = h.now
        restored.model.restore(h.model.savedState(), at: h.now, effects: &restored.effects)
        let ended = restored.take().compactMap { if case let .taskChanged(t) = $0 { "\(t.id) \(t.state) \(t.reason!)" } else { nil } }
        #expect(ended == ["\(streamed) ended connectionClosed"])
        // Its subscriber went with the old daemon: the transition counts as finished, and the
        // granted task it still holds keeps it running.
        #expect(restored.phase(app) == .running)
        #expect(restored.taskState(held) == .granted)
        #expect(restored.model.snapshot(of: app, at: restored.now)?.subscribed == false)
    }
}

extension Effect {
    /// What was decided, as opposed to what is watched or logged (logs name no clock).
    var isDecision: Bool {
        switch self {
        case .lifecycle, .taskChanged, .act, .kill: true
        case .watch, .unwatch, .log, .due: false
        }
    }
}
