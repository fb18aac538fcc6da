// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// The cgroup v2 freezer: which cgroup is an app's own to freeze, freezing it, confirming
/// the freeze by `cgroup.events` (watched in the daemon's epoll group), the fallback to
/// signals when the kernel does not confirm within `freezeBound`, and a thaw nobody asked for.
extension Enforcer {
    enum NotOwn: Error {
        case reason(String)
        var text: String { if case let .reason(text) = self { text } else { "" } }
    }

    /// The app's cgroup — a unit app's unit; a process app's cgroup if every process in it
    /// (and below it) belongs to the app and every process of the app is in it — if (for an
    /// unprivileged owner) it is delegated to the owner: what the owner could freeze itself.
    func ownCgroup(of app: ProcessIdentity, uid: UInt32, tree: [Pidfd], at now: Int64?) -> Result<Cgroup, NotOwn> {
        guard Cgroup.mountPoint != nil, let cgroup = unit(app) ?? Cgroup.of(pid: app.pid) else {
            return .failure(.reason("no cgroup v2 hierarchy"))
        }
        guard !cgroup.isRoot else { return .failure(.reason("it is in the root cgroup")) }
        if uid != 0 {
            guard let owner = try? cgroup.freezeOwner(), owner == uid else {
                return .failure(.reason("\(cgroup.directory) is not delegated to uid \(uid)"))
            }
        }
        if daemonCgroup(at: now)?.isWithin(cgroup) == true {
            return .failure(.reason("it shares \(cgroup.directory) with bgtaskd"))
        }
        if unit(app) != nil { return .success(cgroup) }  // the unit is the app, whatever is in it
        guard let members = try? cgroup.processes() else {
            return .failure(.reason("cannot read \(cgroup.directory)/cgroup.procs"))
        }
        let tree = Set(tree.map(\.pid))
        if let stranger = members.first(where: { !tree.contains($0) }) {
            return .failure(.reason("it shares \(cgroup.directory) with pid \(stranger), which is not part of the app"))
        }
        if let outside = tree.first(where: { !members.contains($0) }) {
            return .failure(.reason("its pid \(outside) is outside \(cgroup.directory)"))
        }
        return .success(cgroup)
    }

    /// The daemon's own cgroup, read again once a second (at `nil`: now): a burst of
    /// suspensions asked /proc/self/cgroup once per app.
    func daemonCgroup(at now: Int64?) -> Cgroup? {
        if let now, let known = knownDaemonCgroup, now < known.until { return known.cgroup }
        let cgroup = Cgroup.of(pid: ownPID)
        if let now { knownDaemonCgroup = (cgroup, now + 1_000_000_000) }
        return cgroup
    }

    func freeze(_ app: ProcessIdentity, uid: UInt32, command: String, cgroup: Cgroup, at now: Int64) {
        do {
            // Opened before the write: kernfs reports (`EPOLLPRI`) every change of the file
            // after its open, so a freeze that completes before the watch is added is still
            // reported when it is, and nothing need be read now. (A read right after the write
            // found `frozen 0` nearly always, and with the read of the report it was a fifth of
            // the daemon's time in a burst of freezes: `perf`.)
            let events = try cgroup.openEvents()
            try cgroup.setFrozen(true)
            note(app, (.freezer(cgroup), command, uid), at: now)
            let source = try group.add(events.rawValue, events: IOEvents.priority) { [unowned self] _ in
                self.freezerChanged(app)
            }
            freezerWatches[app] = FreezerWatch(events: events, source: source)
            // The kernel freezes asynchronously: confirmed by cgroup.events, or the bound passes.
            pendingFreezes[app] = PendingFreeze(cgroup: cgroup, command: command, uid: uid)
            schedule(.freeze(app), now + Self.freezeBound)
        } catch {
            log(.notice, "App \(app) (\(command)) cannot be frozen: \(error); suspending with SIGSTOP")
            try? cgroup.setFrozen(false)
            stopTree(app, uid: uid)
            note(app, (.signals, command, uid), at: now)
        }
    }

    /// The pending freeze of `app`, removed, and its wait disarmed.
    func takePendingFreeze(of app: ProcessIdentity) -> PendingFreeze? {
        guard let pending = pendingFreezes.removeValue(forKey: app) else { return nil }
        schedule(.freeze(app), nil)
        return pending
    }

    /// The kernel had `freezeBound` to report `frozen 1`: if it has not, signals instead.
    func freezeWaitEnded(_ app: ProcessIdentity, at now: Int64) {
        guard let pending = pendingFreezes.removeValue(forKey: app) else { return }
        if (try? pending.cgroup.isFrozen()) == true { return }
        log(.notice, "App \(app) (\(pending.command)): \(pending.cgroup.directory) not frozen within \(Self.freezeBound / 1_000_000)ms; suspending with SIGSTOP")
        try? pending.cgroup.setFrozen(false)
        stopTree(app, uid: pending.uid)
        note(app, (.signals, pending.command, pending.uid), at: now)
    }

    /// A frozen (or freezing) app's `cgroup.events` changed.
    func freezerChanged(_ app: ProcessIdentity) {
        guard let watch = freezerWatches[app], case let .freezer(cgroup)? = suspended[app]?.method else { return }
        // Reading the watched descriptor acknowledges the change, or kernfs keeps polling ready.
        let frozen = (try? watch.events.readFromStart(upTo: 4096)).map(Cgroup.isFrozen(events:)) == true
        if pendingFreezes[app] != nil {
            if frozen { _ = takePendingFreeze(of: app) }
            return
        }
        guard !frozen, (try? cgroup.freezeRequested()) != true else { return }
        if !watch.reported, let record = suspended[app] {
            freezerWatches[app]?.reported = true
            log(.warning, "App \(app) (\(record.command)) was thawed while suspended (\(cgroup.directory)/cgroup.freeze set to 0 by someone else, or its slice thawed); freezing it again")
        }
        try? cgroup.setFrozen(true)
    }
}
