// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// `Wake` and `FinishWake` (DESIGN.md §2c), with explicit instants. The window is 10 s, the
/// warning 1 s before its end.
@Suite struct WakeModelTests {
    static func harness() -> ModelHarness {
        ModelHarness { $0.wakeTime = .seconds(10); $0.expirationWarning = .seconds(1) }
    }

    /// A subscribed app, suspended at instant 1.
    static func suspended(_ harness: inout ModelHarness) throws -> ProcessIdentity {
        let app = try harness.app(subscribed: true)
        harness.at(1)
        try harness.background(app)
        harness.finishTransition(app)
        #expect(harness.state(app) == .suspended)
        _ = harness.take()
        return app
    }

    @Test func aSuspendedAppIsWokenForItsWindowAndToldWhy() throws {
        var harness = Self.harness()
        let app = try Self.suspended(&harness)
        harness.at(5)
        let outcome = try harness.model.wake(app, reason: "push", payload: "{\"message\":42}", at: harness.now, effects: &harness.effects)
        #expect(outcome == .woken && harness.state(app) == .background && harness.phase(app) == .woken)
        let effects = harness.take()
        #expect(effects.actions.map(\.0) == [.woken])
        #expect(effects.lifecycle == [.didWake(reason: "push", payload: "{\"message\":42}", backgroundTimeRemaining: .seconds(10))])
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(10))
    }

    @Test func finishWakeWithoutATaskSuspendsAtOnceAndWithOneRunsToTheWindowsEnd() throws {
        var harness = Self.harness()
        let idle = try Self.suspended(&harness)
        _ = try harness.model.wake(idle, reason: "fetch", payload: nil, at: harness.now, effects: &harness.effects)
        harness.model.finishWake(of: idle, at: harness.now, effects: &harness.effects)
        #expect(harness.state(idle) == .suspended)
        #expect(harness.take().actions.map(\.1).last == .wakeFinished)

        let busy = try Self.suspended(&harness)
        _ = try harness.model.wake(busy, reason: "fetch", payload: nil, at: harness.now, effects: &harness.effects)
        let task = try harness.begin(busy)
        harness.at(1.05)  // granted
        harness.model.finishWake(of: busy, at: harness.now, effects: &harness.effects)
        #expect(harness.state(busy) == .background && harness.phase(busy) == .running)
        try harness.end(task, in: busy)  // its last task: suspended (rule 5)
        #expect(harness.state(busy) == .suspended)
    }

    @Test func theWindowsEndSuspendsAnIdleAppAndTerminatesOneHoldingATask() throws {
        var harness = Self.harness()
        let idle = try Self.suspended(&harness)
        _ = try harness.model.wake(idle, reason: "fetch", payload: nil, at: harness.now, effects: &harness.effects)
        let busy = try Self.suspended(&harness)
        _ = try harness.model.wake(busy, reason: "fetch", payload: nil, at: harness.now, effects: &harness.effects)
        _ = try harness.begin(busy)
        harness.at(10)  // warned
        harness.at(10.9)
        _ = harness.take()
        harness.at(11)  // neither called FinishWake
        let actions = harness.take().actions.map(\.1)
        #expect(actions.contains(.backgroundTimeExpired) && actions.contains(.assertionsBeyondPermittedTime))
        #expect(harness.state(idle) == .suspended && harness.state(busy) == nil)
    }

    @Test func aForegroundAppIsNotWokenAndABackgroundOneKeepsItsDeadline() throws {
        var harness = Self.harness()
        let foreground = try harness.app(pid: 100)
        _ = harness.take()
        #expect(try harness.model.wake(foreground, reason: "x", payload: nil, at: harness.now, effects: &harness.effects) == .foreground)
        #expect(harness.take().isEmpty)

        let background = try harness.app(pid: 200, subscribed: true)
        try harness.background(background)  // deadline at 30 s
        harness.at(2)
        _ = harness.take()
        #expect(try harness.model.wake(background, reason: "x", payload: nil, at: harness.now, effects: &harness.effects) == .told)
        #expect(harness.model.backgroundTimeRemaining(of: background, at: harness.now) == .seconds(28))  // not extended
        #expect(harness.take().lifecycle.count == 1)
    }

    @Test func wakeTimeCountsAgainstAQuota() throws {
        var harness = Self.harness()
        let policy = try AppPolicy(file: "q.policy", text: "[Policy]\nDailyBackgroundSec=4s\n", base: harness.model.configuration)
        let app = try harness.model.register(harness.process(pid: 100), policy: policy, quotaKey: "k", at: harness.now,
                                             effects: &harness.effects)
        try harness.background(app)  // not subscribed, no task: suspended at once
        #expect(harness.state(app) == .suspended)
        _ = try harness.model.wake(app, reason: "fetch", payload: nil, at: harness.now, effects: &harness.effects)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(4))  // the quota, not 10 s
        harness.at(3)
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(1))  // the window counts, task or not
    }
}
