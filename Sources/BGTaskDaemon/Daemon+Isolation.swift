// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// `IsolateApps=`: a process app moved into a transient scope of its own through systemd, so
/// that nothing it forks can leave it (containment `scope`). Asynchronous: the app is a
/// process app until the manager has moved it.
extension Daemon {
    /// How often, and how many times, the app's cgroup is looked at after the manager took
    /// the job (it moves the processes when the job runs, just after answering).
    static let scopeCheckInterval: Int64 = 20_000_000
    static let scopeChecks = 50

    /// Asks the manager that may (`Isolation.of`) to move a newly registered process app.
    func isolateIfAllowed(_ app: ProcessIdentity) {
        let mode = model.settings(of: app).isolateApps
        guard mode != .no, let containment = model.containment(of: app),
              containment == .tree || containment == .tracked, let uid = model.uid(of: app),
              let cgroup = Cgroup.of(pid: app.pid),
              let isolation = Isolation.of(cgroupPath: cgroup.path, uid: uid, mode: mode,
                                           daemonUID: Host.effectiveUID),
              let manager = manager(for: isolation) else { return }
        let pids = enforcer.members(of: app, uid: uid).map(\.pid)
        enforcer.forgetLeftOut()  // the processes moved are the app's; its actions report what they leave out
        guard !pids.isEmpty else { return }
        let name = Isolation.scopeName(pid: app.pid)
        let slice: String? = if case let .system(slice) = isolation { slice } else { nil }
        writeState()  // the app is on disk before its process is moved
        let id = nextManagerRequest
        nextManagerRequest += 1
        // A request a peer never answers (or answered by a call, which ends the connection)
        // is given up after a minute: nothing is kept for a manager that went away.
        managerRequests = managerRequests.filter { loop.now - $0.value.since < Self.managerRetryDelay }
        managerRequests[id] = (manager, loop.now)
        manager.startScope(name, pids: pids, slice: slice, description: "bgtaskd app \(app.pid)") { [unowned self] error in
            // Done with this connection; dropped on the next pass, not inside its own callback.
            if let request = managerRequests.removeValue(forKey: id) { retiredConnections.append(request.manager) }
            if let error {
                log(.warning, "App \(app) not moved into a scope of its own (\(name)): \(error)")
                return
            }
            scopeChecks[app] = (name, Self.scopeChecks)
            pass { _ in checkScope(app) }
        }
    }

    /// Once the app's process is in the new scope, the app is that scope's; until then it is
    /// looked at again (`Wait.isolation`, timed by the model), a bounded number of times.
    /// Within a pass.
    func checkScope(_ app: ProcessIdentity) {
        guard let (name, left) = scopeChecks.removeValue(forKey: app), watches[app] != nil else { return }
        if let cgroup = Cgroup.of(pid: app.pid), AppUnit.name(ofPath: cgroup.path) == name {
            var effects: [Effect] = []
            if model.isolate(app, inScope: cgroup.path, effects: &effects) { tracker?.stop(app) }
            carryOut(effects)
        } else if left > 0 {
            scopeChecks[app] = (name, left - 1)
            model.schedule(.isolation(app), at: Instant(nanoseconds: loop.now + Self.scopeCheckInterval))
        } else {
            log(.warning, "App \(app): systemd took the job but did not move it into \(name)")
        }
    }

    /// How long a manager that could not be reached (or vouched for) is not tried again.
    static let managerRetryDelay: Int64 = 60_000_000_000

    /// A new connection to the manager for `isolation`, checked to be that manager: a user's
    /// socket lives in a directory the user owns, so whoever listens there must be the user's
    /// own `systemd --user` (its uid, in `user@UID.service/init.scope`), and the system's must
    /// be root's in `/init.scope`. `nil` (logged, retried after a minute) otherwise.
    private func manager(for isolation: Isolation) -> ServiceManager? {
        let path: String
        let vouch: (ServiceManager.Listener) -> String?
        switch isolation {
        case let .user(uid):
            path = ServiceManager.userPath(uid: uid)
            vouch = { listener in
                guard listener.uid == uid else { return "listened on by uid \(listener.uid), not \(uid)" }
                guard let cgroup = Cgroup.of(pid: listener.pid)?.path,
                      cgroup.hasSuffix("/user@\(uid).service/init.scope") else {
                    return "listened on by pid \(listener.pid), not user@\(uid).service's manager"
                }
                return nil
            }
        case .system:
            path = ServiceManager.systemPath
            vouch = { listener in
                guard listener.uid == 0, listener.pid == 1 || Cgroup.of(pid: listener.pid)?.path == "/init.scope" else {
                    return "listened on by pid \(listener.pid) (uid \(listener.uid)), not the system manager"
                }
                return nil
            }
        }
        if let until = unreachableManagers[path], loop.now < until { return nil }
        do {
            let manager = try ServiceManager(path: path, loop: loop, vouch: vouch)
            unreachableManagers[path] = nil
            return manager
        } catch {
            if unreachableManagers[path] == nil {
                log(.notice, "Apps are not moved into scopes through \(path): \(error); trying again in a minute")
            }
            unreachableManagers[path] = loop.now + Self.managerRetryDelay
            return nil
        }
    }
}
