// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskClient
import Testing
import Varlink

/// The client library's state with explicit instants, as the daemon's model is tested:
/// handlers are labels, time is nanoseconds passed in.
@Suite struct ClientStateTests {
    typealias State = ClientState<String>
    static let second: Int64 = 1_000_000_000
    static let millisecond: Int64 = 1_000_000

    /// A state subscribed in the foreground at instant 0.
    func subscribed(holding held: Set<Int> = []) -> State {
        var state = State()
        _ = state.receive(.subscribed(state: "foreground", remaining: nil, held: held), at: 0)
        return state
    }

    @Test func theForegroundHasUnlimitedTimeAndTheBackgroundCountsDown() {
        var state = subscribed()
        #expect(state.state == .active)
        #expect(state.backgroundTimeRemaining(at: 5 * Self.second) == .greatestFiniteMagnitude)
        let effects = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 10 * Self.second)
        #expect(effects == [.enterBackground])
        #expect(state.state == .background)
        #expect(state.backgroundTimeRemaining(at: 10 * Self.second) == 30)
        #expect(state.backgroundTimeRemaining(at: 22 * Self.second) == 18)
        #expect(state.backgroundTimeRemaining(at: 100 * Self.second) == 0)
    }

    /// A daemon (or a peer posing as one) may send any number: a huge, infinite or NaN window
    /// trapped in `Int64(x * 1e9)` and crashed the app; libbgtask reads them within a day.
    @Test func aHugeOrNonFiniteWindowDoesNotCrashTheApp() {
        for value in [Double.infinity, -Double.infinity, .nan, 1e300, -5, 9.3e18] {
            var state = subscribed()
            _ = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: value), at: 0)
            state.backgroundDelegateReturned()
            // A window of at most a day: the transition is over by then, not never.
            let finished = state.tick(at: 86_400 * Self.second).contains(.send(.finishBackgroundTransition))
            #expect(finished || !(value > 0), "transitionTimeout \(value)")
            var woken = subscribed()
            _ = woken.receive(.didWake(reason: "push", payload: nil, remaining: value), at: 0)
            _ = woken.tick(at: 86_400 * Self.second)
        }
    }

    @Test func theStateIsInactiveWhileTheForegroundDelegateRuns() {
        var state = subscribed()
        _ = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 0)
        let effects = state.receive(.willEnterForeground, at: Self.second)
        #expect(effects == [.enterForeground])
        #expect(state.state == .inactive)
        #expect(state.backgroundTimeRemaining(at: Self.second) == .greatestFiniteMagnitude)
        state.foregroundDelegateReturned()
        #expect(state.state == .active)
    }

    @Test func theTransitionFinishesWhenTheDelegateReturnsWithNoGrantOutstanding() {
        var state = subscribed()
        _ = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 0)
        var effects = state.tick(at: Self.millisecond)
        #expect(effects.isEmpty)  // the delegate is still running
        #expect(state.nextDeadline == nil)
        state.backgroundDelegateReturned()
        effects = state.tick(at: 2 * Self.millisecond)
        #expect(effects == [.send(.finishBackgroundTransition)])
        effects = state.tick(at: 3 * Self.millisecond)
        #expect(effects.isEmpty)  // once
    }

    @Test func theTransitionWaitsForAGrantUntilJustBeforeItsDeadline() {
        var state = subscribed()
        _ = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 0)
        var effects = state.begun(7, name: "upload", handler: "h7")
        #expect(effects.isEmpty)
        state.backgroundDelegateReturned()
        let finishBy = 5 * Self.second - State.finishMargin
        #expect(state.nextDeadline == finishBy)
        effects = state.tick(at: finishBy - 1)
        #expect(effects.isEmpty)
        effects = state.tick(at: finishBy)
        #expect(effects == [.send(.finishBackgroundTransition)])

        var granted = subscribed()
        _ = granted.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 0)
        _ = granted.begun(7, name: "upload", handler: "h7")
        granted.backgroundDelegateReturned()
        effects = granted.receive(.taskGranted(7), at: Self.millisecond)
        #expect(effects.isEmpty)
        effects = granted.tick(at: Self.millisecond)
        #expect(effects == [.send(.finishBackgroundTransition)])
    }

    /// An end matters to `tick` only when a returned transition (or a completed wake) waits
    /// for a task not yet granted: the library wakes its event thread only then.
    @Test func anEndSettlesSomethingOnlyWhenTheTransitionWaitsForThatTask() {
        var state = subscribed()
        _ = state.begun(1, name: "a", handler: "h1")
        #expect(!state.endingSettles(1))  // the foreground: nothing waits
        _ = state.receive(.didEnterBackground(remaining: 30, transitionTimeout: 5), at: 0)
        _ = state.begun(2, name: "b", handler: "h2")
        _ = state.begun(3, name: "c", handler: "h3")
        _ = state.receive(.taskGranted(3), at: 0)
        #expect(!state.endingSettles(2))  // the delegate is still running
        state.backgroundDelegateReturned()
        #expect(state.endingSettles(1) && state.endingSettles(2))
        #expect(!state.endingSettles(3))  // granted: the transition was not waiting for it
        #expect(!state.endingSettles(9))  // unknown
        _ = state.end(1)
        _ = state.end(2)
        #expect(state.tick(at: Self.millisecond) == [.send(.finishBackgroundTransition)])
    }

    @Test func aHandlerRunsExactlyOnceWithTheFirstReason() {
        var state = subscribed()
        _ = state.begun(3, name: "sync", handler: "h3")
        _ = state.receive(.taskGranted(3), at: 0)
        var effects = state.receive(.taskExpiring([3], remaining: 5), at: Self.second)
        #expect(effects == [.runHandler("h3", .backgroundTimeExpiring(remaining: 5))])
        effects = state.receive(.taskExpired([3]), at: 6 * Self.second)
        #expect(effects.isEmpty)
        var ending = state.end(3)
        #expect(ending == .alreadyEnded)  // the daemon ended it: nothing to send
        ending = state.end(3)
        #expect(ending == .unknown)
    }

    @Test func eventsThatBeatTheBeginReplyApplyWhenItArrives() {
        var state = subscribed()
        var effects = state.receive(.taskDenied(9, reason: "suspendedBeforeGrant"), at: 0)
        #expect(effects.isEmpty)
        effects = state.begun(9, name: "late", handler: "h9")
        #expect(effects == [.runHandler("h9", .denied("suspendedBeforeGrant"))])
        let ending = state.end(9)
        #expect(ending == .alreadyEnded)
    }

    @Test func earlyEventsAreBounded() {
        var state = subscribed()
        for id in 1...(State.maximumEarlyEvents + 1) { _ = state.receive(.taskExpired([id]), at: 0) }
        var effects = state.begun(1, name: "oldest", handler: "h1")
        #expect(effects.isEmpty)  // dropped, oldest first
        effects = state.begun(2, name: "kept", handler: "h2")
        #expect(effects == [.runHandler("h2", .backgroundTimeExpired)])
    }

    @Test func aLostDaemonIsRetriedWithBackoffAndOrphansWaitForIt() {
        var state = subscribed()
        _ = state.begun(1, name: "kept", handler: "h1")
        _ = state.begun(2, name: "lost", handler: "h2")
        var news = state.lost(at: 0)
        #expect(news)
        #expect(!state.isConnectedForTest && state.state == .active)
        #expect(state.nextDeadline == 50 * Self.millisecond)
        var effects = state.tick(at: 50 * Self.millisecond)
        #expect(effects == [.reconnect])
        state.reconnectFailed(at: 50 * Self.millisecond)
        #expect(state.nextDeadline == 150 * Self.millisecond)  // twice as long
        effects = state.tick(at: 150 * Self.millisecond)
        #expect(effects == [.reconnect])
        news = state.lost(at: 150 * Self.millisecond)
        #expect(!news)  // subscribed, then lost again: no news
        // Back: it kept task 1, not task 2.
        effects = state.receive(.subscribed(state: "foreground", remaining: nil, held: [1]), at: Self.second)
        #expect(effects == [.runHandler("h2", .daemonUnavailable)])
        var ending = state.end(1)
        #expect(ending == .send)
        ending = state.end(2)
        #expect(ending == .alreadyEnded)
        #expect(state.nextDeadline == nil)
    }

    @Test func orphansExpireWhenTheDaemonStaysAway() {
        var state = subscribed()
        _ = state.begun(1, name: "a", handler: "h1")
        _ = state.receive(.taskGranted(1), at: 0)
        _ = state.lost(at: Self.second)
        let grace = Self.second + State.restartGrace
        var effects = state.tick(at: grace - 1)
        #expect(!effects.contains(.runHandler("h1", .daemonUnavailable)))
        effects = state.tick(at: grace)
        #expect(effects.contains(.runHandler("h1", .daemonUnavailable)))
        effects = state.tick(at: grace + Self.second)
        #expect(!effects.contains(.runHandler("h1", .daemonUnavailable)))
        // It comes back late, still holding the task: ending it must reach the daemon.
        _ = state.receive(.subscribed(state: "foreground", remaining: nil, held: [1]), at: 10 * Self.second)
        let ending = state.end(1)
        #expect(ending == .send)
    }

    @Test func endsThatCouldNotBeSentGoOutOnceTheDaemonIsBack() {
        var state = subscribed()
        _ = state.begun(4, name: "a", handler: nil)
        _ = state.lost(at: 0)
        let ending = state.end(4)
        #expect(ending == .send)  // orphaned: the daemon may still hold it
        state.endUndelivered(4)
        let effects = state.receive(.subscribed(state: "background", remaining: 12, held: [4]), at: Self.second)
        #expect(effects == [.send(.endTask(4))])
        #expect(state.state == .background)
        #expect(state.backgroundTimeRemaining(at: 3 * Self.second) == 10)
    }

    /// The daemon restarted and warned the app's task meanwhile: the warning is not sent
    /// again, but `subscribed` names the task, and its handler runs then, once.
    @Test func aWarningMissedWhileAwayRunsTheHandlerOnResubscribing() {
        var state = subscribed()
        _ = state.begun(1, name: "a", handler: "h1")
        _ = state.receive(.taskGranted(1), at: 0)
        _ = state.lost(at: Self.second)
        var effects = state.receive(.subscribed(state: "background", remaining: 2, held: [1], expiring: [1]), at: 2 * Self.second)
        #expect(effects == [.runHandler("h1", .backgroundTimeExpiring(remaining: 2))])
        effects = state.receive(.subscribed(state: "background", remaining: 1, held: [1], expiring: [1]), at: 3 * Self.second)
        #expect(effects.isEmpty, "the handler ran already")
        #expect(state.end(1) == .send)
    }

    @Test func aSubscribeReplyParsesIntoItsEvent() {
        #expect(DaemonEvent(["event": "subscribed", "state": "background", "backgroundTimeRemaining": .double(3.5),
                             "taskIds": .array([1, 2])]) == .subscribed(state: "background", remaining: 3.5, held: [1, 2]))
        #expect(DaemonEvent(["event": "subscribed", "state": "background", "taskIds": .array([1, 2]), "expiringTaskIds": .array([2])])
            == .subscribed(state: "background", remaining: nil, held: [1, 2], expiring: [2]))
        #expect(DaemonEvent(["event": "taskDenied", "taskId": 5, "reason": "limit"]) == .taskDenied(5, reason: "limit"))
        #expect(DaemonEvent(["event": "taskGranted"]) == nil)  // no id
        #expect(DaemonEvent(["event": "somethingNew"]) == nil)
    }
    @Test func aWakeIsFinishedOnceWhenTheHandlerCompletesAndItsGrantsAreIn() {
        var state = subscribed()
        let woke = state.receive(.didWake(reason: "push", payload: "{}", remaining: 5), at: 0)
        #expect(woke == [.wake(reason: "push", payload: "{}")] && state.state == .background)
        _ = state.begun(3, name: "fetch", handler: "h3")  // begun in the handler, not granted yet
        let early = state.wakeCompleted(at: Self.millisecond)
        #expect(early.isEmpty)  // waits for the grant
        _ = state.receive(.taskGranted(3), at: 2 * Self.millisecond)
        let finished = state.tick(at: 2 * Self.millisecond)
        #expect(finished == [.send(.finishWake)])
        let again = state.wakeCompleted(at: 3 * Self.millisecond)
        #expect(again.isEmpty)  // once
    }

    @Test func aWakeTheAppNeverCompletesIsFinishedJustBeforeItsWindowEnds() {
        var state = subscribed()
        _ = state.receive(.didWake(reason: "fetch", payload: nil, remaining: 1), at: 0)
        let finishBy = Self.second - State.finishMargin
        #expect(state.nextDeadline == finishBy)
        let before = state.tick(at: finishBy - 1)
        #expect(before.isEmpty)
        let at = state.tick(at: finishBy)
        #expect(at == [.send(.finishWake)])
    }
}


extension ClientState {
    var isConnectedForTest: Bool { connected }
}
