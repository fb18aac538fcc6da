// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// `io.bgtaskd.App`: an app's calls about itself. The caller is registered as an app on its
/// first call (Endpoint+Caller).
extension Daemon {
    func appCall(_ method: AppMethod, _ call: VarlinkCall, on connection: Connection, at now: Instant,
                 effects: inout [Effect]) throws -> VarlinkReply {
        // A read changes nothing, so a full disk refuses it only for a caller not yet an app
        // (its registration would be a change).
        if !method.reads { try requireWritableState() }
        let process = try caller(of: connection)
        let app = try callingApp(process, on: connection, at: now, effects: &effects)
        switch method {
        case .subscribe:
            _ = try Parameters(call.parameters, allowed: [])
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
        case .beginTask:
            let parameters = try Parameters(call.parameters, allowed: ["name", "expirationHandler"])
            let name = try TaskName.validate(try parameters.optionalString("name") ?? "")
            let handler = try parameters.optionalBool("expirationHandler") ?? false
            let streamed = call.more && !call.oneway
            let task = try model.beginTask(in: app, owner: process.identity, name: name, expirationHandler: handler,
                                           connection: streamed ? connection.id : nil, at: now, effects: &effects)
            if streamed {
                connection.stream = .task(task.id)
                taskStreams[task.id] = connection.id
            }
            return VarlinkReply(parameters: Wire.taskState(task), continues: streamed)
        case .endTask:
            let parameters = try Parameters(call.parameters, allowed: [Field.taskId])
            let id = try parameters.int(Field.taskId)
            // Not an id the daemon gives (0, negative): the error names the id it was given.
            guard let taskID = TaskID(exactly: id), taskID > 0 else { throw ErrorName.noSuchTask([Field.taskId: .int(id)]) }
            try model.endTask(taskID, in: app, at: now, effects: &effects)
            return VarlinkReply()
        case .getTimeRemaining:
            _ = try Parameters(call.parameters, allowed: [])
            let snapshot = model.snapshot(of: app, at: now)!
            return VarlinkReply(parameters: [
                Field.backgroundTimeRemaining: Wire.seconds(snapshot.backgroundTimeRemaining),
                Field.backgroundQuotaRemaining: Wire.seconds(snapshot.backgroundQuotaRemaining),
                Field.state: .string(snapshot.state.rawValue),
            ])
        case .finishBackgroundTransition:
            _ = try Parameters(call.parameters, allowed: [])
            model.finishTransition(of: app, at: now, effects: &effects)
            return VarlinkReply()
        case .finishWake:
            _ = try Parameters(call.parameters, allowed: [])
            model.finishWake(of: app, at: now, effects: &effects)
            return VarlinkReply()
        case .submitTaskRequest, .cancelTaskRequest, .cancelAllTaskRequests, .getPendingTaskRequests, .setTaskCompleted:
            return try requestCall(method, call, app: app, process: process, at: now, effects: &effects)
        }
    }
}
