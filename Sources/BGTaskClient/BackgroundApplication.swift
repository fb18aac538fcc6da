import BGTaskSystem
import Foundation
import Varlink

/// The app's side of bgtaskd, with UIKit's background-task API:
///
/// ```swift
/// let app = try BackgroundApplication()          // connects and subscribes
/// app.delegate = self
/// let id = app.beginBackgroundTask(withName: "upload") { /* expiration */ }
/// app.endBackgroundTask(id)
/// app.backgroundTimeRemaining                    // .greatestFiniteMagnitude in the foreground
/// ```
///
/// Every method may be called from any thread. The delegate, the expiration handlers and
/// the notifications run on `queue` (main by default, which needs a running main queue:
/// `dispatchMain()` or a run loop). If bgtaskd goes away, calls fail at once (`.invalid`)
/// and the library reconnects and resubscribes by itself. bgtaskd keeps its tasks across
/// a restart, so outstanding tasks wait `daemonRestartGrace` for it to come back: those it
/// still holds go on; the expiration handlers of the others (or of all, if it does not
/// come back in time) run with `.daemonUnavailable`.
public final class BackgroundApplication: @unchecked Sendable {
    /// Posted on `NotificationCenter.default` after `applicationDidEnterBackground(_:)`.
    public static let didEnterBackgroundNotification = Notification.Name("BackgroundApplicationDidEnterBackground")
    /// Posted on `NotificationCenter.default` after `applicationWillEnterForeground(_:)`.
    public static let willEnterForegroundNotification = Notification.Name("BackgroundApplicationWillEnterForeground")

    /// Where the daemon is.
    public let socketPath: String
    /// Where the delegate, handlers and notifications run.
    public let queue: DispatchQueue
    /// How long a call may take before it fails (it never hangs).
    public var callTimeout: TimeInterval = 5
    /// How long outstanding tasks wait for bgtaskd to come back before their expiration
    /// handlers run with `.daemonUnavailable` (systemd restarts it within a second).
    public static let daemonRestartGrace: TimeInterval = 3
    /// Where the library's log lines go (UIKit logs to the console); default stderr.
    public static var logHandler: @Sendable (String) -> Void {
        get { log.withLock { $0 } }
        set { log.withLock { $0 = newValue } }
    }
    private static let log = Locked<@Sendable (String) -> Void>({ line in
        FileHandle.standardError.write(Data("BackgroundApplication: \(line)\n".utf8))
    })

    struct TaskEntry {
        var name: String
        var handler: (@Sendable (ExpirationReason) -> Void)?
        var granted = false
        /// The daemon ended it (denied, expired, or gone): `endBackgroundTask` is quiet.
        var finished = false
        /// The daemon went away while it was active: it may still hold it when it comes back.
        var orphaned = false
    }

    struct Transition {
        /// Monotonic nanoseconds by which `FinishBackgroundTransition` must be sent.
        var finishBy: Int64
        var returned = false
    }

    struct State {
        var connected = false
        var appState = "foreground"
        /// Remaining seconds at a monotonic instant; `nil` is unlimited (foreground).
        var remaining: (seconds: Double, at: Int64)?
        var tasks: [Int: TaskEntry] = [:]
        /// Task events that arrived before `BeginTask` returned (they travel on another
        /// connection), by task id; bounded.
        var earlyEvents: [Int: [EventThread.TaskEvent]] = [:]
        var earlyOrder: [Int] = []
        var transition: Transition?
        /// Tasks ended while the daemon was away, to end once it is back (it may have kept them).
        var pendingEnds: [Int] = []
        var delegate: Confined<() -> BackgroundApplicationDelegate?> = Confined(value: { nil })
        var closed = false
    }

    let state = Locked(State())
    /// The connection for calls; one call at a time.
    let calls = Locked<VarlinkConnection?>(nil)
    let events: EventThread

    /// The app's delegate (held weakly, like UIKit's).
    public var delegate: BackgroundApplicationDelegate? {
        get { state.withLock { $0.delegate.value() } }
        set {
            weak let weakDelegate = newValue
            state.withLock { $0.delegate = Confined(value: { weakDelegate }) }
        }
    }

    /// Connects to bgtaskd (`socketPath`, else `$BGTASKD_SOCKET`, else the system socket) and
    /// subscribes to this process's app. Throws if the daemon cannot be reached.
    public init(socketPath: String? = nil, queue: DispatchQueue = .main) throws {
        self.socketPath = DaemonSocket.path(explicit: socketPath)
        self.queue = queue
        events = EventThread()
        let subscription = try Self.subscribe(at: self.socketPath)
        // Subscribed before returning, so the first call finds the app connected.
        let first = try VarlinkConnection.check(try subscription.receive(timeoutMilliseconds: 5000))
        guard first["event"]?.stringValue == "subscribed" else {
            throw ClientError(.protocolError, "bgtaskd answered Subscribe with \(JSON.object(first).serialized)")
        }
        events.handle(first, self)
        events.start(application: self, subscription: subscription)
    }

    /// Stops listening and closes the connections. Outstanding handlers do not run.
    public func close() {
        state.withLock { $0.closed = true }
        events.wake()
        calls.withLock { connection in
            connection?.close()
            connection = nil
        }
    }

    // MARK: Background tasks

    /// Begins a background task, like UIKit's. Returns at once: the grant follows after the
    /// daemon's latency. `.invalid` when refused (no background time left, a limit, or no
    /// daemon). The handler runs exactly once, on `queue`, if the task expires, is denied, or
    /// the daemon goes away — unless the task was ended first.
    @discardableResult
    public func beginBackgroundTask(withName name: String? = nil,
                                    expirationHandler: @escaping @Sendable (ExpirationReason) -> Void) -> BackgroundTaskIdentifier {
        begin(name, expirationHandler)
    }

    /// UIKit's handler shape: not told why.
    @discardableResult
    public func beginBackgroundTask(withName name: String? = nil,
                                    expirationHandler: (@Sendable () -> Void)? = nil) -> BackgroundTaskIdentifier {
        begin(name, expirationHandler.map { handler in { @Sendable (_: ExpirationReason) in handler() } })
    }

    func begin(_ name: String?, _ expirationHandler: (@Sendable (ExpirationReason) -> Void)?) -> BackgroundTaskIdentifier {
        let reply: [String: JSON]
        do {
            reply = try call("BeginTask", ["name": .string(name ?? ""), "expirationHandler": .bool(expirationHandler != nil)])
        } catch {
            Self.emit("Background task \(name.map { "'\($0)'" } ?? "(unnamed)") refused: \(error)")
            return .invalid
        }
        guard let id = reply["taskId"]?.intValue.map(Int.init), id > 0 else { return .invalid }
        let early = state.withLock { state -> [EventThread.TaskEvent] in
            state.tasks[id] = TaskEntry(name: name ?? "", handler: expirationHandler)
            return state.earlyEvents.removeValue(forKey: id) ?? []
        }
        for event in early { events.applyTaskEvent(event, to: id, self) }
        return BackgroundTaskIdentifier(rawValue: id)
    }

    /// Ends a task. Idempotent; ending an unknown or invalid id only logs, as UIKit does.
    public func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        guard identifier != .invalid else {
            Self.emit("Can't end background task \(identifier): it is .invalid")
            return
        }
        guard let entry = state.withLock({ $0.tasks.removeValue(forKey: identifier.rawValue) }) else {
            Self.emit("Can't end background task \(identifier): no such task (already ended?)")
            return
        }
        if entry.finished, !entry.orphaned { return }  // the daemon already ended it
        end(identifier.rawValue)
        events.wake()  // the transition may have been waiting on it
    }

    /// Sends `EndTask`; while the daemon is away, remembers to once it is back.
    func end(_ id: Int) {
        do {
            _ = try call("EndTask", ["taskId": .int(Int64(id))])
        } catch let error as ClientError where error.code != .callFailed {
            state.withLock { state in
                if state.pendingEnds.count < Self.maximumPendingEnds { state.pendingEnds.append(id) }
            }
        } catch {
            if (error as? ClientError)?.varlinkError?.name != "io.bgtaskd.App.NoSuchTask" {
                Self.emit("Ending background task \(id) failed: \(error)")
            }
        }
    }

    static let maximumPendingEnds = 4096

    /// Seconds of background time left: `.greatestFiniteMagnitude` in the foreground (or
    /// while disconnected), never negative.
    public var backgroundTimeRemaining: TimeInterval {
        state.withLock { state in
            guard state.connected, let remaining = state.remaining else { return .greatestFiniteMagnitude }
            let elapsed = Double(Clock.monotonicNanoseconds() - remaining.at) / 1e9
            return max(0, remaining.seconds - elapsed)
        }
    }

    /// `foreground`, `background` or `suspended`, as last reported by the daemon.
    public var applicationState: String { state.withLock { $0.appState } }

    /// Whether the library is connected to bgtaskd now.
    public var isConnected: Bool { state.withLock { $0.connected } }

    /// Runs `body` under a background task that always ends, whatever happens. When the
    /// task's time expires (or it is denied, or the daemon goes away) the Swift task running
    /// `body` is cancelled. Throws `ClientError` if no task could be begun.
    public func withBackgroundTask<T: Sendable>(named name: String,
                                                _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let work = Task { try await body() }
        let id = beginBackgroundTask(withName: name) { (_: ExpirationReason) in work.cancel() }
        guard id != .invalid else {
            work.cancel()
            throw ClientError(.callFailed, "no background task could be begun for '\(name)'")
        }
        defer { endBackgroundTask(id) }
        return try await withTaskCancellationHandler {
            try await work.value
        } onCancel: {
            work.cancel()
        }
    }

    // MARK: Internals

    static func emit(_ line: String) {
        logHandler(line)
    }

    static func subscribe(at path: String) throws -> VarlinkConnection {
        let connection = try VarlinkConnection(path: path)
        try connection.send(VarlinkCall(method: "io.bgtaskd.App.Subscribe", more: true))
        return connection
    }

    /// One `io.bgtaskd.App` call on the call connection, connecting it if needed. Fails at
    /// once while the subscription is down.
    func call(_ member: String, _ parameters: [String: JSON] = [:]) throws -> [String: JSON] {
        guard state.withLock({ $0.connected }) else {
            throw ClientError(.notConnected, "not connected to bgtaskd at \(socketPath)")
        }
        let timeout = Int32(max(1, callTimeout * 1000))
        return try calls.withLock { connection in
            if connection == nil { connection = try VarlinkConnection(path: socketPath) }
            do {
                return try connection!.call("io.bgtaskd.App.\(member)", parameters, timeoutMilliseconds: timeout)
            } catch let error as ClientError where error.code != .callFailed {
                connection?.close()
                connection = nil  // broken or out of step: start afresh next time
                throw error
            }
        }
    }

    /// Runs `work` on the application's queue.
    func onQueue(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
}
