// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// Scheduled work (iOS's BGTaskScheduler): the App calls that submit, cancel, list and
/// complete requests, and the Manager's listing and launch. Requests are kept by app key:
/// the app's quota key (its unit, else its user and executable), so a relaunch finds them.
extension Daemon {
    func requestCall(_ method: AppMethod, _ call: VarlinkCall, app: ProcessIdentity, process: ProcessDescription,
                     at now: Instant, effects: inout [Effect]) throws -> VarlinkReply {
        switch method {
        case .submitTaskRequest:
            let parameters = try Parameters(call.parameters, allowed: [
                Field.identifier, Field.kind, "earliestBeginDate", "requiresExternalPower", "requiresNetworkConnectivity", "interval",
            ])
            let identifier = try TaskRequest.validate(identifier: try parameters.string(Field.identifier))
            guard let kind = TaskRequestKind(rawValue: try parameters.string(Field.kind)) else {
                throw VarlinkError.invalidParameter(Field.kind)
            }
            let after = try parameters.optionalSeconds("earliestBeginDate", maximum: TaskRequest.maximumSeconds) ?? .zero
            let interval = try parameters.optionalSeconds("interval", maximum: TaskRequest.maximumSeconds)
            let request = TaskRequest(identifier: identifier, kind: kind, earliestBegin: now + after,
                                      requiresExternalPower: try parameters.optionalBool("requiresExternalPower") ?? false,
                                      requiresNetworkConnectivity: try parameters.optionalBool("requiresNetworkConnectivity") ?? false,
                                      interval: interval)
            try model.submitTaskRequest(request, from: app, key: requestKey(of: process), at: now, effects: &effects)
        case .cancelTaskRequest:
            let parameters = try Parameters(call.parameters, allowed: [Field.identifier])
            model.cancelTaskRequest(try parameters.string(Field.identifier), from: app, at: now)
        case .cancelAllTaskRequests:
            _ = try Parameters(call.parameters, allowed: [])
            model.cancelAllTaskRequests(from: app, at: now)
        case .getPendingTaskRequests:
            _ = try Parameters(call.parameters, allowed: [])
            return VarlinkReply(parameters: ["requests": .array(model.pendingTaskRequests(of: app).map { Wire.request($0, at: now) })])
        case .setTaskCompleted:
            let parameters = try Parameters(call.parameters, allowed: [Field.identifier, "success"])
            let identifier = try parameters.string(Field.identifier)
            guard let success = try parameters.optionalBool("success") else { throw VarlinkError.invalidParameter("success") }
            try model.setTaskCompleted(identifier, success: success, of: app, at: now, effects: &effects)
        default:
            throw VarlinkError.methodNotFound(call.method)  // not a request method: never reached
        }
        return VarlinkReply()
    }

    /// `ListTaskRequests`, `LaunchTask`.
    func managerRequestCall(_ method: ManagerMethod, _ call: VarlinkCall, on connection: Connection, at now: Instant,
                            effects: inout [Effect]) throws -> Answer {
        if method == .launchTask {
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", Field.identifier])
            let target = try parameters.target()
            let identifier = try parameters.string(Field.identifier)
            try requireWritableState()
            let app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
            try model.launchNow(identifier, of: app, at: now, effects: &effects)
            return .reply(VarlinkReply())
        }
        let parameters = try Parameters(call.parameters, allowed: ["pid", "unit"])
        var app: ProcessIdentity?
        if let target = try parameters.optionalTarget() {
            app = try managedApp(target, by: connection, register: false, at: now, effects: &effects)
        }
        let requests = model.listTaskRequests(of: app, ownedBy: visibleUID(connection), at: now)
        return .reply(VarlinkReply(parameters: [
            "requests": .array(requests.map { Wire.scheduledRequest($0, at: now) }),
            "externalPower": .bool(model.conditions.externalPower), "network": .bool(model.conditions.network),
        ]))
    }

    /// The key an app's requests are kept by: its quota key, from what the kernel says of it.
    func requestKey(of process: ProcessDescription) -> String {
        facts(pid: process.identity.pid, uid: process.uid, unit: process.unit).quotaKey
    }

    /// A newly registered app of a user with requests kept gets them back (a relaunch).
    func attachRequests(_ app: ProcessIdentity, _ process: ProcessDescription, at now: Instant) {
        guard model.hasRequests(ownedBy: process.uid) else { return }
        model.attach(app, key: requestKey(of: process), at: now)
    }
}
