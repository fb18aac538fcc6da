import Glibc

/// A snapshot of every process, from `/proc/*/stat`, to find an app's descendants.
public struct ProcessTree {
    /// Every process by pid, at the time of the snapshot.
    public let processes: [Int32: ProcStat]
    private let children: [Int32: [Int32]]

    /// Reads `/proc`. Processes that exit while it is read are simply missing.
    public init() {
        var processes: [Int32: ProcStat] = [:]
        if let dir = opendir("/proc") {
            defer { closedir(dir) }
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                guard let pid = Int32(name), let stat = try? ProcStat.read(pid: pid) else { continue }
                processes[pid] = stat
            }
        }
        var children: [Int32: [Int32]] = [:]
        for stat in processes.values { children[stat.parentPID, default: []].append(stat.pid) }
        self.processes = processes
        self.children = children
    }

    /// The process held by `root` and all its descendants, each held by a pidfd, parents
    /// before children. Membership never rests on a pid or start time alone (start times tick
    /// at 10 ms, so a pid recycled within a tick looks the same): a child counts only if,
    /// with its own pidfd open, `/proc` names it the child of a member whose pidfd is still
    /// alive. Empty when `root` has exited.
    public func members(of root: Pidfd) -> [Pidfd] {
        guard !root.hasExited else { return [] }
        var result = [root]
        var index = 0
        while index < result.count {
            let parent = result[index]
            for child in children[parent.pid] ?? [] where child > 1 {
                guard let pidfd = try? Pidfd.open(pid: child),
                      let stat = try? ProcStat.read(pid: child), stat.parentPID == parent.pid,
                      !parent.hasExited, !pidfd.hasExited else { continue }
                result.append(pidfd)
            }
            index += 1
        }
        return result
    }
}
