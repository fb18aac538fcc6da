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
              containment == .tree || containment == .tracked, let uid = model.owner(of: app),
              let cgroup = Cgroup.of(pid: app.pid),
              let isolation = Isolation.of(cgroupPath: cgroup.path, uid: uid, mode: mode,
                                           daemonUID: Host.effectiveUID),
              let manager = manager(for: isolation) else { return }
        let pids = enforcer.members(of: app, uid: uid).map(\.pid)
        guard !pids.isEmpty else { return }
        let name = Isolation.scopeName(pid: app.pid)
        let slice: String? = if case let .system(slice) = isolation { slice } else { nil }
        writeState()  // the app is on disk before its process is moved
        manager.startScope(name, pids: pids, slice: slice, description: "bgtaskd app \(app.pid)") { [unowned self] error in
            if let error {
                log(.warning, "App \(app) not moved into a scope of its own (\(name)): \(error)")
                return
            }
            checkScope(app, name: name, checksLeft: Self.scopeChecks)
        }
    }

    /// Once the app's process is in the new scope, the app is that scope's.
    private func checkScope(_ app: ProcessIdentity, name: String, checksLeft: Int) {
        guard watches[app] != nil else { return }  // gone meanwhile
        if let cgroup = Cgroup.of(pid: app.pid), AppUnit.name(ofPath: cgroup.path) == name {
            pass { _ in
                var effects: [Effect] = []
                if model.isolate(app, inScope: cgroup.path, effects: &effects) { tracker?.stop(app) }
                carryOut(effects)
            }
        } else if checksLeft > 0 {
            scopeTimers[app] = try? loop.addTimer { [unowned self] in
                scopeTimers[app] = nil
                checkScope(app, name: name, checksLeft: checksLeft - 1)
            }
            scopeTimers[app]?.arm(at: loop.now + Self.scopeCheckInterval)
        } else {
            log(.warning, "App \(app): systemd took the job but did not move it into \(name)")
        }
    }

    /// The manager for `isolation`, connected once and kept; `nil` (logged once) when it
    /// cannot be reached.
    private func manager(for isolation: Isolation) -> ServiceManager? {
        let address = switch isolation {
        case let .user(uid): ServiceManager.userAddress(uid: uid)
        case .system: ServiceManager.systemAddress
        }
        if let manager = managers[address] { return manager }
        guard !unreachableManagers.contains(address) else { return nil }
        do {
            let manager = try ServiceManager(address: address, loop: loop)
            managers[address] = manager
            return manager
        } catch {
            unreachableManagers.insert(address)
            log(.notice, "Apps are not moved into scopes through \(address): \(error)")
            return nil
        }
    }
}
