// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// The daemon's waits (`Wait`: a freeze not yet confirmed, the next stray-SIGCONT check, an
/// app being isolated, the state file's retry, STATUS=) are the model's deadlines: one timer
/// for the daemon, and the escalation a state with an instant, tested with explicit time.
@Suite struct ModelWaitsTests {
    let app = ProcessIdentity(pid: 100, startTime: 7)

    @Test func aWaitFallsDueOnceAtItsInstantAndIsTheNextDeadline() {
        var harness = ModelHarness()
        harness.model.schedule(.freeze(app), at: Instant(nanoseconds: 200_000_000))
        #expect(harness.model.nextDeadline() == Instant(nanoseconds: 200_000_000))
        #expect(harness.model.isScheduled(.freeze(app)))
        harness.at(0.199)
        #expect(harness.take().isEmpty)
        harness.at(0.2)
        #expect(harness.take() == [.due(.freeze(app))])
        #expect(!harness.model.isScheduled(.freeze(app)))
        harness.at(10)
        #expect(harness.take().isEmpty)
    }

    @Test func aCancelledWaitNeverFallsDue() {
        var harness = ModelHarness()
        harness.model.schedule(.freeze(app), at: Instant(nanoseconds: 200_000_000))
        harness.model.cancel(.freeze(app))  // the kernel confirmed the freeze
        harness.at(1)
        #expect(harness.take().isEmpty)
    }

    @Test func reschedulingReplacesTheEarlierInstant() {
        var harness = ModelHarness()
        harness.model.schedule(.stopCheck, at: Instant(nanoseconds: 10_000_000))
        harness.model.schedule(.stopCheck, at: Instant(nanoseconds: 50_000_000))
        harness.at(0.02)
        #expect(harness.take().isEmpty)  // the stale entry fires as nothing
        harness.at(0.05)
        #expect(harness.take() == [.due(.stopCheck)])
    }

    @Test func waitsDueTogetherFireInTheirOrderWithTheRulesDeadlines() throws {
        var harness = ModelHarness()
        let other = ProcessIdentity(pid: 101, startTime: 8)
        harness.model.schedule(.isolation(other), at: Instant(nanoseconds: 30_000_000))
        harness.model.schedule(.stateRetry, at: Instant(nanoseconds: 20_000_000))
        harness.model.schedule(.status, at: Instant(nanoseconds: 40_000_000))
        harness.at(1)
        #expect(harness.take() == [.due(.stateRetry), .due(.isolation(other)), .due(.status)])
    }

    @Test func waitsAreNotSaved() {
        var harness = ModelHarness()
        harness.model.schedule(.freeze(app), at: .seconds(1))
        var restored = ModelHarness()
        var effects: [Effect] = []
        restored.model.restore(harness.model.savedState(), at: .zero, effects: &effects)
        #expect(restored.model.nextDeadline() == nil)
    }
}
