// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// The Varlink endpoint: decodes each call, checks access, asks the model, encodes the reply.
extension Daemon {
    func dispatch(_ call: VarlinkCall, on connection: Connection, at now: Instant,
                  effects: inout [Effect]) throws(VarlinkError) -> Answer {
        let (interface, member) = VarlinkCall.split(call.method)
        do {
            switch interface {
            case InterfaceDescription.service: return .reply(try serviceCall(call, member))
            case "io.bgtaskd.App": return .reply(try appCall(call, member, on: connection, at: now, effects: &effects))
            case "io.bgtaskd.Manager": return try managerCall(call, member, on: connection, at: now, effects: &effects)
            default: throw VarlinkError.interfaceNotFound(interface)
            }
        } catch let error as BGTaskError {
            throw error.varlink
        } catch let error as VarlinkError {
            throw error
        } catch {
            throw VarlinkError("org.varlink.service.InvalidParameter", parameters: ["parameter": .string("\(error)")])
        }
    }

    // MARK: org.varlink.service

    func serviceCall(_ call: VarlinkCall, _ member: String) throws -> VarlinkReply {
        switch member {
        case "GetInfo":
            _ = try Parameters(call.parameters, allowed: [])
            return VarlinkReply(parameters: [
                "vendor": .string("bgtaskd"), "product": .string("bgtaskd"),
                // No URL: the project has no public home yet, and GetInfo says only what is true.
                "version": .string(InterfaceDescription.version), "url": .string(""),
                "interfaces": .array([InterfaceDescription.service, "io.bgtaskd.App", "io.bgtaskd.Manager"].map { .string($0) }),
            ])
        case "GetInterfaceDescription":
            let parameters = try Parameters(call.parameters, allowed: ["interface"])
            let name = try parameters.string("interface")
            guard let text = InterfaceDescription.blocks[name] else { throw VarlinkError.interfaceNotFound(name) }
            return VarlinkReply(parameters: ["description": .string(text)])
        default:
            throw VarlinkError.methodNotFound(call.method)
        }
    }

    // MARK: io.bgtaskd.App

    /// The caller's process, resolved once per connection; its pidfd is offered to `watch`.
    func caller(of connection: Connection) throws(BGTaskError) -> ProcessDescription {
        if let known = connection.caller, let pidfd = connection.peerPidfd ?? watches[known.identity]?.pidfd {
            callPidfds[known.identity] = pidfd
            return known
        }
        let resolved = try resolver.resolvePeer(of: connection)
        connection.caller = resolved.description
        callPidfds[resolved.description.identity] = resolved.pidfd
        return resolved.description
    }

    /// The registered app `process` belongs to: by unit or ancestry (the model), else as a
    /// tracked member whose fork the daemon saw (every process event up to now read first):
    /// a worker that double-forked and calls at once is its app's, not an app of its own.
    func appContaining(_ process: ProcessDescription) -> ProcessIdentity? {
        if let app = model.app(containing: process) { return app }
        guard let tracker, let app = tracker.app(of: process.identity), model.owner(of: app) == process.uid,
              model.isApp(app) else { return nil }
        return app
    }

    static let appMembers: Set = ["Subscribe", "BeginTask", "EndTask", "GetTimeRemaining", "FinishBackgroundTransition", "FinishWake"]

    func appCall(_ call: VarlinkCall, _ member: String, on connection: Connection, at now: Instant,
                 effects: inout [Effect]) throws -> VarlinkReply {
        guard Self.appMembers.contains(member) else { throw VarlinkError.methodNotFound(call.method) }
        // A read changes nothing, so a full disk refuses it only for a caller not yet an app
        // (its registration would be a change).
        if member != "GetTimeRemaining" { try requireWritableState() }
        let process = try caller(of: connection)
        let app: ProcessIdentity
        if let known = appContaining(process) {
            app = known  // the common case: no policy lookup on the hot path
        } else {
            try requireWritableState()
            let (policy, quotaKey) = policy(for: process)
            app = try model.register(process, privileged: isPrivileged(connection), policy: policy, quotaKey: quotaKey,
                                     at: now, effects: &effects)
        }
        if connection.app != app {
            if let old = connection.app { forgetConnection(connection.id, of: old) }
            connection.app = app
            connectionsByApp[app, default: []].append(connection.id)
        }
        switch member {
        case "Subscribe":
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
                "event": .string("subscribed"), "pid": .int(Int64(app.pid)), "state": .string(snapshot.state.rawValue),
                "phase": snapshot.phase.map { .string($0.rawValue) } ?? .null,
                "backgroundTimeRemaining": Wire.seconds(snapshot.backgroundTimeRemaining),
                // What the app holds now: after a daemon restart, what survived it; and which
                // of those were warned already (a client that was away missed taskExpiring).
                "taskIds": .array(held.map { .int(Int64($0.id)) }),
                "expiringTaskIds": .array(held.filter { $0.state == .expiring }.map { .int(Int64($0.id)) }),
            ], continues: true)
        case "BeginTask":
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
        case "EndTask":
            let parameters = try Parameters(call.parameters, allowed: ["taskId"])
            let id = try parameters.int("taskId")
            guard let taskID = TaskID(exactly: id) else {  // negative: the error names the id it was given
                throw VarlinkError(BGTaskError.noSuchTask(0).varlinkName, parameters: ["taskId": .int(id)])
            }
            try model.endTask(taskID, in: app, at: now, effects: &effects)
            return VarlinkReply()
        case "GetTimeRemaining":
            _ = try Parameters(call.parameters, allowed: [])
            let snapshot = model.snapshot(of: app, at: now)!
            return VarlinkReply(parameters: [
                "backgroundTimeRemaining": Wire.seconds(snapshot.backgroundTimeRemaining),
                "backgroundQuotaRemaining": Wire.seconds(snapshot.backgroundQuotaRemaining),
                "state": .string(snapshot.state.rawValue),
            ])
        case "FinishWake":
            _ = try Parameters(call.parameters, allowed: [])
            model.finishWake(of: app, at: now, effects: &effects)
            return VarlinkReply()
        default:  // FinishBackgroundTransition
            _ = try Parameters(call.parameters, allowed: [])
            model.finishTransition(of: app, at: now, effects: &effects)
            return VarlinkReply()
        }
    }

    // MARK: io.bgtaskd.Manager

    func mayManage(_ connection: Connection, appUID: UInt32) -> Bool {
        let c = connection.credentials
        return access.mayManage(appUID: appUID, uid: c.uid, gid: c.gid, groups: c.groups)
    }

    /// Root or a member of `ManagerGroup`.
    func isPrivileged(_ connection: Connection) -> Bool {
        let c = connection.credentials
        return access.isPrivileged(uid: c.uid, gid: c.gid, groups: c.groups)
    }

    /// The caller as `SetAppState` records it: its command and pid, `bgtask-session[812]`.
    func managerName(of connection: Connection) -> String {
        guard let caller = try? caller(of: connection) else { return "pid \(connection.credentials.pid)" }
        return "\(caller.command)[\(caller.identity.pid)]"  // escaped where printed: the log, a table
    }

    /// Whose apps a listing shows the caller: everyone's (`nil`) or its own.
    func visibleUID(_ connection: Connection) -> UInt32? {
        isPrivileged(connection) ? nil : connection.credentials.uid
    }

    /// The app a manager names, checked for access; registered first if `register` and it
    /// is not an app yet. A process the caller may not manage is refused the same way
    /// whether it is an app or not: whether another user's process is an app is not the
    /// caller's to learn.
    func managedApp(_ target: AppTarget, by connection: Connection, register: Bool, at now: Instant,
                    effects: inout [Effect]) throws -> ProcessIdentity {
        let resolved: ProcessResolver.Resolved
        switch target {
        case let .pid(pid):
            resolved = try resolver.resolve(pid: pid) { model.isApp($0) }
        case let .unit(name):
            let path = try unitPath(named: name, for: connection)
            let app = model.app(unit: path)
            if let app, let uid = model.owner(of: app), mayManage(connection, appUID: uid) { return app }
            // Whose the unit is comes first: another user's is refused alike, app or not.
            if app != nil || !(isPrivileged(connection) || ownsUnit(path, uid: connection.credentials.uid)) {
                throw VarlinkError.permissionDenied
            }
            guard register else { throw BGTaskError.noSuchUnit(name) }
            resolved = try mainProcess(ofUnit: path, named: name)
        }
        guard mayManage(connection, appUID: resolved.description.uid) else { throw VarlinkError.permissionDenied }
        callPidfds[resolved.description.identity] = resolved.pidfd
        if let app = appContaining(resolved.description) { return app }
        guard register else { throw BGTaskError.noSuchApp(resolved.description.identity.pid) }
        let (policy, quotaKey) = policy(for: resolved.description)
        return try model.register(resolved.description, privileged: isPrivileged(connection), policy: policy,
                                  quotaKey: quotaKey, at: now, effects: &effects)
    }

    func managerCall(_ call: VarlinkCall, _ member: String, on connection: Connection, at now: Instant,
                     effects: inout [Effect]) throws -> Answer {
        switch member {
        case "SetAppState":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", "state", "reason"])
            let target = try parameters.target()
            guard let state = AppState(rawValue: try parameters.string("state")),
                  state == .foreground || state == .background else { throw VarlinkError.invalidParameter("state") }
            let reason = try parameters.optionalString("reason")
            if let reason, reason.utf8.count > 256 { throw VarlinkError.invalidParameter("reason") }
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: true, at: now, effects: &effects)
            let snapshot = try model.setState(of: app, to: state, by: managerName(of: connection),
                                              reason: reason, at: now, effects: &effects)
            return .reply(VarlinkReply(parameters: ["app": Wire.app(snapshot)]))
        case "ListApps":
            _ = try Parameters(call.parameters, allowed: [])
            let apps = model.listApps(ownedBy: visibleUID(connection), at: now)
            return .listing(ListingReply(key: "apps", count: apps.count) { Wire.app(apps[$0]) })
        case "ListTasks":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            var app: ProcessIdentity?
            if let target = try parameters.optionalTarget() {
                app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            }
            let tasks = model.listTasks(of: app, ownedBy: visibleUID(connection), at: now)
            return .listing(ListingReply(key: "tasks", count: tasks.count) { Wire.task(tasks[$0]) })
        case "GetStatus":
            _ = try Parameters(call.parameters, allowed: [])
            // Others' counts are not an unprivileged caller's business: it sees its own.
            let uid = visibleUID(connection)
            let counts = uid.map { model.stateCounts(ownedBy: $0) } ?? model.stateCounts
            return .reply(VarlinkReply(parameters: [
                "version": .string(InterfaceDescription.version),
                "apps": .int(Int64(uid.map { model.appCount(ownedBy: $0) } ?? model.appCount)),
                "tasks": .int(Int64(uid.map { model.taskCount(ownedBy: $0) } ?? model.taskCount)),
                "backgroundApps": .int(Int64(counts[.background, default: 0])),
                "suspendedApps": .int(Int64(counts[.suspended, default: 0])),
                "connections": .int(Int64(uid.map { connectionsPerUID[$0, default: 0] } ?? connections.count)),
                "uptime": Wire.seconds(.nanoseconds(Clock.monotonicNanoseconds() - startedAt)),
            ]))
        case "GetHistory":
            _ = try Parameters(call.parameters, allowed: [])
            let entries = history.entries(ownedBy: visibleUID(connection))
            return .listing(ListingReply(key: "entries", count: entries.count) { Wire.historyEntry(entries[$0]) })
        case "Monitor":
            _ = try Parameters(call.parameters, allowed: [])
            guard call.more else { throw VarlinkError.expectedMore }
            connection.stream = .monitor
            monitors.append(connection.id)
            return .reply(VarlinkReply(parameters: ["event": .string("monitoring")], continues: true))
        case "Terminate":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            let target = try parameters.target()
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            try model.terminate(app, at: now, effects: &effects)
            return .reply(VarlinkReply())
        case "Wake":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", "reason", "payload"])
            let target = try parameters.target()
            let reason = try WakeReason.validate(try parameters.optionalString("reason") ?? "")
            let payload = try WakeReason.payload(parameters.values["payload"])
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            let outcome = try model.wake(app, reason: reason, payload: payload, at: now, effects: &effects)
            var reply = ["outcome": JSON.string(outcome.rawValue)]
            if let snapshot = model.snapshot(of: app, at: now) { reply["app"] = Wire.app(snapshot) }
            return .reply(VarlinkReply(parameters: reply))
        case "Expire":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", "to"])
            let target = try parameters.target()
            guard let to = ExpireTarget(rawValue: try parameters.string("to")) else {
                throw VarlinkError.invalidParameter("to")
            }
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            try model.expireNow(app, to: to, at: now, effects: &effects)
            return .reply(VarlinkReply())
        case "GetPolicy":
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            let app = try managedApp(try parameters.target(), by: connection, register: false, at: now, effects: &effects)
            return .reply(VarlinkReply(parameters: Wire.policy(model.snapshot(of: app, at: now)?.policy.flatMap { name in
                policies.policies.first { $0.name == name }
            }, settings: model.settings(of: app))))
        case "Reload":
            _ = try Parameters(call.parameters, allowed: [])
            guard isPrivileged(connection) else { throw VarlinkError.permissionDenied }
            if let error = reload() {
                throw VarlinkError("io.bgtaskd.Manager.InvalidConfiguration", parameters: ["message": .string("\(error)")])
            }
            return .reply(VarlinkReply())
        default:
            throw VarlinkError.methodNotFound(call.method)
        }
    }
}

/// Task names end up in tables and logs: bounded, and free of control characters.
enum TaskName {
    static let maximumBytes = 256

    static func validate(_ name: String) throws(VarlinkError) -> String {
        let bytes = name.utf8
        guard bytes.count <= maximumBytes else { throw .invalidParameter("name") }
        guard !name.containsControlCharacters else { throw .invalidParameter("name") }
        return name
    }
}

/// A wake's words from the manager: its reason (for the app, history and the journal) and
/// an optional small JSON object for the app.
enum WakeReason {
    static let maximumReasonBytes = 256
    static let maximumPayloadBytes = 4096

    static func validate(_ reason: String) throws(VarlinkError) -> String {
        guard reason.utf8.count <= maximumReasonBytes, !reason.containsControlCharacters else {
            throw .invalidParameter("reason")
        }
        return reason
    }

    /// The payload as JSON text: an object of at most 4 KiB serialized, or none.
    static func payload(_ value: JSON?) throws(VarlinkError) -> String? {
        guard let value, !value.isNull else { return nil }
        guard case .object = value else { throw .invalidParameter("payload") }
        let text = value.serialized
        guard text.utf8.count <= maximumPayloadBytes else { throw .invalidParameter("payload") }
        return text
    }
}
