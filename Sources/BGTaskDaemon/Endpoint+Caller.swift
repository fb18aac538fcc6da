// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// Who is calling: the peer's process (resolved once per connection, by its pidfd) and the
/// app it belongs to.
extension Daemon {
    /// The caller's process; its pidfd is offered to `watch`.
    func caller(of connection: Connection) throws(BGTaskError) -> ProcessDescription {
        if let known = connection.caller {
            // Watched already: a watch is all the call's pidfd would be for (`watch`).
            if watches[known.identity] != nil { return known }
            if let pidfd = connection.peerPidfd {
                callPidfds[known.identity] = pidfd
                return known
            }
        }
        let resolved = try resolver.resolvePeer(of: connection) { model.isApp($0) }
        connection.caller = resolved.description
        callPidfds[resolved.description.identity] = resolved.pidfd
        return resolved.description
    }

    /// The registered app `process` belongs to: by unit or ancestry (the model), else as a
    /// tracked member whose fork the daemon saw (every process event up to now read first):
    /// a worker that double-forked and calls at once is its app's, not an app of its own.
    func appContaining(_ process: ProcessDescription) -> ProcessIdentity? {
        if let app = inPlace({ $0.app(containing: process) }) { return app }
        guard let tracker, let app = tracker.app(of: process.identity), model.uid(of: app) == process.uid,
              model.isApp(app) else { return nil }
        return app
    }

    /// The app an App call is about: the caller's, registered on its first call; the
    /// connection is filed under it.
    func callingApp(_ process: ProcessDescription, on connection: Connection, at now: Instant,
                    effects: inout [Effect]) throws -> ProcessIdentity {
        let app: ProcessIdentity
        if let known = appContaining(process) {
            app = known  // the common case: no policy lookup on the hot path
        } else {
            try requireWritableState()
            let (policy, quotaKey) = policy(for: process)
            app = try model.register(process, privileged: isPrivileged(connection), policy: policy, quotaKey: quotaKey,
                                     at: now, effects: &effects)
            attachRequests(app, process, at: now)
        }
        if connection.app != app {
            if let old = connection.app { forgetConnection(connection.id, of: old) }
            connection.app = app
            connectionsByApp[app, default: []].append(connection.id)
        }
        return app
    }

    /// The caller as `SetAppState` records it: its command and pid, `bgtask-session[812]`.
    /// Made once per connection: a lock's 200 calls come down one.
    func managerName(of connection: Connection) -> String {
        if let known = connection.managerName { return known }
        guard let caller = try? caller(of: connection) else { return "pid \(connection.credentials.pid)" }
        let name = "\(caller.command)[\(caller.identity.pid)]"  // escaped where printed: the log, a table
        connection.managerName = name
        return name
    }
}
