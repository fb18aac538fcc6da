// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// The model's timers: never late, and none left behind by churn.
@Suite struct ModelDeadlineTests {
    @Test func nextDeadlineIsNeverLate() throws {
        var h = ModelHarness { $0.grantLatencyMin = .milliseconds(1); $0.grantLatencyMax = .milliseconds(80) }
        let apps = try (0..<5).map { try h.app(pid: 100 + Int32($0), subscribed: $0 % 2 == 0) }
        var t = 0.0
        for step in 0..<400 {
            let app = apps[step % apps.count]
            switch step % 7 {
            case 0: try? h.background(app)
            case 1: _ = try? h.begin(app)
            case 2: h.finishTransition(app)
            case 3: if step % 3 == 0 { try? h.foreground(app) }
            default: break
            }
            t += 0.7
            h.at(t)
            // Everything due by now has fired: what is left is strictly in the future.
            if let next = h.model.nextDeadline() { #expect(next > h.now) }
            // The O(1) state counts agree with the apps themselves.
            let listed = h.model.listApps(at: h.now)
            for state in AppState.allCases {
                #expect(h.model.stateCounts[state, default: 0] == listed.filter { $0.state == state }.count)
            }
            // No background app outlives its deadline unnoticed.
            for snapshot in h.model.listApps(at: h.now) where snapshot.state == .background {
                #expect(snapshot.backgroundTimeRemaining! > .zero)
            }
        }
    }

    /// Rule 7a's question, asked on every pass: which apps would firing what is due at an
    /// instant terminate? None before the deadline (nothing due: the queue is not walked),
    /// the app holding a task at it, none once its task has ended.
    @Test func appsFacingTerminationAreThoseADueDeadlineWouldKill() throws {
        var h = ModelHarness()
        #expect(h.model.appsFacingTermination(at: .seconds(1000)).isEmpty)  // no timers at all
        let holder = try h.app(pid: 100)
        let task = try h.begin(holder)
        h.at(1)  // granted
        try h.background(holder)  // budget 30 s: the deadline at 31 s, the warning at 26 s
        h.at(26.5)
        #expect(h.model.appsFacingTermination(at: .seconds(30.9)).isEmpty)
        #expect(h.model.appsFacingTermination(at: .seconds(31)) == [holder])
        #expect(h.model.appsFacingTermination(at: .seconds(40)) == [holder])
        try h.end(task, in: holder)
        #expect(h.model.appsFacingTermination(at: .seconds(31)).isEmpty)
    }

    /// The next deadline is a timer that acts: an app back in the foreground, or suspended,
    /// leaves none (its warning and deadline woke the daemon 25 and 30 s later, for
    /// nothing), nor does a task ended before its age warning; a task held in the
    /// background has its app's warning next, then its age warning.
    @Test func nextDeadlineIsATimerThatActs() throws {
        var h = ModelHarness()
        let shown = try h.app(pid: 100), hidden = try h.app(pid: 101), holder = try h.app(pid: 102)
        try h.background(shown)
        try h.foreground(shown)
        try h.background(hidden)
        #expect(h.state(hidden) == .suspended)  // nothing held: at once
        let short = try h.begin(holder, "short")
        h.at(1)  // granted
        try h.end(short, in: holder)
        #expect(h.model.nextDeadline() == nil)
        let task = try h.begin(holder)  // its age warning at 31 s
        h.at(2)
        try h.background(holder)
        #expect(h.model.nextDeadline() == .seconds(27))  // its warning
        try h.foreground(holder)
        #expect(h.model.nextDeadline() == .seconds(31))  // the task's age warning
        try h.end(task, in: holder)
        #expect(h.model.nextDeadline() == nil)
    }

    /// With the caller's timer armed already (the daemon's moves only earlier), a first timer
    /// at or after it is returned as it is: the answer would move nothing, and it is looked
    /// at once that timer has fired. One before it is looked at as ever.
    @Test func aFirstTimerPastTheArmedOneIsLookedAtWhenThatFires() throws {
        var h = ModelHarness()
        let holder = try h.app(pid: 102)
        let task = try h.begin(holder)  // its age warning at 30 s
        h.at(1)  // granted
        try h.background(holder)  // its warning at 26 s
        try h.foreground(holder)  // that warning stale
        #expect(h.model.nextDeadline(armedAt: .seconds(26)) == .seconds(26))  // armed there: unmoved
        #expect(h.model.nextDeadline(armedAt: .seconds(27)) == .seconds(30))  // before it: looked at
        try h.end(task, in: holder)
        #expect(h.model.nextDeadline(armedAt: nil) == nil)
    }

    /// An owner flipping its app between foreground and background leaves the warning and
    /// the deadline of each flip behind (up to the budget ahead): dropped between calls once
    /// they pile up, so the timers are bounded by what is live, not by how fast an owner
    /// flips (uid 65534 grew the daemon by 180 MB in 20 s). What is live among them still
    /// fires, each at its instant: 3,000 apps holding a task in the background are warned at
    /// 26 s and terminated at 31 s.
    @Test func staleTimersAreDroppedAndLiveOnesStillFire() throws {
        var h = ModelHarness { $0.maxAppsPerUser = 4_000 }
        let holders = try (0..<3_000).map { try h.app(pid: 1_000 + Int32($0)) }
        for holder in holders { try h.begin(holder) }
        h.at(1)  // granted
        for holder in holders { try h.background(holder) }  // warnings at 26 s, deadlines at 31 s
        let flipper = try h.app(pid: 100)
        var most = 0
        for _ in 0..<100_000 {
            try h.background(flipper)
            try h.foreground(flipper)
            _ = h.model.nextDeadline()  // the daemon asks after every pass
            most = max(most, h.model.timers.count)
        }
        // 6,000 live; twice that once dropped, not the 206,000 armed.
        #expect(most <= 2 * 6_000 + 2, "\(most) timers held at most")
        #expect(h.model.timers.capacity <= 32_768, "storage for \(h.model.timers.capacity)")
        _ = h.take()
        h.at(26)
        let expiring = Set(h.model.listTasks(at: h.now).filter { $0.state == .expiring }.map(\.app))
        #expect(expiring == Set(holders))
        h.at(31)
        let terminated = h.take().compactMap { if case let .act(record, _) = $0, record.action == .terminated { record.app } else { nil } }
        #expect(Set(terminated) == Set(holders) && terminated.count == holders.count)
    }

    @Test func ageWarningsFireForLiveTasksOnlyAndChurnLeavesNoTimers() throws {
        var h = ModelHarness { $0.taskAgeWarning = .seconds(30) }
        let app = try h.app()
        let kept = try h.begin(app, "kept")
        h.at(1)
        for _ in 0..<10_000 {  // begin/end churn: nothing may pile up for 30 s
            let id = try h.begin(app, "churn")
            try h.end(id, in: app)
        }
        #expect(h.model.ageQueue.count - h.model.ageQueueHead <= 130)  // bounded, not 10,001
        h.at(2)  // the churn's grant timers are stale now and drain
        #expect(h.model.timers.count == 0)
        _ = h.take()
        h.at(29.999)
        #expect(h.take().isEmpty)
        h.at(40)
        let warnings = h.take().compactMap { if case let .log(entry) = $0, entry.kind == .taskAgeWarning { entry.taskID } else { nil } }
        #expect(warnings == [kept])
        #expect(h.model.nextDeadline() == nil)
    }
}
