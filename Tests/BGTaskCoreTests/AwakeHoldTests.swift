// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// `KeepAwake=` (`AwakeHold`): logind's idle inhibitor while apps run in the background, as
/// the model counts them (`backgroundApps`).
@Suite struct AwakeHoldTests {
    static func at(_ seconds: Double) -> Instant { .seconds(seconds) }

    @Test func theInhibitorIsTakenForTheFirstAppInTheBackgroundAndReleasedOnceNoneHasBeenForTheLinger() throws {
        var harness = ModelHarness()
        var hold = AwakeHold()
        let app = try harness.app(pid: 100)
        let task = try harness.begin(app)
        harness.at(0.1)
        // In the foreground: the person using the machine keeps it awake, not bgtaskd.
        #expect(harness.model.backgroundApps == 0)
        #expect(hold.update(wanted: false, at: harness.now) == .nothing)
        try harness.background(app)
        #expect(harness.model.backgroundApps == 1)
        #expect(hold.update(wanted: true, at: harness.now) == .take)
        #expect(hold.answered(taken: true, at: harness.now) == .nothing)
        #expect(hold.holding == .held)
        // Its task ends: suspended, no app runs in the background; held for the linger.
        harness.at(3)
        try harness.end(task, in: app)
        #expect(harness.state(app) == .suspended)
        #expect(harness.model.backgroundApps == 0)
        #expect(hold.update(wanted: false, at: harness.now) == .recheck(Self.at(5)))
        #expect(hold.update(wanted: false, at: Self.at(4)) == .recheck(Self.at(5)))
        // Back in the background (a manager's wake) within the linger: still the same lock.
        harness.at(4.4)
        try harness.foreground(app)
        let second = try harness.begin(app)
        harness.at(4.5)  // granted
        try harness.background(app)
        #expect(hold.update(wanted: harness.model.backgroundApps > 0, at: harness.now) == .nothing)
        #expect(hold.update(wanted: true, at: Self.at(5)) == .nothing)
        #expect(hold.holding == .held)
        // Warned, it ends its task: suspended; the lock goes two seconds after.
        harness.at(30)  // its 30 s from 4.5 s, warned 5 s before
        #expect(harness.phase(app) == .expiring)
        try harness.end(second, in: app)
        #expect(harness.state(app) == .suspended)
        #expect(harness.model.backgroundApps == 0)
        #expect(hold.update(wanted: false, at: harness.now) == .recheck(Self.at(32)))
        #expect(hold.update(wanted: false, at: Self.at(32)) == .release)
        #expect(hold.holding == .none)
        #expect(hold.update(wanted: false, at: Self.at(33)) == .nothing)
    }

    @Test func oneRequestAtATimeAndALockThatCameTooLateLingersThenGoes() {
        var hold = AwakeHold()
        #expect(hold.update(wanted: true, at: Self.at(1)) == .take)
        #expect(hold.update(wanted: false, at: Self.at(1.1)) == .nothing)
        #expect(hold.update(wanted: true, at: Self.at(1.2)) == .nothing)
        #expect(hold.update(wanted: false, at: Self.at(1.3)) == .nothing)
        #expect(hold.holding == .asking)
        #expect(hold.answered(taken: true, at: Self.at(1.5)) == .recheck(Self.at(3.5)))
        #expect(hold.update(wanted: false, at: Self.at(3.5)) == .release)
    }

    @Test func aRefusalIsNotAskedAgainBeforeTheRetryDelay() {
        var hold = AwakeHold()
        #expect(hold.update(wanted: true, at: Self.at(1)) == .take)
        #expect(hold.answered(taken: false, at: Self.at(1)) == .recheck(Self.at(61)))
        #expect(hold.update(wanted: false, at: Self.at(2)) == .nothing)
        #expect(hold.update(wanted: true, at: Self.at(30)) == .recheck(Self.at(61)))
        #expect(hold.update(wanted: true, at: Self.at(61)) == .take)
        #expect(hold.answered(taken: true, at: Self.at(61)) == .nothing)
        #expect(hold.holding == .held)
    }
}
