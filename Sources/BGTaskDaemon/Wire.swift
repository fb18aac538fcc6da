// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import BGTaskSystem
import Varlink

/// How model values look on the wire (io.bgtaskd.varlink). Times are seconds as floats.
enum Wire {
    static func seconds(_ duration: Duration?) -> JSON {
        duration.map { .double(($0.seconds * 1e6).rounded() / 1e6) } ?? .null
    }

    static func app(_ app: AppSnapshot) -> JSON {
        .object([
            "pid": .int(Int64(app.identity.pid)), "uid": .int(Int64(app.uid)), "command": .string(app.command),
            "unit": app.unit.map { .string(AppUnit.name(ofPath: $0)) } ?? .null,
            "containment": .string(app.containment.rawValue),
            "policy": app.policy.map { .string($0) } ?? .null, "exempt": .bool(app.exempt),
            "backgroundQuotaRemaining": seconds(app.backgroundQuotaRemaining),
            "state": .string(app.state.rawValue), "phase": app.phase.map { .string($0.rawValue) } ?? .null,
            "tasks": .int(Int64(app.taskCount)), "backgroundTimeRemaining": seconds(app.backgroundTimeRemaining),
            "subscribed": .bool(app.subscribed), "manager": app.manager.map { .string($0) } ?? .null,
        ])
    }

    static func task(_ task: TaskSnapshot) -> JSON {
        var object: [String: JSON] = [
            "id": .int(Int64(task.id)), "pid": .int(Int64(task.owner.pid)), "appPid": .int(Int64(task.app.pid)),
            "uid": .int(Int64(task.uid)), "name": .string(task.name), "state": .string(task.state.rawValue),
            "age": seconds(task.age), "expirationHandler": .bool(task.expirationHandler),
        ]
        if let reason = task.reason { object["reason"] = .string(reason.rawValue) }
        return .object(object)
    }

    /// Appends `task(_:)`'s text, keys in the order `JSON.writeObject` sorts them, without
    /// building it: a listing writes 100,000 of these, and the dictionary, its sorted copy
    /// and their releases were three quarters of `ListTasks`' time (`perf`). Into a
    /// `ByteBuffer`: an `Array` append of a few bytes cost ~90 instructions, 14 a task
    /// (callgrind). Debug builds, which the tests run, check every one against the general
    /// encoding.
    static func writeTask(_ task: TaskSnapshot, to out: ByteBuffer) {
        let start = out.count
        out.append("{\"age\":"); out.appendJSON(seconds(task.age))
        out.append(",\"appPid\":"); out.appendInteger(Int64(task.app.pid))
        out.append(task.expirationHandler ? ",\"expirationHandler\":true,\"id\":" : ",\"expirationHandler\":false,\"id\":")
        out.appendInteger(Int64(task.id))
        out.append(",\"name\":"); out.appendString(task.name)
        out.append(",\"pid\":"); out.appendInteger(Int64(task.owner.pid))
        if let reason = task.reason { out.append(",\"reason\":"); out.appendString(reason.rawValue) }
        out.append(",\"state\":"); out.append(task.state.quoted)
        out.append(",\"uid\":"); out.appendInteger(Int64(task.uid))
        out.append("}")
        assert(out.bytes(from: start) == Array(Wire.task(task).serialized.utf8), "Wire.writeTask differs from Wire.task")
    }

    /// `GetTimeRemaining`'s reply.
    static func timeRemaining(quota: Duration?, time: Duration?, state: AppState) -> [String: JSON] {
        [Field.backgroundTimeRemaining: seconds(time), Field.backgroundQuotaRemaining: seconds(quota), Field.state: .string(state.rawValue)]
    }

    /// A task's `more` stream reply.
    static func taskState(id: TaskID, state: TaskState, reason: TaskReason?) -> [String: JSON] {
        var object: [String: JSON] = ["taskId": .int(Int64(id)), "state": .string(state.rawValue)]
        if let reason { object["reason"] = .string(reason.rawValue) }
        return object
    }

    static func event(_ event: LifecycleEvent) -> [String: JSON] {
        var object: [String: JSON] = ["event": .string(EventName(event).rawValue)]
        switch event {
        case let .didEnterBackground(transitionTimeout, remaining):
            object["transitionTimeout"] = seconds(transitionTimeout)
            object["backgroundTimeRemaining"] = seconds(remaining)
        case .willEnterForeground:
            break
        case let .taskGranted(id):
            object["taskId"] = .int(Int64(id))
        case let .taskDenied(id, reason):
            object["taskId"] = .int(Int64(id))
            object["reason"] = .string(reason.rawValue)
        case let .taskExpiring(ids, remaining):
            object["taskIds"] = .array(ids.map { .int(Int64($0)) })
            object["backgroundTimeRemaining"] = seconds(remaining)
        case let .taskExpired(ids):
            object["taskIds"] = .array(ids.map { .int(Int64($0)) })
        case let .didWake(reason, payload, remaining):
            object["reason"] = .string(reason)
            if let payload, let value = try? JSON.parse(payload) { object["payload"] = value }
            object["backgroundTimeRemaining"] = seconds(remaining)
        case let .launchTask(identifier, kind, id, remaining):
            object[Field.identifier] = .string(identifier)
            object[Field.kind] = .string(kind.rawValue)
            object["taskId"] = .int(Int64(id))
            object["backgroundTimeRemaining"] = seconds(remaining)
        }
        return object
    }

    /// A lifecycle event's frame (NUL included) for its app's subscribers, or with `pid` for
    /// a monitor, written directly, keys sorted: every app backgrounded, every task granted
    /// and every warning is one per subscriber and one per monitor. A woken or launched app's
    /// event (a payload to re-serialize) is built as `event(_:)`. Checked against it in debug
    /// builds. Written in `out` (emptied first: the daemon's one scratch buffer), copied out
    /// once.
    static func eventFrame(_ event: LifecycleEvent, pid: Int32? = nil, using out: ByteBuffer = ByteBuffer(capacity: 256)) -> [UInt8] {
        func reference() -> [UInt8] {
            var parameters = Wire.event(event)
            if let pid { parameters["pid"] = .int(Int64(pid)) }
            return VarlinkReply(parameters: parameters, continues: true).frame
        }
        out.removeAll()
        out.append(#"{"continues":true,"parameters":{"#)
        func name(_ text: StaticString) {
            out.append(#""event":"#)
            out.append(text)
            if let pid { out.append(#","pid":"#); out.appendInteger(Int64(pid)) }
        }
        func ids(_ ids: [TaskID]) {
            out.append(#","taskIds":["#)
            for (index, id) in ids.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                out.appendInteger(Int64(id))
            }
            out.append(UInt8(ascii: "]"))
        }
        switch event {
        case let .didEnterBackground(transitionTimeout, remaining):
            out.append(#""backgroundTimeRemaining":"#); out.appendJSON(seconds(remaining))
            out.append(",")
            name(#""didEnterBackground""#)
            out.append(#","transitionTimeout":"#); out.appendJSON(seconds(transitionTimeout))
        case .willEnterForeground:
            name(#""willEnterForeground""#)
        case let .taskGranted(id):
            name(#""taskGranted""#)
            out.append(#","taskId":"#); out.appendInteger(Int64(id))
        case let .taskDenied(id, reason):
            name(#""taskDenied""#)
            out.append(#","reason":"#); out.appendString(reason.rawValue)
            out.append(#","taskId":"#); out.appendInteger(Int64(id))
        case let .taskExpiring(taskIDs, remaining):
            out.append(#""backgroundTimeRemaining":"#); out.appendJSON(seconds(remaining))
            out.append(",")
            name(#""taskExpiring""#)
            ids(taskIDs)
        case let .taskExpired(taskIDs):
            name(#""taskExpired""#)
            ids(taskIDs)
        case .didWake, .launchTask:
            return reference()
        }
        out.append("}}")
        out.append(0)
        let frame = out.bytes(from: 0)
        assert(frame == reference(), "Wire.eventFrame differs from Wire.event")
        return frame
    }

    /// A request as its app sees it (`GetPendingTaskRequests`): its date from now.
    static func request(_ request: TaskRequest, at now: Instant) -> JSON {
        .object([
            Field.identifier: .string(request.identifier), Field.kind: .string(request.kind.rawValue),
            "earliestBeginDate": seconds(max(.zero, request.earliestBegin - now)),
            "requiresExternalPower": .bool(request.requiresExternalPower),
            "requiresNetworkConnectivity": .bool(request.requiresNetworkConnectivity),
            "interval": seconds(request.interval),
        ])
    }

    /// A request as a manager sees it (`ListTaskRequests`).
    static func scheduledRequest(_ snapshot: TaskRequestSnapshot, at now: Instant) -> JSON {
        guard case var .object(object) = request(snapshot.request, at: now) else { return .null }
        object["pid"] = snapshot.app.map { .int(Int64($0.pid)) } ?? .null
        object["uid"] = .int(Int64(snapshot.uid))
        object["waitingFor"] = .string(snapshot.waitingFor.rawValue)
        return .object(object)
    }

    /// Appends `historyEntry(_:)`'s text, keys sorted, without building it (every action is
    /// one, for `GetHistory` and for each monitor); checked against it in debug builds.
    static func writeHistoryEntry(_ entry: HistoryEntry, to out: ByteBuffer) {
        let start = out.count
        let record = entry.record
        out.append("{\"action\":"); out.appendString(record.action.rawValue)
        out.append(",\"command\":"); out.appendString(record.command)
        out.append(",\"detail\":"); if let detail = record.detail { out.appendString(detail) } else { out.append("null") }
        out.append(",\"pid\":"); out.appendInteger(Int64(record.app.pid))
        out.append(",\"reason\":"); out.appendString(record.reason.rawValue)
        out.append(",\"tasks\":[")
        for (index, name) in record.taskNames.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            out.appendString(name)
        }
        out.append("],\"time\":"); out.appendString(Host.rfc3339(entry.realtimeNanoseconds))
        out.append(",\"uid\":"); out.appendInteger(Int64(record.uid))
        out.append("}")
        assert(out.bytes(from: start) == Array(Wire.historyEntry(entry).serialized.utf8), "Wire.writeHistoryEntry differs from Wire.historyEntry")
    }

    /// A monitor's event frame (NUL included) for a task's change, or an action's history
    /// entry: `{"continues":true,"parameters":{"event":…,"task"|"entry":…}}`, written
    /// directly in `out` (emptied first), as `eventFrame` is (a burst sends one or two per
    /// app); checked against the general reply in debug builds.
    static func monitorFrame(_ task: TaskSnapshot, using out: ByteBuffer = ByteBuffer(capacity: 256)) -> [UInt8] {
        out.removeAll()
        out.append(#"{"continues":true,"parameters":{"event":"taskChanged","task":"#)
        writeTask(task, to: out)
        out.append("}}")
        out.append(0)
        let frame = out.bytes(from: 0)
        assert(frame == VarlinkReply(parameters: ["event": .string("taskChanged"), "task": Wire.task(task)], continues: true).frame)
        return frame
    }

    static func monitorFrame(_ entry: HistoryEntry, using out: ByteBuffer = ByteBuffer(capacity: 256)) -> [UInt8] {
        out.removeAll()
        out.append(#"{"continues":true,"parameters":{"entry":"#)
        writeHistoryEntry(entry, to: out)
        out.append(#","event":"#)
        out.appendString(entry.record.action.rawValue)
        out.append("}}")
        out.append(0)
        let frame = out.bytes(from: 0)
        assert(frame == VarlinkReply(parameters: ["event": .string(entry.record.action.rawValue), "entry": Wire.historyEntry(entry)],
                                     continues: true).frame)
        return frame
    }

    static func historyEntry(_ entry: HistoryEntry) -> JSON {
        let record = entry.record
        return .object([
            "time": .string(Host.rfc3339(entry.realtimeNanoseconds)), "pid": .int(Int64(record.app.pid)),
            "uid": .int(Int64(record.uid)), "command": .string(record.command),
            "action": .string(record.action.rawValue), "reason": .string(record.reason.rawValue),
            "detail": record.detail.map { .string($0) } ?? .null,
            "tasks": .array(record.taskNames.map { .string($0) }),
        ])
    }
}

/// A call's parameters, checked: unknown names and wrong types are `InvalidParameter`.
struct Parameters {
    let values: [String: JSON]

    /// `allowed` is a short list: a linear scan beats building a set per call.
    init(_ values: [String: JSON], allowed: [String]) throws(VarlinkError) {
        for key in values.keys where !allowed.contains(key) {
            throw .invalidParameter(values.keys.filter { !allowed.contains($0) }.sorted()[0])
        }
        self.values = values
    }

    func int(_ name: String) throws(VarlinkError) -> Int64 {
        guard let value = values[name]?.intValue else { throw .invalidParameter(name) }
        return value
    }

    func optionalInt(_ name: String) throws(VarlinkError) -> Int64? {
        guard let value = values[name], !value.isNull else { return nil }
        guard let int = value.intValue else { throw .invalidParameter(name) }
        return int
    }

    func string(_ name: String) throws(VarlinkError) -> String {
        guard let value = values[name]?.stringValue else { throw .invalidParameter(name) }
        return value
    }

    func optionalString(_ name: String) throws(VarlinkError) -> String? {
        guard let value = values[name], !value.isNull else { return nil }
        guard let string = value.stringValue else { throw .invalidParameter(name) }
        return string
    }

    /// Seconds within [0, `maximum`]: a finite number, never negative.
    func optionalSeconds(_ name: String, maximum: Double) throws(VarlinkError) -> Duration? {
        guard let value = values[name], !value.isNull else { return nil }
        guard let seconds = value.doubleValue, seconds.isFinite, seconds >= 0, seconds <= maximum else {
            throw .invalidParameter(name)
        }
        return .nanoseconds(Int64(seconds * 1e9))
    }

    func optionalBool(_ name: String) throws(VarlinkError) -> Bool? {
        guard let value = values[name], !value.isNull else { return nil }
        guard let bool = value.boolValue else { throw .invalidParameter(name) }
        return bool
    }

    /// Which app a manager names: exactly one of `pid` and `unit`.
    func target() throws(VarlinkError) -> AppTarget {
        guard let target = try optionalTarget() else { throw .invalidParameter("pid") }
        return target
    }

    /// Which app a manager names, if any: `pid` or `unit`, not both.
    func optionalTarget() throws(VarlinkError) -> AppTarget? {
        switch (try optionalInt("pid"), try optionalString("unit")) {
        case let (pid?, nil):
            guard pid > 0, pid <= Int64(Int32.max) else { throw .invalidParameter("pid") }
            return .pid(Int32(pid))
        case let (nil, unit?): return .unit(unit)
        case (nil, nil): return nil
        case (_?, _?): throw .invalidParameter("unit")  // one or the other
        }
    }

    /// A pid parameter: a positive 32-bit integer.
    func pid(_ name: String = "pid") throws(VarlinkError) -> Int32 {
        let value = try int(name)
        guard value > 0, value <= Int64(Int32.max) else { throw .invalidParameter(name) }
        return Int32(value)
    }
}

extension TaskState {
    /// The state as JSON text, for the writers that append a call's text directly (the
    /// reply to BeginTask, the state log's task line): a `String` is looked through for bytes
    /// to escape at every write (~230 instructions, callgrind), a state's name never has one.
    var quoted: StaticString {
        switch self {
        case .pending: #""pending""#
        case .granted: #""granted""#
        case .expiring: #""expiring""#
        case .ended: #""ended""#
        case .expired: #""expired""#
        case .denied: #""denied""#
        }
    }
}

extension AppState {
    /// The state as JSON text, as `TaskState.quoted` (the state log's app line).
    var quoted: StaticString {
        switch self {
        case .foreground: #""foreground""#
        case .background: #""background""#
        case .suspended: #""suspended""#
        case .terminated: #""terminated""#
        }
    }
}

extension BackgroundPhase {
    /// The phase as JSON text, as `TaskState.quoted`.
    var quoted: StaticString {
        switch self {
        case .transition: #""transition""#
        case .running: #""running""#
        case .woken: #""woken""#
        case .expiring: #""expiring""#
        }
    }
}

extension Containment {
    /// The containment as JSON text, as `TaskState.quoted`.
    var quoted: StaticString {
        switch self {
        case .unit: #""unit""#
        case .scope: #""scope""#
        case .tracked: #""tracked""#
        case .tree: #""tree""#
        }
    }
}

extension BGTaskError {
    /// The error as a Varlink reply error, with its parameters.
    var varlink: VarlinkError {
        switch self {
        case let .noSuchTask(id): ErrorName.noSuchTask(["taskId": .int(Int64(id))])
        case .noBackgroundTime: ErrorName.noBackgroundTime()
        case let .limitExceeded(limit): ErrorName.limitExceeded(["limit": .string(limit)])
        case let .noSuchApp(pid): ErrorName.noSuchApp(["pid": .int(Int64(pid))])
        case let .noSuchUnit(unit): ErrorName.noSuchApp(["unit": .string(unit)])
        case let .invalidParameter(what): ErrorName.invalidParameter(["parameter": .string(what)])
        case let .stateNotWritable(path): ErrorName.stateNotWritable(["path": .string(path)])
        case let .tooManyPendingTaskRequests(kind): ErrorName.tooManyPendingTaskRequests([Field.kind: .string(kind)])
        case let .noSuchTaskRequest(identifier): ErrorName.noSuchTaskRequest([Field.identifier: .string(identifier)])
        }
    }
}

extension EventName {
    init(_ event: LifecycleEvent) {
        self = switch event {
        case .didEnterBackground: .didEnterBackground
        case .willEnterForeground: .willEnterForeground
        case .taskGranted: .taskGranted
        case .taskDenied: .taskDenied
        case .taskExpiring: .taskExpiring
        case .taskExpired: .taskExpired
        case .didWake: .didWake
        case .launchTask: .launchTask
        }
    }
}

/// How a manager names an app: by a process of it, or by its unit (a unit name such as
/// `app-foo.scope`, or the unit's cgroup path).
enum AppTarget: Equatable {
    case pid(Int32)
    case unit(String)
}

extension WakeReason {
    /// The payload as JSON text: an object of at most 4 KiB serialized, or none.
    static func payload(_ value: JSON?) throws -> String? {
        guard let value, !value.isNull else { return nil }
        guard case .object = value else { throw VarlinkError.invalidParameter("payload") }
        return try validate(payload: value.serialized)
    }
}
