// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
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
    /// How long a call may take before it fails (it never hangs). Set from any thread, as
    /// every method here may be called (a plain stored property was a data race with a call
    /// reading it on another).
    public var callTimeout: TimeInterval {
        get { callTimeoutBox.withLock { $0 } }
        set { callTimeoutBox.withLock { $0 = newValue } }
    }
    private let callTimeoutBox = Locked<TimeInterval>(5)
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

    typealias Client = ClientState<@Sendable (ExpirationReason) -> Void>

    struct Shared {
        var client = Client()
        var closed = false
    }

    let state = Locked(Shared())
    /// The connection for the app's calls; one call at a time.
    private let calls = Locked<VarlinkConnection?>(nil)
    private let delegateBox = Locked(Confined<() -> BackgroundApplicationDelegate?>(value: { nil }))
    let events: EventThread

    /// The app's delegate (held weakly, like UIKit's).
    public var delegate: BackgroundApplicationDelegate? {
        get { delegateReference.value() }
        set {
            weak let weakDelegate = newValue
            delegateBox.withLock { $0 = Confined(value: { weakDelegate }) }
        }
    }

    var delegateReference: Confined<() -> BackgroundApplicationDelegate?> { delegateBox.withLock { $0 } }

    /// Connects to bgtaskd (`socketPath`, else `$BGTASKD_SOCKET`, else the per-user socket where
    /// a daemon answers, else the system socket: `DaemonSocket.path`) and
    /// subscribes to this process's app. Throws if the daemon cannot be reached.
    public init(socketPath: String? = nil, queue: DispatchQueue = .main) throws {
        self.socketPath = DaemonSocket.path(explicit: socketPath)
        self.queue = queue
        events = try EventThread()
        let subscription = try Self.subscribe(at: self.socketPath)
        // Subscribed before returning, so the first call finds the app connected.
        let first = try VarlinkConnection.check(try subscription.receive(timeoutMilliseconds: 5000))
        guard first["event"]?.stringValue == "subscribed" else {
            throw ClientError(.protocolError, "bgtaskd answered Subscribe with \(JSON.object(first).serialized)")
        }
        events.handle(first, self)
        events.start(application: self, subscription: subscription)
        Self.currentBox.withLock { $0 = Weak(value: self) }
    }

    private struct Weak: @unchecked Sendable { weak var value: BackgroundApplication? }
    private static let currentBox = Locked(Weak(value: nil))
    /// The application created last, while it lives: what `BGTaskScheduler.shared` uses.
    static var current: BackgroundApplication? { currentBox.withLock { $0.value } }

    /// Stops listening and closes the connections. Outstanding handlers do not run.
    public func close() {
        state.withLock { $0.closed = true }
        events.wake()
        dropCallConnection()
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
            reply = try call(.beginTask, ["name": .string(name ?? ""), "expirationHandler": .bool(expirationHandler != nil)])
        } catch {
            Self.emit("Background task \(name.map { "'\($0)'" } ?? "(unnamed)") refused: \(error)")
            return .invalid
        }
        guard let id = reply["taskId"]?.intValue.map(Int.init), id > 0 else { return .invalid }
        let granted = reply[Field.state]?.stringValue == "granted"
        let early = state.withLock { $0.client.begun(id, name: name ?? "", handler: expirationHandler, granted: granted) }
        if !early.isEmpty { events.post(early) }
        return BackgroundTaskIdentifier(rawValue: id)
    }

    /// Ends a task. Idempotent; ending an unknown or invalid id only logs, as UIKit does.
    public func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        guard identifier != .invalid else {
            Self.emit("Can't end background task \(identifier): it is .invalid")
            return
        }
        // Asked before the end, which forgets the task (tuple elements are evaluated in order).
        let (settles, ending) = state.withLock { state in
            (state.client.endingSettles(identifier.rawValue), state.client.end(identifier.rawValue))
        }
        switch ending {
        case .unknown:
            Self.emit("Can't end background task \(identifier): no such task (already ended?)")
        case .alreadyEnded:
            break
        case .send:
            end(identifier.rawValue)
            // The event thread looks again only if the transition (or a wake) was waiting on
            // this task: waking it for every end cost a pipe write, its read and poll, and a
            // context switch per task.
            if settles { events.wake() }
        }
    }

    /// Sends `EndTask`; while the daemon is away, remembers to once it is back.
    private func end(_ id: Int) {
        do {
            _ = try call(.endTask, [Field.taskId: .int(Int64(id))])
        } catch let error as ClientError where error.code != .callFailed {
            state.withLock { $0.client.endUndelivered(id) }
        } catch let error as ClientError where ErrorName.noSuchTask.matches(error.varlinkError) {
            // ended meanwhile (expired, or by the daemon)
        } catch {
            Self.emit("Ending background task \(id) failed: \(error)")
        }
    }

    /// Seconds of background time left: `.greatestFiniteMagnitude` in the foreground (or
    /// while disconnected), never negative.
    public var backgroundTimeRemaining: TimeInterval {
        state.withLock { $0.client.backgroundTimeRemaining(at: Clock.monotonicNanoseconds()) }
    }

    /// `.active` in the foreground (and while disconnected), `.background` in the background,
    /// `.inactive` while `applicationWillEnterForeground(_:)` runs; as last reported by bgtaskd.
    public var applicationState: State { state.withLock { $0.client.state } }

    /// Why the app was last woken (`Manager.Wake`'s `reason`), for the fetch and
    /// remote-notification delegate methods; `nil` before any wake.
    public var wakeReason: String? { wakeReasonBox.withLock { $0 } }
    let wakeReasonBox = Locked<String?>(nil)

    /// Whether the library is connected to bgtaskd now.
    public var isConnected: Bool { state.withLock { $0.client.connected } }

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

    static func subscribe(at path: String, nonBlocking: Bool = false) throws -> VarlinkConnection {
        let connection = try VarlinkConnection(path: path, nonBlocking: nonBlocking)
        try connection.send(VarlinkCall(.subscribe, more: true))
        return connection
    }

    /// One `io.bgtaskd.App` call on the call connection, connecting it if needed. Fails at
    /// once while the subscription is down.
    func call(_ method: AppMethod, _ parameters: [String: JSON] = [:]) throws -> [String: JSON] {
        guard isConnected else {
            throw ClientError(.notConnected, "not connected to bgtaskd at \(socketPath)")
        }
        let timeout = Int32(max(1, callTimeout * 1000))
        return try calls.withLock { connection in
            let current = try connection ?? VarlinkConnection(path: socketPath)
            connection = current
            do {
                return try current.call(.app(method), parameters, timeoutMilliseconds: timeout)
            } catch let error as ClientError where error.code != .callFailed {
                current.close()
                connection = nil  // broken or out of step: start afresh next time
                throw error
            }
        }
    }

    /// Closes the call connection (the daemon went away, or the app closed).
    func dropCallConnection() {
        calls.withLock { connection in
            connection?.close()
            connection = nil
        }
    }

    /// Runs `work` on the application's queue.
    func onQueue(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }
}
