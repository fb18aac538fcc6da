// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import BGTaskSystem
import Varlink

/// `io.bgtaskd.Manager`: the session manager's and the administrator's calls. Each names its
/// app through `managedApp` (Endpoint+Access), which checks the caller may manage it.
extension Daemon {
    func managerCall(_ method: ManagerMethod, _ call: VarlinkCall, on connection: Connection, at now: Instant,
                     effects: inout [Effect]) throws -> Answer {
        switch method {
        case .setAppState:
            return .hot(try hotCall(HotCall(.setAppState, general: call), on: connection, at: now, effects: &effects))
        case .listApps:
            _ = try Parameters(call.parameters, allowed: [])
            let apps = model.listApps(ownedBy: visibleUID(connection), at: now)
            return .listing(ListingReply(key: "apps", count: apps.count) { Wire.app(apps[$0]) })
        case .listTasks:
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            var app: ProcessIdentity?
            if let target = try parameters.optionalTarget() {
                app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            }
            let tasks = model.listTasks(of: app, ownedBy: visibleUID(connection), at: now)
            return .listing(ListingReply(key: "tasks", count: tasks.count) { Wire.writeTask(tasks[$0], to: $1) })
        case .getStatus:
            _ = try Parameters(call.parameters, allowed: [])
            return .reply(VarlinkReply(parameters: status(for: connection)))
        case .getHistory:
            _ = try Parameters(call.parameters, allowed: [])
            let entries = history.entries(ownedBy: visibleUID(connection))
            return .listing(ListingReply(key: "entries", count: entries.count) { Wire.writeHistoryEntry(entries[$0], to: $1) })
        case .monitor:
            _ = try Parameters(call.parameters, allowed: [])
            guard call.more else { throw VarlinkError.expectedMore }
            let account = connection.account
            guard connection.credentials.uid == 0 || account.monitors < Self.maximumMonitorsPerUser else {
                throw BGTaskError.limitExceeded("\(Self.maximumMonitorsPerUser) monitors of uid \(connection.credentials.uid)")
            }
            account.monitors += 1
            connection.stream = .monitor
            monitors.add(connection.id, seeing: visibleUID(connection))
            return .reply(VarlinkReply(parameters: [Field.event: .string("monitoring")], continues: true))
        case .terminate:
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            let target = try parameters.target()
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            try model.terminate(app, at: now, effects: &effects)
            return .reply(VarlinkReply())
        case .wake:
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
        case .expire:
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", "to"])
            let target = try parameters.target()
            guard let to = ExpireTarget(rawValue: try parameters.string("to")) else {
                throw VarlinkError.invalidParameter("to")
            }
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            try model.expireNow(app, to: to, at: now, effects: &effects)
            return .reply(VarlinkReply())
        case .getPolicy:
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
            let app = try managedApp(try parameters.target(), by: connection, register: false, at: now, effects: &effects)
            return .reply(VarlinkReply(parameters: Wire.policy(model.snapshot(of: app, at: now)?.policy.flatMap { name in
                policies.policies.first { $0.name == name }
            }, settings: model.settings(of: app))))
        case .listTaskRequests, .launchTask:
            return try managerRequestCall(method, call, on: connection, at: now, effects: &effects)
        case .reload:
            _ = try Parameters(call.parameters, allowed: [])
            // Also the daemon's own user: a per-user daemon's (`systemctl --user reload
            // bgtaskd`), who may send it SIGHUP anyway.
            guard isPrivileged(connection) || connection.credentials.uid == Host.effectiveUID else {
                throw VarlinkError.permissionDenied
            }
            if let error = reload() { throw ErrorName.invalidConfiguration(["message": .string("\(error)")]) }
            return .reply(VarlinkReply())
        }
    }

    /// `GetStatus`: others' counts are not an unprivileged caller's business: it sees its own.
    private func status(for connection: Connection) -> [String: JSON] {
        let uid = visibleUID(connection)
        let counts = uid.map { model.stateCounts(ownedBy: $0) } ?? model.stateCounts
        let keepAwake = keepAwakeStatus
        var status: [String: JSON] = [
            "version": .string(InterfaceDescription.version),
            "apps": .int(Int64(uid.map { model.appCount(ownedBy: $0) } ?? model.appCount)),
            "tasks": .int(Int64(uid.map { model.taskCount(ownedBy: $0) } ?? model.taskCount)),
            "backgroundApps": .int(Int64(counts[.background, default: 0])),
            "suspendedApps": .int(Int64(counts[.suspended, default: 0])),
            "connections": .int(Int64(uid.map { accounts[$0]?.connections ?? 0 } ?? connections.count)),
            "uptime": Wire.seconds(.nanoseconds(loop.now - startedAt)),
            // The machine's, not the caller's: `systemd-inhibit --list` shows it to anyone.
            "idleInhibited": .bool(awakeLock != nil),
            "keepAwake": .string(keepAwake.state),
        ]
        if let error = keepAwake.error { status["keepAwakeError"] = .string(error) }
        return status
    }
}
