// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// The machine's sleep (`BackgroundModel+Sleep`): the model's clock is `CLOCK_MONOTONIC`,
/// which stops while the machine sleeps. Told what was slept, scheduled requests' dates, the
/// quota window and `DailyLaunches` count it (`RequestModelTests.dailyLaunchesUsedUpWaitForTheWindow`);
/// background time and deadlines do not.
@Suite struct SleepModelTests {
    static let hour = Duration.seconds(3600)

    @Test func aRequestsDateCountsTheSleepAndARunningAppsDeadlineDoesNot() throws {
        var harness = RequestModelTests.harness()
        #expect(harness.model.machineSlept(total: .seconds(7), at: harness.now) == nil)  // counting starts
        let app = try RequestModelTests.suspended(&harness)
        try RequestModelTests.submit(&harness, app, "refresh", at: 900)
        let running = try harness.app(pid: 200)
        _ = try harness.begin(running)
        harness.at(50)
        try harness.background(running)
        let remaining = harness.model.backgroundTimeRemaining(of: running, at: harness.now)
        harness.at(60)
        _ = harness.take()
        // Less than the resolution, or a reading below the last: nothing was slept.
        #expect(harness.model.machineSlept(total: .seconds(7) + .microseconds(999), at: harness.now) == nil)
        #expect(harness.model.machineSlept(total: .seconds(7) - .microseconds(999), at: harness.now) == nil)
        #expect(harness.model.machineSleepCounted == .seconds(7))
        #expect(!harness.model.listTaskRequests(at: harness.now).isEmpty)
        // An hour asleep: the refresh due at 900 s (15 minutes after its submission) is due.
        #expect(harness.model.machineSlept(total: .seconds(7) + Self.hour, at: harness.now) == Self.hour)
        #expect(harness.model.machineSleepCounted == .seconds(7) + Self.hour)
        harness.at(60)
        #expect(RequestModelTests.launches(harness.take()).map(\.0) == ["refresh"])
        #expect(harness.state(app) == .background)
        // The app that held a task did not run while the machine slept: its time is as it was.
        #expect(harness.model.backgroundTimeRemaining(of: running, at: harness.now) == remaining.map { $0 - .seconds(10) })
        #expect(harness.state(running) == .background)
    }

    /// The rolling window of `DailyBackgroundSec` (100 s here) moves on in sleep: time held
    /// before the sleep is recorded before it, and counting goes on from the wake.
    @Test mutating func theQuotaWindowCountsTheSleepAndTimeHeldBeforeItIsRecordedBeforeIt() throws {
        var quota = QuotaModelTests()
        var harness = QuotaModelTests.harness()
        harness.model.machineSlept(total: .zero, at: harness.now)
        let app = try quota.heldInTheBackground(&harness)
        harness.at(6)  // 5 s held
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(5))
        #expect(harness.model.machineSlept(total: .seconds(90), at: harness.now) == .seconds(90))
        // 90 s asleep: the 5 s held are 90–95 s ago, still in the window.
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(5))
        harness.at(7)  // held 1 s more since the wake
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(4))
        // 8 s more asleep: all but 1 s of the 5 (held 99–104 s ago, from the wake at 7 s) left
        // the window; the second since the first wake is 8–9 s ago.
        #expect(harness.model.machineSlept(total: .seconds(98), at: harness.now) == .seconds(8))
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(8))
        #expect(harness.model.savedState().apps[app]?.holdingSince == .seconds(7))
        #expect(harness.model.savedState().quota.values.flatMap { $0 } == [
            QuotaInterval(start: .seconds(1 - 98), end: .seconds(6 - 98)),
            QuotaInterval(start: .seconds(6 - 8), end: .seconds(7 - 8)),
        ])
    }

    /// What the machine slept while no daemon ran counts once the restarted daemon says how
    /// long it has slept; a state saved by a daemon that counted no sleep starts counting.
    @Test(arguments: [true, false]) func sleepWhileNoDaemonRanCountsOnceTheRestartedDaemonTells(counted: Bool) throws {
        var harness = RequestModelTests.harness()
        if counted { harness.model.machineSlept(total: .seconds(5), at: harness.now) }
        let app = try RequestModelTests.suspended(&harness)
        try RequestModelTests.submit(&harness, app, "r", at: 900)
        let saved = harness.model.savedState()
        #expect(saved.sleep == (counted ? .seconds(5) : nil))
        var restarted = RequestModelTests.harness()
        restarted.now = .seconds(20)
        restarted.model.restore(saved, at: restarted.now, effects: &restarted.effects)
        #expect(restarted.model.takeSleepChange() == nil)  // as saved: nothing to write
        let slept = restarted.model.machineSlept(total: .seconds(5) + Self.hour, at: restarted.now)
        #expect(slept == (counted ? Self.hour : nil))
        #expect(restarted.model.takeSleepChange() == .seconds(5) + Self.hour)
        restarted.at(20)
        #expect(RequestModelTests.launches(restarted.take()).map(\.0) == (counted ? ["r"] : []))
        #expect(restarted.model.takeRequestChanges().map(\.key) == (counted ? [RequestModelTests.key(app.pid)] : []))
    }

    /// The same boot's sleep only grows: a reading well below the last (a state file of a
    /// daemon in another time namespace) moves nothing and starts counting again from it.
    @Test func aReadingWellBelowTheLastStartsCountingAgain() throws {
        var harness = RequestModelTests.harness()
        harness.model.machineSlept(total: .seconds(7200), at: harness.now)
        let app = try RequestModelTests.suspended(&harness)
        try RequestModelTests.submit(&harness, app, "r", at: 900)
        #expect(harness.model.machineSlept(total: .seconds(10), at: harness.now) == nil)
        #expect(harness.model.machineSleepCounted == .seconds(10))
        harness.at(2)
        #expect(RequestModelTests.launches(harness.take()).isEmpty)
        #expect(harness.model.machineSlept(total: .seconds(910), at: harness.now) == .seconds(900))
        harness.at(2)
        #expect(RequestModelTests.launches(harness.take()).map(\.0) == ["r"])
    }
}
