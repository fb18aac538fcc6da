// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// `io.bgtaskd.App`: an app's calls about itself. The caller is registered as an app on its
/// first call (Endpoint+Caller).
extension Daemon {
    func appCall(_ method: AppMethod, _ call: VarlinkCall, on connection: Connection, at now: Instant,
                 effects: inout [Effect]) throws -> Answer {
        switch method {
        case .beginTask: return .hot(try hotCall(HotCall(.beginTask, general: call), on: connection, at: now, effects: &effects))
        case .endTask: return .hot(try hotCall(HotCall(.endTask, general: call), on: connection, at: now, effects: &effects))
        case .getTimeRemaining:
            return .hot(try hotCall(HotCall(.getTimeRemaining, general: call), on: connection, at: now, effects: &effects))
        case .subscribe, .finishBackgroundTransition, .finishWake:
            let (_, app) = try appCaller(of: connection, reads: method.reads, at: now, effects: &effects)
            return .reply(try lifecycleCall(method, call, on: connection, app: app, at: now, effects: &effects))
        case .submitTaskRequest, .cancelTaskRequest, .cancelAllTaskRequests, .getPendingTaskRequests, .setTaskCompleted:
            let (_, app) = try appCaller(of: connection, reads: method.reads, at: now, effects: &effects)
            return .reply(try requestCall(method, call, app: app, process: try caller(of: connection), at: now, effects: &effects))
        }
    }

    /// `Subscribe`, `FinishBackgroundTransition`, `FinishWake`.
    private func lifecycleCall(_ method: AppMethod, _ call: VarlinkCall, on connection: Connection, app: ProcessIdentity,
                               at now: Instant, effects: inout [Effect]) throws -> VarlinkReply {
        _ = try Parameters(call.parameters, allowed: [])
        switch method {
        case .subscribe:
            guard call.more else { throw VarlinkError.expectedMore }
            guard (subscribers[app]?.count ?? 0) < Self.maximumSubscribersPerApp else {
                throw BGTaskError.limitExceeded("\(Self.maximumSubscribersPerApp) subscriptions of app \(app.pid)")
            }
            model.subscribe(app)
            connection.stream = .subscription(app)
            subscribers[app, default: []].append(connection.id)
            let snapshot = model.snapshot(of: app, at: now)!
            let held = model.listTasks(of: app, at: now)
            return VarlinkReply(parameters: [
                Field.event: .string(EventName.subscribed.rawValue), "pid": .int(Int64(app.pid)),
                Field.state: .string(snapshot.state.rawValue), "phase": snapshot.phase.map { .string($0.rawValue) } ?? .null,
                Field.backgroundTimeRemaining: Wire.seconds(snapshot.backgroundTimeRemaining),
                // What the app holds now: after a daemon restart, what survived it; and which
                // of those were warned already (a client that was away missed taskExpiring).
                Field.taskIds: .array(held.map { .int(Int64($0.id)) }),
                Field.expiringTaskIds: .array(held.filter { $0.state == .expiring }.map { .int(Int64($0.id)) }),
            ], continues: true)
        case .finishBackgroundTransition:
            model.finishTransition(of: app, at: now, effects: &effects)
        case .finishWake:
            model.finishWake(of: app, at: now, effects: &effects)
        default:
            throw VarlinkError.methodNotFound(call.method)  // not a lifecycle method: never reached
        }
        return VarlinkReply()
    }
}
