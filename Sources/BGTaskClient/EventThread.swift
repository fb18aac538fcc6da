import BGTaskSystem
import Foundation
import Varlink

/// The library's one thread: it follows the Subscribe stream, applies lifecycle and task
/// events, reports the background transition finished, and reconnects when bgtaskd goes
/// away. It blocks only in `poll`, with a timeout at its next deadline.
final class EventThread: @unchecked Sendable {
    enum TaskEvent {
        case granted
        case denied(String)
        case expiring(Double)
        case expired
    }

    /// How early, before the daemon's transition deadline, `FinishBackgroundTransition` is
    /// sent when a grant is still outstanding (the event reached us a little late).
    static let finishMargin: Int64 = 25_000_000
    static let reconnectDelays: ClosedRange<Int64> = 50_000_000...1_000_000_000
    static let maximumEarlyEvents = 256

    // Touched only on the thread once started.
    private var subscription: VarlinkConnection?
    private var reconnectDelay = EventThread.reconnectDelays.lowerBound
    private var nextReconnect: Int64?
    /// When the handlers of tasks orphaned by a lost daemon run, unless it comes back first.
    private var orphanDeadline: Int64?
    private let wakeRead: FileDescriptor
    private let wakeWrite: FileDescriptor

    init() {
        let (read, write) = try! Subprocess.pipe()
        try? read.setNonBlocking()
        try? write.setNonBlocking()
        wakeRead = read
        wakeWrite = write
    }

    func start(application: BackgroundApplication, subscription: VarlinkConnection) {
        self.subscription = subscription
        let thread = Thread { [self] in self.run(application) }
        thread.name = "BackgroundApplication"
        thread.start()
    }

    /// Makes the thread look at its state again.
    func wake() { _ = try? wakeWrite.write([1]) }

    private func run(_ app: BackgroundApplication) {
        while !app.state.withLock({ $0.closed }) {
            let now = Clock.monotonicNanoseconds()
            let finishBy = app.state.withLock { $0.transition.flatMap { $0.returned ? $0.finishBy : nil } }
            let deadlines = [finishBy, subscription == nil ? nextReconnect : nil, orphanDeadline].compactMap { $0 }
            let timeout = deadlines.min().map { Int32(max(0, min(60_000, ($0 - now + 999_999) / 1_000_000))) } ?? -1
            var descriptors = [wakeRead.rawValue]
            if let subscription { descriptors.append(subscription.fileDescriptor) }
            let ready = (try? waitReadable(descriptors, timeoutMilliseconds: timeout)) ?? []
            if ready.contains(0) { _ = try? wakeRead.readAvailable(upTo: 256) }
            if ready.contains(1), let stream = subscription { follow(stream, app) }
            if subscription == nil { reconnectIfDue(app) }
            if let due = orphanDeadline, Clock.monotonicNanoseconds() >= due {
                orphanDeadline = nil
                expireOrphans(app, keeping: [])
            }
            finishTransitionIfDue(app)
        }
        subscription?.close()
    }

    /// Reads every reply waiting on the subscription.
    private func follow(_ stream: VarlinkConnection, _ app: BackgroundApplication) {
        repeat {
            do {
                let reply = try stream.receive(timeoutMilliseconds: 0)
                guard reply.error == nil, reply.continues else {
                    return disconnected(app, why: reply.error ?? "the subscription ended")
                }
                handle(reply.parameters, app)
            } catch {
                return disconnected(app, why: "\(error)")
            }
        } while stream.hasBufferedReply
    }

    func handle(_ event: [String: JSON], _ app: BackgroundApplication) {
        let now = Clock.monotonicNanoseconds()
        let remaining = event["backgroundTimeRemaining"]?.doubleValue
        switch event["event"]?.stringValue {
        case "subscribed"?:
            reconnectDelay = Self.reconnectDelays.lowerBound
            let pendingEnds = app.state.withLock { state in
                state.connected = true
                state.appState = event["state"]?.stringValue ?? "foreground"
                state.remaining = remaining.map { ($0, now) }
                defer { state.pendingEnds = [] }
                return state.pendingEnds
            }
            // Back after a restart: the tasks the daemon kept go on, the others are gone.
            orphanDeadline = nil
            let held = Set((event["taskIds"]?.arrayValue ?? []).compactMap(\.intValue).map(Int.init))
            expireOrphans(app, keeping: held)
            for id in pendingEnds { app.end(id) }
        case "didEnterBackground"?:
            let timeout = Int64((event["transitionTimeout"]?.doubleValue ?? 0) * 1e9)
            let delegate = app.state.withLock { state in
                state.appState = "background"
                state.remaining = (remaining ?? 0, now)
                state.transition = BackgroundApplication.Transition(finishBy: now + max(0, timeout - Self.finishMargin))
                return state.delegate
            }
            app.onQueue { [weak self] in
                delegate.value()?.applicationDidEnterBackground(app)
                NotificationCenter.default.post(name: BackgroundApplication.didEnterBackgroundNotification, object: app)
                // Returning from the handler reports the transition finished (once the
                // grants of tasks begun in it are in, or just before the deadline).
                app.state.withLock { $0.transition?.returned = true }
                self?.wake()
            }
        case "willEnterForeground"?:
            let delegate = app.state.withLock { state in
                state.appState = "foreground"
                state.remaining = nil
                state.transition = nil
                return state.delegate
            }
            app.onQueue {
                delegate.value()?.applicationWillEnterForeground(app)
                NotificationCenter.default.post(name: BackgroundApplication.willEnterForegroundNotification, object: app)
            }
        case "taskGranted"?:
            if let id = event["taskId"]?.intValue { applyTaskEvent(.granted, to: Int(id), app) }
        case "taskDenied"?:
            if let id = event["taskId"]?.intValue {
                applyTaskEvent(.denied(event["reason"]?.stringValue ?? "denied"), to: Int(id), app)
            }
        case "taskExpiring"?:
            app.state.withLock { $0.remaining = (remaining ?? 0, now) }
            for id in event["taskIds"]?.arrayValue?.compactMap(\.intValue) ?? [] {
                applyTaskEvent(.expiring(remaining ?? 0), to: Int(id), app)
            }
        case "taskExpired"?:
            for id in event["taskIds"]?.arrayValue?.compactMap(\.intValue) ?? [] {
                applyTaskEvent(.expired, to: Int(id), app)
            }
        default:
            break
        }
    }

    /// Applies a task event, or keeps it until `BeginTask`'s reply registers the task (the
    /// reply and the event travel on different connections).
    func applyTaskEvent(_ event: TaskEvent, to id: Int, _ app: BackgroundApplication) {
        let due = app.state.withLock { state -> (handler: @Sendable (ExpirationReason) -> Void, reason: ExpirationReason)? in
            guard var entry = state.tasks[id] else {
                if state.earlyEvents[id] == nil { state.earlyOrder.append(id) }
                state.earlyEvents[id, default: []].append(event)
                if state.earlyOrder.count > Self.maximumEarlyEvents {
                    state.earlyEvents[state.earlyOrder.removeFirst()] = nil
                }
                return nil
            }
            var reason: ExpirationReason?
            switch event {
            case .granted: entry.granted = true
            case let .denied(why): entry.finished = true; reason = .denied(why)
            case let .expiring(left): reason = .backgroundTimeExpiring(remaining: left)
            case .expired: entry.finished = true; reason = .backgroundTimeExpired
            }
            defer { state.tasks[id] = entry }
            guard let reason, let handler = entry.handler else { return nil }
            entry.handler = nil  // exactly once
            return (handler, reason)
        }
        if let due { app.onQueue { due.handler(due.reason) } }
        wake()
    }

    /// Sends `FinishBackgroundTransition` once the delegate returned and no task begun is
    /// still waiting for its grant — or when the deadline leaves no more time to wait.
    private func finishTransitionIfDue(_ app: BackgroundApplication) {
        let now = Clock.monotonicNanoseconds()
        let due = app.state.withLock { state -> Bool in
            guard let transition = state.transition, transition.returned else { return false }
            let waiting = state.tasks.values.contains { !$0.granted && !$0.finished }
            guard !waiting || now >= transition.finishBy else { return false }
            state.transition = nil
            return true
        }
        if due { _ = try? app.call("FinishBackgroundTransition") }
    }

    /// The daemon went away: reconnection starts, and outstanding tasks wait
    /// `daemonRestartGrace` for it (it keeps them across a restart).
    private func disconnected(_ app: BackgroundApplication, why: String) {
        subscription?.close()
        subscription = nil
        let orphaned = app.state.withLock { state -> Int in
            let wasConnected = state.connected
            state.connected = false
            state.appState = "foreground"
            state.remaining = nil
            state.transition = nil
            guard wasConnected else { return 0 }
            var orphaned = 0
            for (id, var entry) in state.tasks where !entry.finished {
                entry.orphaned = true
                state.tasks[id] = entry
                orphaned += 1
            }
            return orphaned
        }
        app.calls.withLock { connection in
            connection?.close()
            connection = nil
        }
        if orphaned > 0 || nextReconnect == nil {
            BackgroundApplication.emit("Lost bgtaskd (\(why)); reconnecting")
        }
        if orphaned > 0, orphanDeadline == nil {
            orphanDeadline = Clock.monotonicNanoseconds() + Int64(BackgroundApplication.daemonRestartGrace * 1e9)
        }
        nextReconnect = Clock.monotonicNanoseconds() + reconnectDelay
    }

    /// Runs, with `.daemonUnavailable`, the handlers of orphaned tasks the daemon does not
    /// hold (`held`: what it said it holds on resubscribing; empty when it did not come back).
    private func expireOrphans(_ app: BackgroundApplication, keeping held: Set<Int>) {
        let handlers = app.state.withLock { state -> [@Sendable (ExpirationReason) -> Void] in
            var handlers: [@Sendable (ExpirationReason) -> Void] = []
            for (id, var entry) in state.tasks where entry.orphaned && !entry.finished {
                if held.contains(id) {
                    entry.orphaned = false
                } else {
                    entry.finished = true
                    if let handler = entry.handler { handlers.append(handler) }
                    entry.handler = nil
                }
                state.tasks[id] = entry
            }
            return handlers
        }
        for handler in handlers { app.onQueue { handler(.daemonUnavailable) } }
    }

    private func reconnectIfDue(_ app: BackgroundApplication) {
        guard let due = nextReconnect, Clock.monotonicNanoseconds() >= due else { return }
        do {
            subscription = try BackgroundApplication.subscribe(at: app.socketPath)
            nextReconnect = nil
        } catch {
            reconnectDelay = min(reconnectDelay * 2, Self.reconnectDelays.upperBound)
            nextReconnect = Clock.monotonicNanoseconds() + reconnectDelay
        }
    }
}
