// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// `Expire` (DESIGN.md §2c), with explicit instants.
@Suite struct ExpireModelTests {
    @Test func expireToWarningWarnsNowAndBringsTheDeadlineCloser() throws {
        var harness = ModelHarness()  // budget 30 s, warning 5 s
        let app = try harness.app(subscribed: true)
        let task = try harness.begin(app)
        harness.at(0.05)  // granted
        try harness.background(app)
        harness.finishTransition(app)
        harness.at(2)
        _ = harness.take()
        try harness.model.expireNow(app, to: .warning, at: harness.now, effects: &harness.effects)
        let effects = harness.take()
        #expect(effects.lifecycle == [.taskExpiring([task], backgroundTimeRemaining: .seconds(5))])
        #expect(harness.taskState(task) == .expiring && harness.phase(app) == .expiring)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(5))
        harness.at(6.9)
        #expect(harness.take().actions.isEmpty)
        harness.at(7)  // the new deadline, with the task still held
        #expect(harness.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        harness.at(8)  // the termination's bound
        #expect(harness.take() == [.kill(app, uid: 1000), .unwatch(app)])
        harness.at(30)  // the old deadline's timers are stale
        #expect(harness.take().isEmpty)
    }

    @Test func expireToDeadlineSuspendsAnIdleAppAndTerminatesOneHoldingATask() throws {
        var harness = ModelHarness()
        let idle = try harness.app(pid: 100, subscribed: true)
        try harness.background(idle)  // in its transition: not suspended yet
        try harness.model.expireNow(idle, to: .deadline, at: harness.now, effects: &harness.effects)
        #expect(harness.take().actions.map(\.1) == [.backgroundTimeExpired])
        #expect(harness.state(idle) == .suspended)

        let busy = try harness.app(pid: 200)
        _ = try harness.begin(busy)
        harness.at(1)
        try harness.background(busy)
        _ = harness.take()
        try harness.model.expireNow(busy, to: .deadline, at: harness.now, effects: &harness.effects)
        let effects = harness.take()
        #expect(effects.lifecycle.contains { if case .taskExpiring = $0 { true } else { false } })  // warned first
        #expect(effects.actions.map(\.1) == [.assertionsBeyondPermittedTime])
    }

    @Test func aForegroundAppHasNothingToExpire() throws {
        var harness = ModelHarness()
        let app = try harness.app()
        _ = harness.take()
        #expect(throws: BGTaskError.self) {
            try harness.model.expireNow(app, to: .warning, at: harness.now, effects: &harness.effects)
        }
        #expect(harness.take().isEmpty && harness.state(app) == .foreground)
    }
}
