// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import BGTaskSystem
import Dispatch
import Foundation
import Varlink

/// iOS's `BGTaskScheduler`, over bgtaskd's scheduled requests: an app asks to be launched
/// later to refresh (`BGAppRefreshTaskRequest`) or for deferrable work under conditions
/// (`BGProcessingTaskRequest`); bgtaskd wakes it when the request is due, its conditions hold
/// and the app is in the background or suspended, and the handler registered for the
/// identifier runs with a `BGTask`. Register before the first launch can arrive (before
/// creating the `BackgroundApplication`); requests go through the most recent one.
public final class BGTaskScheduler: @unchecked Sendable {
    public static let shared = BGTaskScheduler()

    /// UIKit's `BGTaskScheduler.Error`.
    public struct Error: Swift.Error, Equatable, CustomStringConvertible {
        public enum Code: Int, Sendable {
            /// No connection to bgtaskd (no `BackgroundApplication`, or the daemon is away).
            case unavailable = 1
            /// The app has as many requests of the kind pending as it may (1 refresh, 10 processing).
            case tooManyPendingTaskRequests = 2
            /// Refused: a bad identifier, interval or date, or a limit.
            case notPermitted = 3
        }
        public let code: Code
        public let message: String
        public var description: String { "BGTaskScheduler error \(code): \(message)" }
    }

    private struct Registration: Sendable {
        var queue: DispatchQueue?
        var handler: @Sendable (BGTask) -> Void
    }

    private let registrations = Locked<[String: Registration]>([:])
    private init() {}

    /// Registers the launch handler of `identifier` (once per identifier: false again, as
    /// UIKit). It runs on `queue`, else on the application's queue.
    @discardableResult
    public func register(forTaskWithIdentifier identifier: String, using queue: DispatchQueue?,
                         launchHandler: @escaping @Sendable (BGTask) -> Void) -> Bool {
        registrations.withLock { table in
            guard table[identifier] == nil else { return false }
            table[identifier] = Registration(queue: queue, handler: launchHandler)
            return true
        }
    }

    /// Submits `taskRequest`, replacing a pending one with its identifier.
    public func submit(_ taskRequest: BGTaskRequest) throws {
        let settings = taskRequest.settings.withLock { $0 }  // one consistent reading
        var parameters: [String: JSON] = [
            Field.identifier: .string(taskRequest.identifier), Field.kind: .string(taskRequest.kind),
            "earliestBeginDate": .double(max(0, settings.earliestBeginDate?.timeIntervalSinceNow ?? 0)),
        ]
        if taskRequest is BGProcessingTaskRequest {
            parameters["requiresExternalPower"] = .bool(settings.requiresExternalPower)
            parameters["requiresNetworkConnectivity"] = .bool(settings.requiresNetworkConnectivity)
        }
        if let interval = settings.interval { parameters["interval"] = .double(interval) }
        _ = try call(.submitTaskRequest, parameters)
    }

    public func cancel(taskRequestWithIdentifier identifier: String) {
        _ = try? call(.cancelTaskRequest, [Field.identifier: .string(identifier)])
    }

    public func cancelAllTaskRequests() {
        _ = try? call(.cancelAllTaskRequests, [:])
    }

    /// The pending requests, on the application's queue (none without a connection).
    public func getPendingTaskRequests(completionHandler: @escaping @Sendable ([BGTaskRequest]) -> Void) {
        let requests = ((try? call(.getPendingTaskRequests, [:]))?["requests"]?.arrayValue ?? []).compactMap(BGTaskRequest.from)
        let queue = BackgroundApplication.current?.queue ?? .main
        queue.async { completionHandler(requests) }
    }

    private func call(_ method: AppMethod, _ parameters: [String: JSON]) throws -> [String: JSON] {
        guard let app = BackgroundApplication.current else {
            throw Error(code: .unavailable, message: "no BackgroundApplication is connected to bgtaskd")
        }
        do {
            return try app.call(method, parameters)
        } catch let error as ClientError {
            switch error.varlinkError.flatMap(ErrorName.init) {
            case .tooManyPendingTaskRequests?: throw Error(code: .tooManyPendingTaskRequests, message: error.message)
            case nil where error.varlinkError == nil: throw Error(code: .unavailable, message: error.message)
            default: throw Error(code: .notPermitted, message: error.message)
            }
        }
    }

    /// A launch arrived: the task is the app's, its handler runs (or, none registered, it is
    /// completed as failed at once, and logged).
    func launch(_ identifier: String, kind: String, taskID: Int, in app: BackgroundApplication) -> (BGTask, () -> Void)? {
        let task: BGTask = kind == "processing" ? BGProcessingTask(identifier, taskID, app) : BGAppRefreshTask(identifier, taskID, app)
        guard let registration = registrations.withLock({ $0[identifier] }) else {
            BackgroundApplication.emit("No launch handler registered for '\(identifier)'; completed as failed")
            return (task, { app.queue.async { task.setTaskCompleted(success: false) } })  // a call: not on the event thread
        }
        return (task, {
            (registration.queue ?? app.queue).async { registration.handler(task) }
        })
    }
}

/// UIKit's `BGTaskRequest`: what to launch, and no earlier than when. Its properties may be
/// set and read from any thread (as UIKit's atomic ones): each is behind the request's lock.
public class BGTaskRequest: @unchecked Sendable, CustomStringConvertible {
    public let identifier: String
    /// What may change after `init`, under one lock.
    struct Settings {
        var earliestBeginDate: Date?
        var interval: TimeInterval?
        var requiresExternalPower = false
        var requiresNetworkConnectivity = false
    }
    let settings = Locked(Settings())

    /// No earlier than this; `nil`: as soon as possible. A date: the time the machine sleeps
    /// counts (a request due while it slept runs as it wakes), as does `interval`'s.
    public var earliestBeginDate: Date? {
        get { settings.withLock { $0.earliestBeginDate } }
        set { settings.withLock { $0.earliestBeginDate = newValue } }
    }
    /// Periodic: submitted again this long after each launch (at least 15 min). An addition.
    public var interval: TimeInterval? {
        get { settings.withLock { $0.interval } }
        set { settings.withLock { $0.interval = newValue } }
    }
    var kind: String { "refresh" }

    init(identifier: String) { self.identifier = identifier }

    /// A request as `GetPendingTaskRequests` lists it.
    static func from(_ value: JSON) -> BGTaskRequest? {
        guard let identifier = value[Field.identifier]?.stringValue else { return nil }
        let request: BGTaskRequest
        if value[Field.kind]?.stringValue == "processing" {
            let processing = BGProcessingTaskRequest(identifier: identifier)
            processing.requiresExternalPower = value["requiresExternalPower"]?.boolValue ?? false
            processing.requiresNetworkConnectivity = value["requiresNetworkConnectivity"]?.boolValue ?? false
            request = processing
        } else {
            request = BGAppRefreshTaskRequest(identifier: identifier)
        }
        request.earliestBeginDate = value["earliestBeginDate"]?.doubleValue.map { Date(timeIntervalSinceNow: ClientRules.seconds($0)) }
        request.interval = value["interval"]?.doubleValue
        return request
    }

    public var description: String { "\(kind) request \(identifier)" }
}

public final class BGAppRefreshTaskRequest: BGTaskRequest, @unchecked Sendable {
    public override init(identifier: String) { super.init(identifier: identifier) }
}

public final class BGProcessingTaskRequest: BGTaskRequest, @unchecked Sendable {
    public var requiresExternalPower: Bool {
        get { settings.withLock { $0.requiresExternalPower } }
        set { settings.withLock { $0.requiresExternalPower = newValue } }
    }
    public var requiresNetworkConnectivity: Bool {
        get { settings.withLock { $0.requiresNetworkConnectivity } }
        set { settings.withLock { $0.requiresNetworkConnectivity = newValue } }
    }
    override var kind: String { "processing" }
    public override init(identifier: String) { super.init(identifier: identifier) }
}

/// UIKit's `BGTask`: a launch. Set `expirationHandler` (it runs, once, when the window is
/// about to end: the launch's task is warned), and call `setTaskCompleted(success:)` when done.
public class BGTask: @unchecked Sendable {
    public let identifier: String
    let taskID: Int
    weak var app: BackgroundApplication?
    private let handler = Locked<(@Sendable () -> Void)?>(nil)
    private let completed = Locked(false)

    init(_ identifier: String, _ taskID: Int, _ app: BackgroundApplication) {
        self.identifier = identifier
        self.taskID = taskID
        self.app = app
    }

    public var expirationHandler: (@Sendable () -> Void)? {
        get { handler.withLock { $0 } }
        set { handler.withLock { $0 = newValue } }
    }

    /// The work is done: bgtaskd ends the launch (and suspends the app holding nothing else).
    public func setTaskCompleted(success: Bool) {
        guard completed.withLock({ done in defer { done = true }; return !done }), let app else { return }
        // Its handler will not run. Asked before the end, which forgets the task: whether a
        // returned transition (or a completed wake) waited for this task's grant, as for
        // `endBackgroundTask` (and `bgtask_set_task_completed`, which settles at once).
        let settles = app.state.withLock { state in
            let settles = state.client.endingSettles(taskID)
            _ = state.client.end(taskID)
            return settles
        }
        do {
            _ = try app.call(.setTaskCompleted, [Field.identifier: .string(identifier), "success": .bool(success)])
        } catch {
            BackgroundApplication.emit("Completing launch '\(identifier)' failed: \(error)")
        }
        if settles { app.events.wake() }
    }

    /// The launch's task is warned (or ended): its expiration handler, once.
    func expire() {
        handler.withLock { current in defer { current = nil }; return current }?()
    }
}

public final class BGAppRefreshTask: BGTask, @unchecked Sendable {}
public final class BGProcessingTask: BGTask, @unchecked Sendable {}
