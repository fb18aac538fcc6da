// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import Varlink

/// Who may do what: managing an app is for its owner, root and `ManagerGroup` (Access in
/// BGTaskCore holds the rule); a listing shows an unprivileged caller its own apps only.
extension Daemon {
    func mayManage(_ connection: Connection, appUID: UInt32) -> Bool {
        let c = connection.credentials
        return access.mayManage(appUID: appUID, uid: c.uid, gid: c.gid, groups: c.groups)
    }

    /// Root or a member of `ManagerGroup`.
    func isPrivileged(_ connection: Connection) -> Bool {
        let c = connection.credentials
        return access.isPrivileged(uid: c.uid, gid: c.gid, groups: c.groups)
    }

    /// Whose apps a listing shows the caller: everyone's (`nil`) or its own.
    func visibleUID(_ connection: Connection) -> UInt32? {
        isPrivileged(connection) ? nil : connection.credentials.uid
    }

    /// Sorts the monitors again by whose events each may have, after `ManagerGroup` changed.
    func sortMonitors() {
        var sorted = Monitors()
        for id in monitors.all {
            if let connection = connections[id] { sorted.add(id, seeing: visibleUID(connection)) }
        }
        monitors = sorted
    }

    /// The registered app whose own process has `pid`, known by the pidfd the daemon holds
    /// for it: while that pidfd says the process lives, the pid cannot name another one, so
    /// nothing in `/proc` needs reading (a burst of 10,000 `SetAppState` calls read 13 files
    /// and opened a pidfd per call). The app's uid is the one it registered with, the one
    /// every action on it is taken as.
    func watchedApp(pid: Int32) -> ProcessIdentity? {
        guard let app = watchedByPID[pid], inPlace({ $0.isApp(app) }), let pidfd = watches[app]?.pidfd, !pidfd.hasExited else { return nil }
        return app
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
            if let app = watchedApp(pid: pid) {
                guard let uid = inPlace({ $0.uid(of: app) }), mayManage(connection, appUID: uid) else { throw VarlinkError.permissionDenied }
                return app
            }
            resolved = try resolver.resolve(pid: pid) { model.isApp($0) }
        case let .unit(name):
            let path = try unitPath(named: name, for: connection)
            let app = model.app(unit: path)
            if let app, let uid = model.uid(of: app), mayManage(connection, appUID: uid) { return app }
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
        let app = try model.register(resolved.description, privileged: isPrivileged(connection), policy: policy,
                                     quotaKey: quotaKey, at: now, effects: &effects)
        attachRequests(app, resolved.description, at: now)
        return app
    }
}
