// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// Managers naming apps by unit (DESIGN.md §2a): a unit name such as `app-foo.scope`, or
/// the unit's cgroup path when two managers (the system's and a user's) use one name.
///
/// A lookup costs its caller, not everyone: registered units are found in the model's index;
/// an unprivileged caller's search for any other is limited to its own user manager's
/// subtree and to a thousand directories a second, so that a user who made 10,000
/// cgroups of its own cannot hold the loop. Whose a unit is, is settled before whether it is
/// an app: another user's unit is refused the same way, app or not.
extension Daemon {
    /// Directories a privileged caller's search looks at, at most.
    static let unitSearchLimit = 10_000
    /// Directories of its own subtree an unprivileged caller's search looks at, at most,
    /// per call and per second (about 20 ms of loop time).
    static let userUnitSearchLimit = 1_000

    /// The cgroup path of the app unit `name` names, for the caller on `connection`.
    /// `InvalidParameter` for what cannot be an app (a slice, `init.scope`, a session, a user
    /// manager, the daemon's own unit, a malformed name) or a name two units share;
    /// `NoSuchApp` for no such unit (for an unprivileged caller: none of its own);
    /// `LimitExceeded` when the caller searched too much this second.
    func unitPath(named name: String, for connection: Connection) throws(BGTaskError) -> String {
        if name.hasPrefix("/") {
            guard name.utf8.count <= 4096, !name.containsControlCharacters,
                  !name.split(separator: "/").contains(where: { $0 == ".." || $0 == "." }) else {
                throw .invalidParameter("unit: '\(name.cEscaped)' is not a cgroup path")
            }
            try requireAppUnit(AppUnit.name(ofPath: name), path: name)
            guard model.app(unit: name) != nil || Cgroup.at(path: name).map({ FileSystem.exists($0.directory) }) == true
            else { throw .noSuchUnit(name) }
            return name
        }
        if let refusal = AppUnit.refusal(ofName: name) { throw .invalidParameter("unit: \(refusal)") }
        let uid = visibleUID(connection)
        var found = model.unitPaths(named: name, ownedBy: uid)
        if found.isEmpty { found = try searchUnit(named: name, uid: uid) }
        for path in found { try requireAppUnit(name, path: path) }
        guard let path = found.first else { throw .noSuchUnit(name) }
        guard found.count == 1 else {
            throw .invalidParameter("unit: \(name) names \(found.count) cgroups (\(found.sorted().joined(separator: ", "))); give its cgroup path")
        }
        return path
    }

    /// Searches the cgroup tree for units called `name`: all of it for a privileged caller
    /// (`uid` nil), else `uid`'s own user manager's subtree, within its per-second allowance.
    private func searchUnit(named name: String, uid: UInt32?) throws(BGTaskError) -> [String] {
        guard let uid else { return Cgroup.find(named: name, limit: Self.unitSearchLimit).map(\.path) }
        guard let own = Cgroup.at(path: "/user.slice/user-\(uid).slice/user@\(uid).service"),
              FileSystem.exists(own.directory) else { return [] }
        let second = loop.now / 1_000_000_000
        if unitSearches[uid]?.second != second {
            if unitSearches.count > 1024 { unitSearches = unitSearches.filter { $0.value.second == second } }
            unitSearches[uid] = (second, 0)
        }
        let allowance = Self.userUnitSearchLimit - unitSearches[uid]!.directories
        guard allowance > 0 else {
            throw .limitExceeded("unit lookups of uid \(uid): \(Self.userUnitSearchLimit) cgroups a second searched; try again")
        }
        let result = own.find(named: name, limit: allowance)
        unitSearches[uid]!.directories += result.visited
        if result.cutShort, result.found.isEmpty {
            throw .limitExceeded("unit lookups of uid \(uid): \(Self.userUnitSearchLimit) cgroups a second searched; try again or give the unit's cgroup path")
        }
        return result.found.map(\.path)
    }

    /// Refuses a unit that may not be an app: by name, or as the daemon's own.
    private func requireAppUnit(_ name: String, path: String) throws(BGTaskError) {
        if let refusal = AppUnit.refusal(ofName: name) { throw .invalidParameter("unit: \(refusal)") }
        if path == resolver.ownUnit { throw .invalidParameter("unit: \(name) is bgtaskd's own unit") }
        guard AppUnit.of(cgroupPath: path, daemonUnit: resolver.ownUnit) == path else {
            throw .invalidParameter("unit: \(path) is not a unit of its own")
        }
    }

    /// Whether an unprivileged caller of `uid` owns the unit at `path`: it is delegated to it
    /// (its directory is the user's), as a user manager's units are.
    func ownsUnit(_ path: String, uid: UInt32) -> Bool {
        Cgroup.at(path: path).flatMap { try? $0.owner() } == uid
    }

    /// The process a unit app not yet registered is named after: the oldest process of the
    /// unit's shallowest cgroups that hold any (its main one, for a scope started with a
    /// command), found without listing the whole subtree. A unit holding pid 1 or the daemon
    /// is refused.
    func mainProcess(ofUnit path: String, named name: String) throws -> ProcessResolver.Resolved {
        guard let cgroup = Cgroup.at(path: path) else { throw BGTaskError.noSuchUnit(name) }
        if Cgroup.of(pid: 1)?.isWithin(cgroup) == true { throw BGTaskError.invalidParameter("unit: \(name) holds pid 1") }
        if Cgroup.of(pid: Host.pid)?.isWithin(cgroup) == true { throw BGTaskError.invalidParameter("unit: \(name) holds bgtaskd") }
        let pids = cgroup.shallowestProcesses()
        let oldest = pids.prefix(4096).compactMap { try? ProcStat.read(pid: $0) }
            .min { ($0.startTime, $0.pid) < ($1.startTime, $1.pid) }
        guard let oldest else { throw BGTaskError.noSuchUnit(name) }
        let resolved = try resolver.resolve(pid: oldest.pid)
        guard resolved.description.unit == path else { throw BGTaskError.noSuchUnit(name) }  // it moved meanwhile
        return resolved
    }
}
