// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// What the daemon says on the Subscribe stream, parsed.
enum DaemonEvent: Equatable {
    /// `expiring`: the held tasks already warned (a warning sent while the library was away).
    case subscribed(state: String, remaining: Double?, held: Set<Int>, expiring: [Int] = [])
    /// `remaining` is `nil` for an exempt app: unlimited.
    case didEnterBackground(remaining: Double?, transitionTimeout: Double)
    case willEnterForeground
    case taskGranted(Int)
    case taskDenied(Int, reason: String)
    case taskExpiring([Int], remaining: Double)
    case taskExpired([Int])
    /// A manager woke the app; `payload` is a JSON object's text.
    case didWake(reason: String, payload: String?, remaining: Double?)
    /// A scheduled request launched; its work is the task `taskID`.
    case launchTask(identifier: String, kind: String, taskID: Int, remaining: Double?)
}

/// A call the library makes on its own (not on behalf of a caller).
enum DaemonCall: Equatable {
    case finishBackgroundTransition
    case endTask(Int)
    case finishWake
}

/// The library's state as a value, like the daemon's model: what the daemon last said, the
/// tasks and their handlers, the background transition, and reconnection. Every change takes
/// the monotonic instant it happens at (`now`, nanoseconds) and returns what the library must
/// do; nothing here reads a clock, locks or does I/O. `Handler` is the expiration handler
/// (a closure in the library, a label in the tests).
struct ClientState<Handler> {
    enum Effect {
        /// Run the handler, on the application's queue.
        case runHandler(Handler, ExpirationReason)
        /// Tell the delegate, then report back with `backgroundDelegateReturned()`.
        case enterBackground
        /// Tell the delegate, then report back with `foregroundDelegateReturned()`.
        case enterForeground
        /// Tell the delegate of a wake; its completion handler reports `wakeCompleted()`.
        case wake(reason: String, payload: String?)
        /// Send this call, without waiting for its reply.
        case send(DaemonCall)
        /// Connect and subscribe again; report `reconnectFailed(at:)` if that fails.
        case reconnect
        /// Run the launch handler of `identifier` (BGTaskScheduler), then report the task
        /// with `begun(taskID, …)`.
        case launch(identifier: String, kind: String, taskID: Int)
    }

    struct Task {
        var name: String
        var handler: Handler?
        var granted = false
        /// The daemon ended it (denied, expired, or gone): `end` sends nothing.
        var finished = false
        /// The daemon went away while it was active: it may still hold it when it comes back.
        var orphaned = false
    }

    struct Transition {
        /// By when `FinishBackgroundTransition` goes out even if a grant is outstanding.
        var finishBy: Int64
        /// The delegate returned from `applicationDidEnterBackground(_:)`.
        var returned = false
    }

    /// A wake in progress: by when the library finishes it if the app has not, and whether
    /// the app's completion handler ran.
    struct Wake: Equatable {
        var finishBy: Int64
        var completed = false
    }

    /// How `end` went.
    enum Ending: Equatable {
        case unknown
        /// The daemon ended it already: nothing to send.
        case alreadyEnded
        case send
    }

    // The rules' numbers, shared with libbgtask (BGTaskProtocol.ClientRules).
    static var finishMargin: Int64 { ClientRules.finishMargin }
    static var reconnectDelays: ClosedRange<Int64> { ClientRules.reconnectFirst...ClientRules.reconnectMaximum }
    static var restartGrace: Int64 { ClientRules.restartGrace }
    static func nanoseconds(_ seconds: Double) -> Int64 { ClientRules.nanoseconds(seconds) }
    static var maximumEarlyEvents: Int { ClientRules.maximumEarlyEvents }
    static var maximumPendingEnds: Int { ClientRules.maximumPendingEnds }

    private(set) var connected = false
    private(set) var state: ApplicationState = .active
    /// Seconds left at a monotonic instant; `nil` is unlimited (foreground).
    private(set) var remaining: (seconds: Double, at: Int64)?
    private(set) var tasks: [Int: Task] = [:]
    private(set) var transition: Transition?
    private(set) var wake: Wake?
    /// Tasks ended while the daemon was away, to end once it is back (it may have kept them).
    private(set) var pendingEnds: [Int] = []
    private(set) var nextReconnect: Int64?
    /// When the handlers of orphaned tasks run, unless the daemon comes back first.
    private(set) var orphanDeadline: Int64?
    private var reconnectDelay = reconnectDelays.lowerBound
    /// Task events that arrived before `BeginTask` returned (they travel on another
    /// connection), by task id, oldest first; bounded.
    private var earlyEvents: [Int: [DaemonEvent]] = [:]
    private var earlyOrder: [Int] = []

    /// Seconds of background time left at `now`: unlimited in the foreground or while
    /// disconnected, never negative.
    func backgroundTimeRemaining(at now: Int64) -> Double {
        guard connected, let remaining else { return .greatestFiniteMagnitude }
        return max(0, remaining.seconds - Double(now - remaining.at) / 1e9)
    }

    /// The next instant `tick(at:)` has something to do.
    var nextDeadline: Int64? {
        [transition.flatMap { $0.returned ? $0.finishBy : nil }, wake?.finishBy, connected ? nil : nextReconnect,
         orphanDeadline].compactMap { $0 }.min()
    }

    // MARK: From the daemon

    mutating func receive(_ event: DaemonEvent, at now: Int64) -> [Effect] {
        switch event {
        case let .subscribed(state, remaining, held, expiring):
            connected = true
            nextReconnect = nil
            reconnectDelay = Self.reconnectDelays.lowerBound
            self.state = state == "foreground" ? .active : .background
            self.remaining = remaining.map { ($0, now) }
            // Back after a restart: the tasks the daemon kept go on, the others are gone;
            // those it warned while the library was away get their handlers now (once: a
            // handler that ran already is gone from its task).
            orphanDeadline = nil
            defer { pendingEnds = [] }
            let warned = expiring.flatMap { applyTaskEvent(.taskExpiring([$0], remaining: remaining ?? 0), to: $0) }
            return expireOrphans(keeping: held) + warned + pendingEnds.map { .send(.endTask($0)) }
        case let .didEnterBackground(remaining, timeout):
            state = .background
            self.remaining = remaining.map { ($0, now) }
            transition = Transition(finishBy: now + max(0, Self.nanoseconds(timeout) - Self.finishMargin))
            return [.enterBackground]
        case .willEnterForeground:
            state = .inactive  // as in UIKit, until the delegate returns
            remaining = nil
            transition = nil
            wake = nil
            return [.enterForeground]
        case let .taskGranted(id), let .taskDenied(id, _):
            return applyTaskEvent(event, to: id)
        case let .taskExpiring(ids, left):
            remaining = (left, now)
            return ids.flatMap { applyTaskEvent(event, to: $0) }
        case let .taskExpired(ids):
            return ids.flatMap { applyTaskEvent(event, to: $0) }
        case let .launchTask(identifier, kind, id, left):
            state = .background
            remaining = left.map { ($0, now) }
            return [.launch(identifier: identifier, kind: kind, taskID: id)]
        case let .didWake(reason, payload, left):
            state = .background
            remaining = left.map { ($0, now) }
            // Finished for the app just before the window ends if its handler never runs.
            wake = left.map { Wake(finishBy: now + max(0, Self.nanoseconds($0) - Self.finishMargin)) }
            return [.wake(reason: reason, payload: payload)]
        }
    }

    /// The app's completion handler ran: `FinishWake` goes out once no task begun is still
    /// waiting for its grant (or just before the window ends), as for the transition.
    mutating func wakeCompleted(at now: Int64) -> [Effect] {
        wake?.completed = true
        return tick(at: now)
    }

    /// Applies a task event, or keeps it until `begun` registers the task.
    private mutating func applyTaskEvent(_ event: DaemonEvent, to id: Int) -> [Effect] {
        guard var task = tasks[id] else {
            if earlyEvents[id] == nil { earlyOrder.append(id) }
            earlyEvents[id, default: []].append(event)
            if earlyOrder.count > Self.maximumEarlyEvents { earlyEvents[earlyOrder.removeFirst()] = nil }
            return []
        }
        var reason: ExpirationReason?
        switch event {
        case .taskGranted: task.granted = true
        case let .taskDenied(_, why): task.finished = true; reason = .denied(why)
        case let .taskExpiring(_, left): reason = .backgroundTimeExpiring(remaining: left)
        case .taskExpired: task.finished = true; reason = .backgroundTimeExpired
        default: break
        }
        defer { tasks[id] = task }
        guard let reason, let handler = task.handler else { return [] }
        task.handler = nil  // exactly once
        return [.runHandler(handler, reason)]
    }

    // MARK: From the app

    /// `BeginTask` returned `id`: the task is known, and the events that beat the reply apply.
    mutating func begun(_ id: Int, name: String, handler: Handler?, granted: Bool = false) -> [Effect] {
        tasks[id] = Task(name: name, handler: handler, granted: granted)
        earlyOrder.removeAll { $0 == id }
        return (earlyEvents.removeValue(forKey: id) ?? []).flatMap { applyTaskEvent($0, to: id) }
    }

    /// The app ends `id`: whether `EndTask` must go out.
    mutating func end(_ id: Int) -> Ending {
        guard let task = tasks.removeValue(forKey: id) else { return .unknown }
        return task.finished && !task.orphaned ? .alreadyEnded : .send
    }

    /// Whether ending `id` may let something due happen now: it is a task not yet granted, and
    /// a returned transition or a completed wake waits for such tasks (`tick`). Only then
    /// must whoever runs `tick` look again after the end; any other end changes nothing it
    /// would act on (its deadlines do not move).
    func endingSettles(_ id: Int) -> Bool {
        guard let task = tasks[id], !task.granted, !task.finished else { return false }
        return transition?.returned == true || wake?.completed == true
    }

    /// `EndTask` could not reach the daemon: it is sent once the daemon is back.
    mutating func endUndelivered(_ id: Int) {
        if pendingEnds.count < Self.maximumPendingEnds { pendingEnds.append(id) }
    }

    /// The delegate returned from `applicationDidEnterBackground(_:)`.
    mutating func backgroundDelegateReturned() {
        transition?.returned = true
    }

    /// The delegate returned from `applicationWillEnterForeground(_:)`.
    mutating func foregroundDelegateReturned() {
        if state == .inactive { state = .active }
    }

    // MARK: Time and the connection

    /// What is due at `now`: the transition's end, the orphans' handlers, a reconnection.
    mutating func tick(at now: Int64) -> [Effect] {
        var effects: [Effect] = []
        if let due = orphanDeadline, now >= due {
            orphanDeadline = nil
            effects += expireOrphans(keeping: nil)
        }
        if let transition, transition.returned {
            let waiting = tasks.values.contains { !$0.granted && !$0.finished }
            if !waiting || now >= transition.finishBy {
                self.transition = nil
                effects.append(.send(.finishBackgroundTransition))
            }
        }
        if let wake {
            let waiting = tasks.values.contains { !$0.granted && !$0.finished }
            if now >= wake.finishBy || (wake.completed && !waiting) {
                self.wake = nil
                effects.append(.send(.finishWake))
            }
        }
        if !connected, let due = nextReconnect, now >= due {
            nextReconnect = nil
            effects.append(.reconnect)
        }
        return effects
    }

    /// The subscription broke. Returns whether this is news (worth a log line). Outstanding
    /// tasks wait `daemonRestartGrace` for the daemon (it keeps them across a restart).
    mutating func lost(at now: Int64) -> Bool {
        let wasConnected = connected
        connected = false
        state = .active
        remaining = nil
        transition = nil
        if wasConnected {
            for (id, var task) in tasks where !task.finished {
                task.orphaned = true
                tasks[id] = task
            }
            if orphanDeadline == nil, tasks.values.contains(where: { $0.orphaned && !$0.finished }) {
                orphanDeadline = now + Self.restartGrace
            }
        }
        nextReconnect = now + reconnectDelay
        return wasConnected
    }

    /// A reconnection failed: the next one waits twice as long, up to a second.
    mutating func reconnectFailed(at now: Int64) {
        reconnectDelay = min(reconnectDelay * 2, Self.reconnectDelays.upperBound)
        nextReconnect = now + reconnectDelay
    }

    /// Handlers, with `.daemonUnavailable`, of orphaned tasks the daemon does not hold:
    /// `held` is what it said it holds on resubscribing, `nil` while it has not come back (its
    /// tasks stay orphaned then: ending one sends `EndTask` once it is back, as it may hold it).
    private mutating func expireOrphans(keeping held: Set<Int>?) -> [Effect] {
        var effects: [Effect] = []
        for (id, var task) in tasks.sorted(by: { $0.key < $1.key }) where task.orphaned {
            let kept = held?.contains(id)
            if kept != nil { task.orphaned = false }
            if kept == true {
                task.finished = false  // it goes on, even if its handler ran while the daemon was away
            } else if !task.finished {
                task.finished = true
                if let handler = task.handler { effects.append(.runHandler(handler, .daemonUnavailable)) }
                task.handler = nil
            }
            tasks[id] = task
        }
        return effects
    }
}

extension DaemonEvent {
    /// The event in a Subscribe reply; `nil` for events this library does not know. Times
    /// are read within [0, a day]; a warning without one means 0 s (the time is up).
    init?(_ parameters: [String: JSON]) {
        let remaining = parameters[Field.backgroundTimeRemaining]?.doubleValue.map(ClientRules.seconds)
        let ids = (parameters[Field.taskIds]?.arrayValue ?? []).compactMap(\.intValue).map(Int.init)
        let id = parameters[Field.taskId]?.intValue.map(Int.init)
        guard let name = parameters[Field.event]?.stringValue.flatMap(EventName.init(rawValue:)) else { return nil }
        switch name {
        case .subscribed:
            self = .subscribed(state: parameters[Field.state]?.stringValue ?? "foreground", remaining: remaining,
                               held: Set(ids),
                               expiring: (parameters[Field.expiringTaskIds]?.arrayValue ?? []).compactMap(\.intValue).map(Int.init))
        case .didEnterBackground:
            self = .didEnterBackground(remaining: remaining,
                                       transitionTimeout: parameters[Field.transitionTimeout]?.doubleValue ?? 0)
        case .willEnterForeground: self = .willEnterForeground
        case .taskGranted: guard let id else { return nil }; self = .taskGranted(id)
        case .taskDenied:
            guard let id else { return nil }
            self = .taskDenied(id, reason: parameters[Field.reason]?.stringValue ?? "denied")
        case .taskExpiring: self = .taskExpiring(ids, remaining: remaining ?? 0)
        case .taskExpired: self = .taskExpired(ids)
        case .launchTask:
            guard let id, let identifier = parameters[Field.identifier]?.stringValue else { return nil }
            self = .launchTask(identifier: identifier, kind: parameters[Field.kind]?.stringValue ?? "refresh", taskID: id,
                               remaining: remaining)
        case .didWake:
            // A payload is an object; anything else is none (as libbgtask reads it).
            let payload = parameters[Field.payload].flatMap { value -> String? in
                if case .object = value { value.serialized } else { nil }
            }
            self = .didWake(reason: parameters[Field.reason]?.stringValue ?? "", payload: payload, remaining: remaining)
        }
    }
}

extension ClientState.Effect: Equatable where Handler: Equatable {}
