// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// The hot methods (`HotCall`), however their call was decoded, and their replies written
/// straight into the connection's output (`HotReply`).
extension Daemon {
    func hotCall(_ call: HotCall, on connection: Connection, at now: Instant, effects: inout [Effect]) throws -> HotReply {
        switch call.fields {
        case let .beginTask(name, expirationHandler):
            let name = try TaskName.validate(name ?? "")
            let (process, app) = try appCaller(of: connection, reads: false, at: now, effects: &effects)
            let streamed = call.more && !call.oneway
            let task = try model.beginTask(in: app, owner: process, name: name,
                                           expirationHandler: expirationHandler ?? false,
                                           connection: streamed ? connection.id : nil, at: now, effects: &effects)
            if streamed {
                connection.stream = .task(task.id)
                taskStreams[task.id] = connection.id
            }
            return .task(task, continues: streamed)
        case let .endTask(id):
            // Not an id the daemon gives (0, negative): the error names the id it was given.
            guard let taskID = TaskID(exactly: id), taskID > 0 else { throw ErrorName.noSuchTask([Field.taskId: .int(id)]) }
            let (_, app) = try appCaller(of: connection, reads: false, at: now, effects: &effects)
            try model.endTask(taskID, in: app, at: now, effects: &effects)
            return .empty
        case .getTimeRemaining:
            let (_, app) = try appCaller(of: connection, reads: true, at: now, effects: &effects)
            return .timeRemaining(model.snapshot(of: app, at: now)!)
        case let .setAppState(target, state, reason):
            guard let state = AppState(rawValue: state), state == .foreground || state == .background else {
                throw VarlinkError.invalidParameter("state")
            }
            // Any text (escaped where printed), bounded.
            if let reason, reason.utf8.count > WakeReason.maximumReasonBytes { throw VarlinkError.invalidParameter("reason") }
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: true, at: now, effects: &effects)
            return .app(try model.setState(of: app, to: state, by: managerName(of: connection), reason: reason,
                                           at: now, effects: &effects))
        }
    }

    /// The caller of an App method and its app, registered on its first call. A read
    /// changes nothing, so a full disk refuses it only for a caller not yet an app (its
    /// registration would be a change).
    ///
    /// A caller that is its own app (the common case) is known as such while no app of its
    /// uid has been added, removed or made a unit app since (`BackgroundModel.appsGeneration(of:)`):
    /// the same process is found the same way, and it is watched as an app, so there is no
    /// pidfd to offer. Resolving it again was a copy of its description and three look-ups
    /// a call (~560 instructions, callgrind).
    func appCaller(of connection: Connection, reads: Bool, at now: Instant,
                   effects: inout [Effect]) throws -> (process: ProcessIdentity, app: ProcessIdentity) {
        if !reads { try requireWritableState() }
        if let own = connection.ownApp, own.generation == inPlace({ $0.appsGeneration(of: own.uid) }) {
            return (own.app, own.app)
        }
        let process = try caller(of: connection)
        let app = try callingApp(process, on: connection, at: now, effects: &effects)
        connection.ownApp = app == process.identity ? (app, process.uid, inPlace { $0.appsGeneration(of: process.uid) }) : nil
        return (process.identity, app)
    }
}

/// A hot method's reply. `write` puts the same text as `general` would (checked in debug
/// builds, which the tests run) without building its dictionary and sorting its keys.
/// Each case holds what its text shows, no more: a reply is handed up from the handler by
/// value, and a whole task or app snapshot in every case (168 bytes) was copied at each
/// step (~200 instructions of `memcpy` a call: callgrind).
enum HotReply {
    /// `BeginTask`, and a streamed task's changes: the task's id, state and reason;
    /// `continues` for a task streamed to its caller.
    case task(TaskID, TaskState, TaskReason?, continues: Bool)
    /// `EndTask`.
    case empty
    /// `GetTimeRemaining`.
    case timeRemaining(quota: Duration?, time: Duration?, state: AppState)
    /// `SetAppState`: the app after the change (boxed: the largest by far).
    indirect case app(AppSnapshot)

    static func task(_ task: TaskSnapshot, continues: Bool) -> HotReply {
        .task(task.id, task.state, task.reason, continues: continues)
    }

    static func timeRemaining(_ app: AppSnapshot) -> HotReply {
        .timeRemaining(quota: app.backgroundQuotaRemaining, time: app.backgroundTimeRemaining, state: app.state)
    }

    var continues: Bool {
        if case let .task(_, _, _, continues) = self { return continues }
        return false
    }

    /// The reply as the general path builds it.
    var general: VarlinkReply {
        switch self {
        case let .task(id, state, reason, continues):
            VarlinkReply(parameters: Wire.taskState(id: id, state: state, reason: reason), continues: continues)
        case .empty: VarlinkReply()
        case let .timeRemaining(quota, time, state):
            VarlinkReply(parameters: Wire.timeRemaining(quota: quota, time: time, state: state))
        case let .app(app): VarlinkReply(parameters: ["app": Wire.app(app)])
        }
    }

    /// Appends the reply's text (no NUL), keys in the order `JSON.writeObject` sorts them.
    func write(to out: ByteBuffer) {
        let start = out.count
        @inline(__always) func raw(_ text: StaticString) { out.append(text) }
        func string(_ text: String) { out.appendString(text) }
        func value(_ json: JSON) { out.appendJSON(json) }
        switch self {
        case let .task(id, state, reason, continues):
            raw(continues ? "{\"continues\":true,\"parameters\":{" : "{\"parameters\":{")
            if let reason { raw("\"reason\":"); string(reason.rawValue); raw(",") }
            raw("\"state\":"); raw(state.quoted)
            raw(",\"taskId\":"); out.appendInteger(Int64(id))
            raw("}}")
        case .empty:
            raw("{\"parameters\":{}}")
        case let .timeRemaining(quota, time, state):
            raw("{\"parameters\":{\"backgroundQuotaRemaining\":"); value(Wire.seconds(quota))
            raw(",\"backgroundTimeRemaining\":"); value(Wire.seconds(time))
            raw(",\"state\":"); string(state.rawValue)
            raw("}}")
        case let .app(app):
            raw("{\"parameters\":{\"app\":{\"backgroundQuotaRemaining\":"); value(Wire.seconds(app.backgroundQuotaRemaining))
            raw(",\"backgroundTimeRemaining\":"); value(Wire.seconds(app.backgroundTimeRemaining))
            raw(",\"command\":"); string(app.command)
            raw(",\"containment\":"); string(app.containment.rawValue)
            raw(",\"exempt\":"); raw(app.exempt ? "true" : "false")
            raw(",\"manager\":"); if let manager = app.manager { string(manager) } else { raw("null") }
            raw(",\"phase\":"); if let phase = app.phase { string(phase.rawValue) } else { raw("null") }
            raw(",\"pid\":"); out.appendInteger(Int64(app.identity.pid))
            raw(",\"policy\":"); if let policy = app.policy { string(policy) } else { raw("null") }
            raw(",\"state\":"); string(app.state.rawValue)
            raw(",\"subscribed\":"); raw(app.subscribed ? "true" : "false")
            raw(",\"tasks\":"); out.appendInteger(Int64(app.taskCount))
            raw(",\"uid\":"); out.appendInteger(Int64(app.uid))
            raw(",\"unit\":"); if let unit = app.unit { string(AppUnit.name(ofPath: unit)) } else { raw("null") }
            raw("}}}")
        }
        assert(out.bytes(from: start) == Array(general.frame.dropLast()), "HotReply.write differs from the general reply")
    }
}
