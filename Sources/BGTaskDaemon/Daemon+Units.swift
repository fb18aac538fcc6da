import BGTaskCore
import BGTaskSystem

/// Managers naming apps by unit (DESIGN.md §2a): a unit name such as `app-foo.scope`, or
/// the unit's cgroup path when two managers (the system's and a user's) use one name.
extension Daemon {
    /// Directories looked at when finding a unit's cgroup by name: the search is bounded,
    /// whoever asks.
    static let unitSearchLimit = 10_000

    /// The cgroup path of the app unit `name` names. `InvalidParameter` for what cannot be an
    /// app (a slice, `init.scope`, a session, a user manager, the daemon's own unit, a
    /// malformed name) or a name two units share; `NoSuchApp` for no such unit.
    func unitPath(named name: String) throws(BGTaskError) -> String {
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
        let known = model.unitPaths(named: name)
        let found = known.isEmpty ? Cgroup.find(named: name, limit: Self.unitSearchLimit).map(\.path) : known
        for path in found { try requireAppUnit(name, path: path) }
        guard let path = found.first else { throw .noSuchUnit(name) }
        guard found.count == 1 else {
            throw .invalidParameter("unit: \(name) names \(found.count) cgroups (\(found.sorted().joined(separator: ", "))); give its cgroup path")
        }
        return path
    }

    /// Refuses a unit that may not be an app: by name, or as the daemon's own.
    private func requireAppUnit(_ name: String, path: String) throws(BGTaskError) {
        if let refusal = AppUnit.refusal(ofName: name) { throw .invalidParameter("unit: \(refusal)") }
        if path == resolver.ownUnit { throw .invalidParameter("unit: \(name) is bgtaskd's own unit") }
        guard AppUnit.of(cgroupPath: path, daemonUnit: resolver.ownUnit) == path else {
            throw .invalidParameter("unit: \(path) is not a unit of its own")
        }
    }

    /// The process a unit app not yet registered is named after: the unit's oldest process
    /// (its main one, for a scope started with a command). A unit holding pid 1 or the daemon
    /// is refused.
    func mainProcess(ofUnit path: String, named name: String) throws -> ProcessResolver.Resolved {
        guard let cgroup = Cgroup.at(path: path), let pids = try? cgroup.processes() else { throw BGTaskError.noSuchUnit(name) }
        if pids.contains(1) { throw BGTaskError.invalidParameter("unit: \(name) holds pid 1") }
        if pids.contains(Host.pid) { throw BGTaskError.invalidParameter("unit: \(name) holds bgtaskd") }
        let oldest = pids.compactMap { try? ProcStat.read(pid: $0) }.min { ($0.startTime, $0.pid) < ($1.startTime, $1.pid) }
        guard let oldest else { throw BGTaskError.noSuchUnit(name) }
        let resolved = try resolver.resolve(pid: oldest.pid)
        guard resolved.description.unit == path else { throw BGTaskError.noSuchUnit(name) }  // it moved meanwhile
        return resolved
    }
}
