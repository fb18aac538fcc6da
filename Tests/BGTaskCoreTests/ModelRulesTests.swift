// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// One test (or more) per rule of DESIGN.md §2, with explicit instants.
@Suite struct ModelRulesTests {
    // Rule 1
    @Test func descendantBelongsToItsAncestorsApp() throws {
        var h = ModelHarness()
        let app = try h.app(pid: 100)
        let child = h.process(pid: 101, ancestors: [app])
        #expect(try h.model.register(child, at: h.now, effects: &h.effects) == app)
        #expect(h.model.appCount == 1)
        let stranger = h.process(pid: 200)
        #expect(try h.model.register(stranger, at: h.now, effects: &h.effects) != app)
        #expect(h.model.appCount == 2)
        #expect(h.state(app) == .foreground)
    }

    @Test func initProcessIsRefused() {
        var h = ModelHarness()
        let initProcess = h.process(pid: 1)
        #expect(throws: BGTaskError.invalidParameter("pid 1 cannot be managed")) {
            try h.model.register(initProcess, at: h.now, effects: &h.effects)
        }
        #expect(h.model.appCount == 0)
        #expect(h.take().isEmpty)
    }

    // Rule 2
    @Test func beginAnswersPendingAndGrantsAfterLatency() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        #expect(h.taskState(id) == .pending)
        #expect(h.model.nextDeadline() == .seconds(0.05))
        h.at(0.049)
        #expect(h.taskState(id) == .pending)
        h.at(0.05)
        #expect(h.taskState(id) == .granted)
        #expect(h.take().lifecycle == [.taskGranted(id)])
    }

    /// Which app a process of a uid belongs to may change only when that uid's apps'
    /// generation does: it moves when an app of the uid is registered, given a unit or
    /// removed, and the daemon keeps a caller's app while it does not (`Daemon.appCaller`).
    /// Another user's apps, and any app's calls and state, leave it where it is.
    @Test func aUsersAppsGenerationMovesWhenOneOfItsAppsIsAddedIsolatedOrRemoved() throws {
        var h = ModelHarness()
        var seen = h.model.appsGeneration(of: 1000)
        func moved(_ h: inout ModelHarness) -> Bool {
            defer { seen = h.model.appsGeneration(of: 1000) }
            return h.model.appsGeneration(of: 1000) != seen
        }
        let app = try h.app(pid: 100)
        #expect(moved(&h))
        let task = try h.begin(app)
        h.at(0.05)
        try h.end(task, in: app)
        #expect(!moved(&h))  // the calls of an app that is one already
        try h.background(app)
        try h.foreground(app)
        #expect(h.state(app) == .foreground && !moved(&h))  // its state
        let others = try h.app(pid: 300, uid: 65534)
        try h.background(others)
        h.model.processExited(others, at: h.now, effects: &h.effects)
        #expect(h.state(others) == nil && !moved(&h))  // another user's apps
        let rootSeen = h.model.appsGeneration(of: 0)
        for uid: UInt32 in [64, 1024, 4096] { _ = try h.app(pid: Int32(400 + uid), uid: uid) }
        #expect(h.model.appsGeneration(of: 0) == rootSeen)  // root's apps: no other uid's
        #expect(h.model.isolate(app, inScope: "/user.slice/app-x.scope", effects: &h.effects))
        #expect(moved(&h))
        _ = try h.app(pid: 200)
        #expect(moved(&h))
        h.model.processExited(app, at: h.now, effects: &h.effects)
        #expect(h.state(app) == nil && moved(&h))
    }

    /// A grant's lifecycle event is listed for whoever hears it: the app's subscribers, or
    /// a monitor of its owner's (`monitoredOwners`); for nobody else.
    @Test func aGrantIsListedForSubscribersAndMonitorsOnly() throws {
        var h = ModelHarness()
        h.model.monitoredOwners = .nobody
        let plain = try h.app(pid: 100)
        let subscribed = try h.app(pid: 200, subscribed: true)
        let unheard = try h.begin(plain)
        let heard = try h.begin(subscribed)
        h.at(0.05)
        #expect(h.taskState(unheard) == .granted && h.taskState(heard) == .granted)
        #expect(h.take().lifecycle == [.taskGranted(heard)])
        h.model.monitoredOwners = .some([65534])  // another user's monitor connected
        let unwatched = try h.begin(plain)
        h.at(0.1)
        #expect(h.taskState(unwatched) == .granted && h.take().lifecycle.isEmpty)
        h.model.monitoredOwners = .some([65534, 1000])  // one of the owner's
        let watched = try h.begin(plain)
        h.at(0.15)
        #expect(h.take().lifecycle == [.taskGranted(watched)])
        h.model.monitoredOwners = .everyone  // root's
        let everyones = try h.begin(plain)
        h.at(0.2)
        #expect(h.take().lifecycle == [.taskGranted(everyones)])
    }

    @Test func grantLatencyIsDrawnFromTheRangeAndReproducibleWithASeed() throws {
        func latencies(seed: UInt64) throws -> [Int64] {
            var h = ModelHarness {
                $0.grantLatencyMin = .milliseconds(10)
                $0.grantLatencyMax = .milliseconds(90)
                $0.grantLatencySeed = seed
            }
            let app = try h.app()
            var grants: [Int64] = []
            for _ in 0..<50 {
                try h.begin(app)
                grants.append(h.model.nextDeadline()!.nanoseconds)
                h.at(1)  // grant it, so the next begin's timer is the earliest
                h.now = .zero
            }
            return grants
        }
        let first = try latencies(seed: 7)
        #expect(first == (try latencies(seed: 7)))
        #expect(first != (try latencies(seed: 8)))
        #expect(first.allSatisfy { $0 >= 10_000_000 && $0 <= 90_000_000 })
        #expect(Set(first).count > 40)
    }

    @Test func taskBegunInTheForegroundIsDormant() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        h.at(1000)
        #expect(h.taskState(id) == .granted)
        #expect(h.model.backgroundTimeRemaining(of: app, at: h.now) == nil)
        #expect(h.take().actions.isEmpty)
        #expect(h.model.nextDeadline() == nil || h.model.nextDeadline()! <= .seconds(1000))
    }

    // Rule 3
    @Test func subscriberGetsDidEnterBackgroundAndMustFinishInTime() throws {
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        h.at(10)
        try h.background(app)
        #expect(h.take().lifecycle == [.didEnterBackground(transitionTimeout: .seconds(5),
                                                            backgroundTimeRemaining: .seconds(30))])
        #expect(h.phase(app) == .transition)
        h.at(14.999)
        #expect(h.state(app) == .background)
        h.at(15)
        #expect(h.take().actions.map(\.1) == [.transitionTimeout])
        #expect(h.state(app) == nil)
    }

    /// Rule 3 when the daemon is held up past a transition's end by half a second (half the
    /// minimum grace) or more: the delegate may have waited all that time for an answer to a
    /// call (`beginBackgroundTask` in `applicationDidEnterBackground`), so the transition has
    /// a second more, from the late pass; a pass late by less is no stall: terminated.
    @Test(arguments: [false, true]) func aTransitionsEndFoundLateGivesTheDelegateASecondMore(finishes: Bool) throws {
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        h.at(10)
        try h.background(app)  // the transition ends at 15
        _ = h.take()
        h.at(15.6)
        let late = h.take()
        #expect(late.actions.isEmpty && h.phase(app) == .transition)
        let logs = late.compactMap { if case let .log(entry) = $0, entry.priority == .warning { entry.message } else { nil } }
        #expect(logs == ["App pid 100 (app100) is given 1s more to finish its background transition: its end came 600ms late (the daemon was held up)"])
        h.at(16.599)
        #expect(h.take().actions.isEmpty)
        if finishes {
            h.finishTransition(app)
            #expect(h.phase(app) == .running || h.state(app) == .suspended)
            h.at(16.6)
            #expect(h.take().actions.allSatisfy { $0.1 != .transitionTimeout })
            #expect(h.state(app) != nil)
        } else {
            h.at(16.6)
            #expect(h.take().actions.map(\.1) == [.transitionTimeout])
        }

        var onTime = ModelHarness()
        let other = try onTime.app(subscribed: true)
        onTime.at(10)
        try onTime.background(other)
        onTime.at(15.499)
        #expect(onTime.take().actions.map(\.1) == [.transitionTimeout])
    }

    @Test func appWithoutSubscriberReturnsAtOnce() throws {
        var h = ModelHarness()
        let app = try h.app()
        try h.background(app)
        #expect(h.state(app) == .suspended)
        #expect(h.take().actions.map(\.1) == [.transitionFinished])
    }

    // Rule 4
    @Test func finishingWithAGrantedTaskKeepsRunning() throws {
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        try h.background(app)
        let id = try h.begin(app)
        h.at(0.05)
        h.at(1)
        h.finishTransition(app)
        #expect(h.phase(app) == .running)
        #expect(h.taskState(id) == .granted)
        #expect(h.take().actions.isEmpty)
    }

    @Test func lateRequestIsDeniedAndTheAppSuspendedAnyway() throws {
        // Asked for 30 ms before the transition window closes, with 50 ms of grant latency.
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        try h.background(app)
        _ = h.take()
        h.at(4.97)
        let id = try h.begin(app)
        h.at(4.98)
        h.finishTransition(app)
        let effects = h.take()
        #expect(effects.finishedTasks.map { $0.0 } == [id])
        #expect(effects.finishedTasks.first?.1 == .denied)
        #expect(effects.finishedTasks.first?.2 == .suspendedBeforeGrant)
        #expect(effects.lifecycle == [.taskDenied(id, .suspendedBeforeGrant)])
        #expect(effects.actions.map(\.1) == [.transitionFinished])
        #expect(h.state(app) == .suspended)
        h.at(5.02)  // the grant timer is stale now
        #expect(h.take().isEmpty)
    }

    @Test func pendingTaskOfAnAppWithoutSubscriberIsDeniedOnEnteringBackground() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        h.at(0.01)
        try h.background(app)
        #expect(h.take().finishedTasks.map { $0.2 } == [.suspendedBeforeGrant])
        #expect(h.state(app) == .suspended)
        #expect(h.taskState(id) == nil)
    }

    // Rule 5
    @Test func lastTaskEndingSuspendsTheApp() throws {
        var h = ModelHarness()
        let app = try h.app()
        let a = try h.begin(app, "a")
        let b = try h.begin(app, "b")
        h.at(0.05)
        try h.background(app)
        #expect(h.phase(app) == .running)
        h.at(3)
        try h.end(a, in: app)
        #expect(h.state(app) == .background)
        try h.end(b, in: app)
        #expect(h.state(app) == .suspended)
        #expect(h.take().actions.map(\.1) == [.tasksEnded])
    }

    // Rules 3 and 6: one deadline shared by all tasks; the warning comes ExpirationWarningSec before it.
    @Test func deadlineIsSharedAndWarningComesBeforeIt() throws {
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        h.at(10)
        try h.background(app)
        let early = try h.begin(app, "early")
        h.at(10.05)
        h.finishTransition(app)
        h.at(20)
        let late = try h.begin(app, "late")
        h.at(20.05)
        #expect(h.model.backgroundTimeRemaining(of: app, at: h.now) == .milliseconds(19_950))
        _ = h.take()
        h.at(34.999)
        #expect(h.take().lifecycle.isEmpty)
        h.at(35)
        #expect(h.take().lifecycle == [.taskExpiring([early, late], backgroundTimeRemaining: .seconds(5))])
        #expect(h.phase(app) == .expiring)
        #expect(h.taskState(early) == .expiring && h.taskState(late) == .expiring)
    }

    @Test func beginIsRefusedOnceExpiringAndPendingTasksAreDenied() throws {
        var h = ModelHarness { $0.grantLatencyMax = .seconds(2); $0.grantLatencyMin = .seconds(2) }
        let app = try h.app()
        let held = try h.begin(app, "held")
        h.at(2)
        try h.background(app)  // deadline 32, warning 27
        h.at(26)
        let pending = try h.begin(app, "pending")
        h.at(27)
        #expect(h.take().finishedTasks.map { "\($0.0) \($0.1) \($0.2!)" } == ["\(pending) denied noBackgroundTime"])
        #expect(throws: BGTaskError.noBackgroundTime) { try h.begin(app) }
        #expect(h.taskState(held) == .expiring)
    }

    // Rule 7
    @Test func taskEndedAfterTheWarningSuspendsNotTerminates() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        h.at(0.05)
        try h.background(app)
        h.at(27)
        try h.end(id, in: app)
        #expect(h.take().actions.map(\.1) == [.tasksEnded])
        h.at(30)
        #expect(h.take().actions.isEmpty)
        #expect(h.state(app) == .suspended)
    }

    @Test func taskHeldAtTheDeadlineTerminatesTheAppNamingIt() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app, "upload")
        h.at(0.05)
        try h.background(app)  // deadline 30.05
        h.at(25.05)  // warned
        h.at(30.049)
        #expect(h.state(app) == .background)
        _ = h.take()
        h.at(30.05)
        let effects = h.take()
        let terminations = effects.compactMap { if case let .act(r, signal) = $0 { (r, signal) } else { nil } }
        #expect(terminations.count == 1)
        #expect(terminations.first?.0.reason == .assertionsBeyondPermittedTime)
        #expect(terminations.first?.0.taskNames == ["upload"])
        #expect(terminations.first?.1 == .kill)
        #expect(effects.lifecycle == [.taskExpired([id])])
        #expect(effects.finishedTasks.map { $0.1 } == [.expired])
        #expect(h.state(app) == nil && h.model.taskCount == 0)
        // Watched until the kill that bounds the wait for its processes' stops (the daemon
        // sends SIGKILL once they have stopped): what a restarted daemon kills.
        #expect(!effects.contains(.unwatch(app)))
        h.at(30.05 + BackgroundModel.terminationStopBound.seconds - 0.001)
        #expect(h.take().isEmpty)
        h.at(30.05 + BackgroundModel.terminationStopBound.seconds)
        #expect(h.take() == [.kill(app, uid: 1000), .unwatch(app)])
    }

    /// Rule 7a when the daemon is late: a loop stalled past an app's warning and its deadline
    /// (the daemon stopped, starved of CPU) fires both timers in one pass. The warning goes
    /// out with the time truly left, at least the minimum grace (1 s here), and the deadline
    /// moves there: the app that ends its task in it is suspended, the one that does not is
    /// terminated at its end. Warned in time, or with warnings off, nothing moves: the stall
    /// took nothing the app was owed.
    @Test(arguments: [false, true]) func aWarningSentLateLeavesTheMinimumGraceBeforeTheDeadline(endsItsTask: Bool) throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        h.at(0.05)
        try h.background(app)  // warning 25.05, deadline 30.05
        _ = h.take()
        h.at(60)  // the first pass after a stall
        let warned = h.take()
        #expect(warned.lifecycle == [.taskExpiring([id], backgroundTimeRemaining: .seconds(1))])
        #expect(warned.actions.isEmpty)
        let logs = warned.compactMap { if case let .log(entry) = $0, entry.priority == .warning { entry.message } else { nil } }
        #expect(logs.contains { $0.contains("warned 34s 950ms late") }, "\(logs)")
        #expect(h.model.backgroundTimeRemaining(of: app, at: h.now) == .seconds(1))
        if endsItsTask {
            h.at(60.999)
            try h.end(id, in: app)
            #expect(h.take().actions.map(\.1) == [.tasksEnded])
            #expect(h.state(app) == .suspended)
            h.at(61)
            #expect(h.take().actions.isEmpty)
        } else {
            h.at(60.999)
            #expect(h.take().actions.isEmpty)
            h.at(61)
            #expect(h.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        }
    }

    @Test(arguments: [false, true]) func aStallAfterAnOnTimeWarningOrWithWarningsOffMovesNoDeadline(warningsOff: Bool) throws {
        var h = ModelHarness { if warningsOff { $0.expirationWarning = .zero } }
        let app = try h.app()
        _ = try h.begin(app)
        h.at(0.05)
        try h.background(app)
        if !warningsOff { h.at(25.05) }  // warned on time, 5 s left
        _ = h.take()
        h.at(60)
        #expect(h.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        // Late but with more than the grace left: told the time truly left, nothing moved.
        var late = ModelHarness()
        let other = try late.app()
        let task = try late.begin(other)
        late.at(0.05)
        try late.background(other)
        _ = late.take()
        late.at(27.05)
        #expect(late.take().lifecycle == [.taskExpiring([task], backgroundTimeRemaining: .seconds(3))])
        late.at(30.05)
        #expect(late.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        // A 1 s warning: half of it left is no stall (a pass's lateness never moves a
        // deadline); less is, and the whole second follows.
        for (sent, deadline) in [(29.55, 30.05), (29.56, 30.56)] {
            var short = ModelHarness { $0.expirationWarning = .seconds(1) }
            let app = try short.app()
            let task = try short.begin(app)
            short.at(0.05)
            try short.background(app)
            _ = short.take()
            short.at(sent)
            #expect(short.take().lifecycle == [.taskExpiring([task], backgroundTimeRemaining: .seconds(deadline - sent))])
            short.at(deadline - 0.001)
            #expect(short.take().actions.isEmpty)
            short.at(deadline)
            #expect(short.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        }
    }

    // Rule 8
    @Test func foregroundResumesRestoresTasksAndTheNextBackgroundGetsAFreshBudget() throws {
        var h = ModelHarness()
        let app = try h.app()
        let id = try h.begin(app)
        h.at(0.05)
        try h.background(app)
        h.at(26)
        #expect(h.taskState(id) == .expiring)
        try h.foreground(app)
        #expect(h.taskState(id) == .granted)
        #expect(h.model.backgroundTimeRemaining(of: app, at: h.now) == nil)
        h.at(40)  // the old deadline passes harmlessly
        #expect(h.state(app) == .foreground)
        try h.background(app)
        #expect(h.model.backgroundTimeRemaining(of: app, at: h.now) == .seconds(30))
        h.at(64.999)
        #expect(h.taskState(id) == .granted)
        h.at(65)
        #expect(h.taskState(id) == .expiring)
        try h.end(id, in: app)
        #expect(h.state(app) == .suspended)
        _ = h.take()
        try h.foreground(app)
        #expect(h.take().actions.map { "\($0.0) \($0.1)" } == ["resumed foreground"])
        #expect(h.state(app) == .foreground)
    }

    // Rule 9
    @Test func ownerExitEndsItsTasksAndAppExitForgetsTheApp() throws {
        var h = ModelHarness()
        let app = try h.app()
        let helper = h.process(pid: 101, ancestors: [app])
        let byHelper = try h.begin(app, "helper", owner: helper.identity)
        let byApp = try h.begin(app, "app")
        #expect(h.take().contains(.watch(helper.identity)))
        h.model.processExited(helper.identity, at: h.now, effects: &h.effects)
        let effects = h.take()
        #expect(effects.finishedTasks.map { "\($0.0) \($0.2!)" } == ["\(byHelper) ownerExited"])
        #expect(effects.contains(.unwatch(helper.identity)))
        h.model.processExited(app, at: h.now, effects: &h.effects)
        #expect(h.take().finishedTasks.map { "\($0.0) \($0.2!)" } == ["\(byApp) appExited"])
        #expect(h.model.appCount == 0 && h.model.taskCount == 0)
    }

    /// An owner's tasks are held inline while it has one, in a set beyond (`TaskIDs`): its
    /// watch, and its exit's ending, follow every one of them through both.
    @Test func anOwnersTasksAreFollowedOneOrMany() throws {
        var h = ModelHarness()
        let app = try h.app()
        let helper = h.process(pid: 101, ancestors: [app]).identity
        let first = try h.begin(app, "first", owner: helper)
        let second = try h.begin(app, "second", owner: helper)
        let third = try h.begin(app, "third", owner: helper)
        #expect(h.take().filter { $0 == .watch(helper) }.count == 1)
        try h.end(second, in: app)  // three to two
        try h.end(first, in: app)   // two to one, held inline again
        #expect(!h.take().contains(.unwatch(helper)))
        #expect(h.model.uid(of: helper) == 1000)
        let fourth = try h.begin(app, "fourth", owner: helper)  // one to two
        h.model.processExited(helper, at: h.now, effects: &h.effects)
        let effects = h.take()
        #expect(effects.finishedTasks.map { "\($0.0) \($0.2!)" } == ["\(third) ownerExited", "\(fourth) ownerExited"])
        #expect(effects.contains(.unwatch(helper)))
        #expect(h.model.uid(of: helper) == nil)
    }

    /// A helper's watch lasts while it holds a task: its last task's end lets it go. The
    /// app's own process is watched as the app, whatever its tasks do.
    @Test func aHelpersLastEndUnwatchesItAndTheAppsOwnTasksNeverDo() throws {
        var h = ModelHarness()
        let app = try h.app()
        let helper = h.process(pid: 101, ancestors: [app]).identity
        _ = h.take()
        let own = try h.begin(app, "own")
        let byHelper = try h.begin(app, "helper", owner: helper)
        #expect(h.take().filter { $0 == .watch(helper) || $0 == .watch(app) || $0 == .unwatch(app) } == [.watch(helper)])
        try h.end(byHelper, in: app)
        #expect(h.take().filter { $0 == .unwatch(helper) }.count == 1)
        try h.end(own, in: app)
        #expect(!h.take().contains { $0 == .watch(app) || $0 == .unwatch(app) })
        #expect(h.model.uid(of: helper) == nil && h.model.uid(of: app) == 1000)
    }

    /// Without a monitor (`monitoredOwners` nobody), only a streamed task's changes are
    /// listed: nobody else hears of them; with another user's monitor, still only those.
    @Test func taskChangesAreListedForTheirStreamOrForTheirOwnersMonitors() throws {
        var h = ModelHarness()
        h.model.monitoredOwners = .nobody
        let app = try h.app()
        let plain = try h.begin(app, "plain")
        let streamed = try h.begin(app, "streamed", connection: ConnectionID(7))
        h.at(0.05)  // both granted
        try h.end(plain, in: app)
        try h.end(streamed, in: app)
        func changed(_ effects: [Effect]) -> [String] {
            effects.compactMap { if case let .taskChanged(task) = $0 { "\(task.id) \(task.state)" } else { nil } }
        }
        #expect(changed(h.take()) == ["\(streamed) pending", "\(streamed) granted", "\(streamed) ended"])
        h.model.monitoredOwners = .some([65534])
        let unwatched = try h.begin(app, "unwatched")
        try h.end(unwatched, in: app)
        #expect(changed(h.take()).isEmpty)
        for owners in [MonitoredOwners.some([1000]), .everyone] {
            h.model.monitoredOwners = owners
            let watched = try h.begin(app, "watched")
            try h.end(watched, in: app)
            #expect(changed(h.take()) == ["\(watched) pending", "\(watched) ended"], "\(owners)")
        }
    }

    @Test func closingTheConnectionEndsTasksBegunWithMore() throws {
        var h = ModelHarness()
        let app = try h.app()
        let streamed = try h.begin(app, "streamed", connection: ConnectionID(7))
        let plain = try h.begin(app, "plain")
        h.at(0.05)
        h.model.connectionClosed(ConnectionID(7), at: h.now, effects: &h.effects)
        #expect(h.take().finishedTasks.map { "\($0.0) \($0.2!)" } == ["\(streamed) connectionClosed"])
        #expect(h.taskState(plain) == .granted)
    }

    /// Rule 5 through a closed connection: the app whose last tasks it held is suspended
    /// once, after all of them ended; an app with a task left keeps running.
    @Test func closingTheConnectionOfTheLastTasksSuspendsTheAppOnce() throws {
        var h = ModelHarness()
        let idle = try h.app(pid: 100), busy = try h.app(pid: 200)
        try h.begin(idle, "first", connection: ConnectionID(7))
        try h.begin(idle, "second", connection: ConnectionID(7))
        try h.begin(busy, "streamed", connection: ConnectionID(8))
        let left = try h.begin(busy, "plain")
        h.at(0.05)
        try h.background(idle)
        try h.background(busy)
        _ = h.take()
        h.model.connectionClosed(ConnectionID(7), at: h.now, effects: &h.effects)
        #expect(h.take().actions.map { "\($0.0) \($0.1)" } == ["suspended tasksEnded"])
        #expect(h.state(idle) == .suspended)
        h.model.connectionClosed(ConnectionID(8), at: h.now, effects: &h.effects)
        #expect(h.take().actions.isEmpty)
        #expect(h.state(busy) == .background && h.taskState(left) == .granted)
    }

    @Test func endingAnotherAppsTaskIsNoSuchTaskAndChangesNothing() throws {
        var h = ModelHarness()
        let mine = try h.app(pid: 100)
        let theirs = try h.app(pid: 200)
        let id = try h.begin(theirs)
        _ = h.take()
        #expect(throws: BGTaskError.noSuchTask(id)) { try h.end(id, in: mine) }
        #expect(throws: BGTaskError.noSuchTask(999)) { try h.end(999, in: mine) }
        #expect(h.take().isEmpty)
        #expect(h.taskState(id) == .pending)
    }

    @Test func lastSubscriberLeavingMidTransitionFinishesIt() throws {
        var h = ModelHarness()
        let app = try h.app(subscribed: true)
        try h.background(app)
        h.model.unsubscribe(app, at: h.now, effects: &h.effects)
        #expect(h.state(app) == .suspended)
    }

    // Limits
    @Test func limitsAreEnforced() throws {
        var h = ModelHarness { $0.maxTasksPerApp = 2; $0.maxApps = 1 }
        let app = try h.app()
        try h.begin(app)
        try h.begin(app)
        #expect(throws: BGTaskError.limitExceeded("MaxTasksPerApp=2 reached")) { try h.begin(app) }
        let other = h.process(pid: 300)
        #expect(throws: BGTaskError.limitExceeded("MaxApps=1 reached")) {
            try h.model.register(other, at: h.now, effects: &h.effects)
        }
    }

    // Terminate escalation
    @Test func catchableTerminateSignalIsFollowedByKillAfterGrace() throws {
        var h = ModelHarness { $0.terminateSignal = .term; $0.terminateGrace = .seconds(2) }
        let app = try h.app()
        try h.model.terminate(app, at: h.now, effects: &h.effects)
        let first = h.take()
        #expect(first.compactMap { if case let .act(r, s) = $0 { "\(r.action) \(s!)" } else { nil } } == ["terminated SIGTERM"])
        #expect(!first.contains(.unwatch(app)))
        h.at(1.999)
        #expect(h.take().isEmpty)
        h.at(2)
        #expect(h.take() == [.kill(app, uid: 1000), .unwatch(app)])

        // The app's own process exiting early does not cancel the SIGKILL for what it left behind.
        let quick = try h.app(pid: 101)
        try h.model.terminate(quick, at: h.now, effects: &h.effects)
        h.model.processExited(quick, at: h.now, effects: &h.effects)
        _ = h.take()
        h.at(4)
        #expect(h.take() == [.kill(quick, uid: 1000), .unwatch(quick)])
        h.at(10)
        #expect(h.take().isEmpty)
    }

    /// A suspended app thawed by someone else and sent a signal to stop (systemd stopping its
    /// unit) is terminated with that signal, whatever `TerminateSignal=` says (`SIGKILL` by
    /// default), and killed when `TerminateGraceSec` runs out; a running app is not touched
    /// (it acts on the signal by itself).
    @Test func anAppStoppedWhileSuspendedIsTerminatedWithTheSignalItWasSent() throws {
        var h = ModelHarness { $0.terminateGrace = .seconds(2) }
        let app = try h.app()
        let running = try h.app(pid: 101)
        try h.background(app)
        h.finishTransition(app)
        #expect(h.state(app) == .suspended)
        _ = h.take()
        h.model.stoppedWhileSuspended(running, signal: .term, at: h.now, effects: &h.effects)
        #expect(h.take().isEmpty && h.state(running) == .foreground)
        let interrupt = TerminateSignal(parsing: "SIGINT")!
        h.model.stoppedWhileSuspended(app, signal: interrupt, at: h.now, effects: &h.effects)
        let first = h.take()
        #expect(first.compactMap { if case let .act(r, s) = $0 { "\(r.action) \(r.reason) \(s!)" } else { nil } }
                == ["terminated stoppedWhileSuspended SIGINT"], "\(first)")
        #expect(h.state(app) == nil)
        h.at(1.999)
        #expect(h.take().isEmpty)
        h.at(2)
        #expect(h.take() == [.kill(app, uid: 1000), .unwatch(app)])
    }

    /// A catchable signal the daemon could send only after the termination (its processes'
    /// stops took long) gives the app its whole grace from the signal; the `SIGKILL` due at the
    /// first instant does not come, and the later one survives a restart. A `SIGKILL`
    /// termination's bound is not moved.
    @Test func aLateSignalsGraceRunsFromTheSignal() throws {
        var h = ModelHarness { $0.terminateSignal = .term; $0.terminateGrace = .seconds(2) }
        let app = try h.app()
        try h.model.terminate(app, at: h.now, effects: &h.effects)  // at 0
        _ = h.take()
        h.model.terminationSignalled(app, at: .seconds(1))
        h.model.terminationSignalled(app, at: .seconds(0.5))  // no earlier again
        #expect(h.model.savedState().terminating[app]?.killAt == .seconds(3))
        h.at(2.999)
        #expect(h.take().isEmpty)
        var restored = ModelHarness()
        restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
        restored.now = h.now
        restored.model.restore(h.model.savedState(), at: restored.now, effects: &restored.effects)
        for var harness in [h, restored] {
            harness.at(3)
            #expect(harness.take().contains(.kill(app, uid: 1000)))
        }

        var killed = ModelHarness { $0.terminateSignal = .kill }
        let other = try killed.app(pid: 101)
        try killed.model.terminate(other, at: killed.now, effects: &killed.effects)
        killed.model.terminationSignalled(other, at: .seconds(0.5))
        killed.at(BackgroundModel.terminationStopBound.seconds)
        #expect(killed.take().contains(.kill(other, uid: 1000)))
    }

    /// A daemon held up past a termination's grace while it waited for the processes' stops:
    /// the signal and the `SIGKILL` fall due in one late pass. The kill is put off, once: the
    /// grace from then (the signal goes out in that pass; when the daemon reports it, the
    /// grace runs from the report). Logged. One not reported sent by then is killed; a
    /// `SIGKILL` termination, or a signal sent in time, is killed when due.
    @Test func aKillDueBeforeItsSignalWentOutGivesTheGraceFromThen() throws {
        var h = ModelHarness { $0.terminateSignal = .term; $0.terminateGrace = .seconds(2) }
        let held = try h.app(pid: 100), never = try h.app(pid: 101), sent = try h.app(pid: 102)
        for app in [held, never, sent] { try h.model.terminate(app, at: h.now, effects: &h.effects) }  // at 0
        h.model.terminationSignalled(sent, at: .seconds(0.5))
        _ = h.take()
        h.at(2.5)  // the pass that should have been at 2 (and at 0.5)
        let late = h.take()
        #expect(late.contains(.kill(sent, uid: 1000)))
        #expect(!late.contains(.kill(held, uid: 1000)) && !late.contains(.kill(never, uid: 1000)))
        let logs = late.compactMap { if case let .log(entry) = $0 { entry } else { nil } }
        #expect(logs.map(\.message).sorted() == [100, 101].map {
            "App pid \($0) was still to be sent its SIGTERM when its terminate grace ran out, 500ms late (the daemon was held up): the grace from now, 2s"
        })
        #expect(logs.allSatisfy { $0.priority == .warning && $0.kind == .appTerminated && $0.uid == 1000 })
        #expect(h.model.savedState().terminating[held]?.killAt == .seconds(4.5))  // saved
        h.model.terminationSignalled(held, at: .seconds(2.5))  // the same pass
        #expect(h.model.unsentTerminations.map(\.process) == [never])
        h.at(4.499)
        #expect(h.take().isEmpty)
        h.at(4.5)
        let due = h.take()
        #expect(due.count == 4 && [Effect.kill(held, uid: 1000), .unwatch(held), .kill(never, uid: 1000), .unwatch(never)].allSatisfy(due.contains))
        #expect(h.model.savedState().terminating.isEmpty && h.model.killsPutOff.isEmpty)

        var killed = ModelHarness { $0.terminateSignal = .kill }
        let other = try killed.app(pid: 103)
        try killed.model.terminate(other, at: killed.now, effects: &killed.effects)
        _ = killed.take()
        killed.at(5)
        #expect(killed.take() == [.kill(other, uid: 1000), .unwatch(other)])
    }

    /// A catchable signal is `unsent` until the daemon reports it sent; a restart finds the
    /// ones its predecessor had not sent (it was waiting for their processes' stops), for the
    /// daemon to send, and gives each its grace from the restart: no `SIGKILL` before it, not
    /// even where the saved one is past. A sent one, and a `SIGKILL` termination, are not sent
    /// again; the processes a sent one went to, and the cgroup that was its whole, are kept
    /// for the restarted daemon's kill.
    @Test func aRestartFindsTheSignalsNotSentAndGivesThemTheirGrace() throws {
        var h = ModelHarness { $0.terminateSignal = .term; $0.terminateGrace = .seconds(2) }
        let sent = try h.app(pid: 100), waiting = try h.app(pid: 101), late = try h.app(pid: 102)
        for app in [sent, waiting, late] { try h.model.terminate(app, at: h.now, effects: &h.effects) }  // at 0
        #expect(Set(h.model.unsentTerminations.map(\.process)) == [sent, waiting, late])
        #expect(h.model.savedState().terminating[waiting]?.unsent == .term)
        let child = ProcessIdentity(pid: 200, startTime: 7)
        let whole = TerminatedCgroup(path: "/user.slice/app.scope", inode: 9, invocation: [1, 2])
        h.model.terminationHolds(sent, processes: [sent, child])  // the daemon's order: what it went to, then the signal
        h.model.terminationSignalled(sent, at: h.now, cgroup: whole)  // at once: the grace as it was
        #expect(h.model.savedState().terminating[sent] == Termination(killAt: .seconds(2), uid: 1000, grace: .seconds(2),
                                                                      signalled: [sent, child], cgroup: whole))
        #expect(Set(h.model.unsentTerminations.map(\.process)) == [waiting, late])
        // What was stopped for a signal still to go out is saved, to be signalled after a
        // restart; after the signal, what it went to and what was found since (a tracked
        // app's fork in its grace), to be killed — neither moves the grace.
        let stoppedChild = ProcessIdentity(pid: 201, startTime: 8), forked = ProcessIdentity(pid: 202, startTime: 9)
        h.model.terminationHolds(waiting, processes: [waiting, stoppedChild])
        h.model.terminationHolds(sent, processes: [sent, child, forked])
        #expect(h.model.savedState().terminating[sent] == Termination(killAt: .seconds(2), uid: 1000, grace: .seconds(2),
                                                                      signalled: [sent, child, forked], cgroup: whole))
        _ = h.take()

        func restored(at seconds: Double) -> ModelHarness {
            var restored = ModelHarness()
            restored.model = BackgroundModel(configuration: h.model.configuration, seed: 7)
            restored.now = .seconds(seconds)
            restored.model.restore(h.model.savedState(), at: restored.now, effects: &restored.effects)
            _ = restored.take()
            return restored
        }
        var soon = restored(at: 1.5)
        #expect(soon.model.savedState().terminating[sent]?.signalled == [sent, child, forked])  // for the restarted daemon's kill
        #expect(soon.model.savedState().terminating[sent]?.cgroup == whole)
        let unsent = soon.model.unsentTerminations.sorted { $0.process.pid < $1.process.pid }
        #expect(unsent.map(\.process) == [waiting, late])
        #expect(unsent.allSatisfy { $0.uid == 1000 && $0.signal == .term && $0.grace == .seconds(2) })
        #expect(unsent.map(\.stopped) == [[waiting, stoppedChild], []])
        soon.at(2)
        #expect(soon.take() == [.kill(sent, uid: 1000), .unwatch(sent)])
        soon.model.terminationSignalled(waiting, at: .seconds(1.5))
        soon.model.terminationSignalled(late, at: .seconds(2.2))  // after its stops' wait
        #expect(soon.model.unsentTerminations.isEmpty)
        soon.at(3.499)
        #expect(soon.take().isEmpty)
        soon.at(3.5)
        #expect(soon.take() == [.kill(waiting, uid: 1000), .unwatch(waiting)])
        soon.at(4.199)
        #expect(soon.take().isEmpty)
        soon.at(4.2)
        #expect(soon.take() == [.kill(late, uid: 1000), .unwatch(late)])

        // Restarted long after the saved kill: the grace from the restart all the same.
        var after = restored(at: 10)
        after.at(10)
        #expect(after.take() == [.kill(sent, uid: 1000), .unwatch(sent)])
        after.at(11.999)
        #expect(after.take().isEmpty)
        after.at(12)
        let both = after.take()
        #expect(both.count == 4 && [Effect.kill(waiting, uid: 1000), .unwatch(waiting), .kill(late, uid: 1000), .unwatch(late)].allSatisfy(both.contains))

        // What is saved of a termination's processes is bounded (the state file's lines are).
        var big = ModelHarness { $0.terminateSignal = .term }
        let many = try big.app(pid: 104)
        try big.model.terminate(many, at: big.now, effects: &big.effects)
        let tree = [many] + (0..<5000).map { ProcessIdentity(pid: 1000 + Int32($0), startTime: 1) }
        big.model.terminationHolds(many, processes: tree)
        big.model.terminationSignalled(many, at: big.now)
        #expect(big.model.savedState().terminating[many]?.signalled == Array(tree.prefix(BackgroundModel.signalledSavedAtMost)))

        var killed = ModelHarness { $0.terminateSignal = .kill }
        let other = try killed.app(pid: 103)
        try killed.model.terminate(other, at: killed.now, effects: &killed.effects)
        killed.model.terminationSignalled(other, at: killed.now, cgroup: whole)  // not the daemon's to say
        #expect(killed.model.savedState().terminating[other]?.cgroup == nil)
        // A `SIGKILL` termination's stopped processes are saved, for a restarted daemon's kill.
        killed.model.terminationHolds(other, processes: [other, stoppedChild])
        #expect(killed.model.savedState().terminating[other]?.signalled == [other, stoppedChild])
        #expect(killed.model.unsentTerminations.isEmpty)
        #expect(killed.model.savedState().terminating[other]?.unsent == nil)
    }
}
