// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A cgroup v2 directory: freeze, thaw, kill, list its processes.
public struct Cgroup: Equatable, Sendable {
    /// The absolute directory, e.g. `/sys/fs/cgroup/user.slice/app-42.scope`.
    public let directory: String

    public init(directory: String) { self.directory = directory }

    /// Where cgroup v2 is mounted, from `/proc/self/mountinfo` (never assumed: hybrid
    /// systems mount it at `/sys/fs/cgroup/unified`). `nil` without cgroup v2.
    public static let mountPoint: String? = {
        guard let bytes = try? readFile("/proc/self/mountinfo") else { return nil }
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
            // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPEROPTIONS"
            let halves = line.split(separator: " - ", maxSplits: 1)
            guard halves.count == 2, halves[1].hasPrefix("cgroup2 ") else { continue }
            let fields = halves[0].split(separator: " ")
            if fields.count >= 5, fields[3] == "/" { return unescape(String(fields[4])) }
        }
        return nil
    }()

    /// mountinfo escapes spaces and the like as `\040`.
    static func unescape(_ field: String) -> String {
        var out: [UInt8] = []
        let bytes = Array(field.utf8)
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "\\"), index + 3 < bytes.count,
               let value = UInt8(String(decoding: bytes[(index + 1)...(index + 3)], as: UTF8.self), radix: 8) {
                out.append(value)
                index += 4
            } else {
                out.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The cgroup v2 of `pid` (the `0::` line of `/proc/PID/cgroup`), or `nil`. Read on
    /// every connection's caller resolution: the file is scanned as bytes (`unifiedPath`).
    public static func of(pid: Int32) -> Cgroup? {
        guard let root = mountPoint, let bytes = try? readFile("/proc/\(pid)/cgroup", shortReadEnds: true),
              let path = unifiedPath(in: bytes) else { return nil }
        return Cgroup(directory: path == "/" ? root : root + path)
    }

    /// The path of the `0::` line of a `/proc/PID/cgroup` file (`nil` without one). A byte
    /// scan: split into `String` lines (a hybrid host lists a dozen hierarchies) it cost
    /// ~74,000 instructions more, over half of a connection's (callgrind: 137,511 → 63,081).
    static func unifiedPath(in bytes: [UInt8]) -> String? {
        let newline = UInt8(ascii: "\n"), zero = UInt8(ascii: "0"), colon = UInt8(ascii: ":")
        var start = 0
        while start < bytes.count {
            let end = bytes[start...].firstIndex(of: newline) ?? bytes.count
            if end - start >= 3, bytes[start] == zero, bytes[start + 1] == colon, bytes[start + 2] == colon {
                return String(decoding: bytes[(start + 3)..<end], as: UTF8.self)
            }
            start = end + 1
        }
        return nil
    }

    /// Whether this is the root of the hierarchy (never frozen: it holds everything).
    public var isRoot: Bool { directory == Cgroup.mountPoint }

    /// The path below the mount point, as `/proc/PID/cgroup` shows it (`/` for the root).
    public var path: String {
        guard let root = Cgroup.mountPoint, directory.hasPrefix(root) else { return directory }
        let rest = String(directory.dropFirst(root.count))
        return rest.isEmpty ? "/" : rest
    }

    /// The cgroup at `path` below the mount point; `nil` without cgroup v2.
    public static func at(path: String) -> Cgroup? {
        mountPoint.map { Cgroup(directory: path == "/" ? $0 : $0 + path) }
    }

    /// Whether this cgroup is `other` or below it.
    public func isWithin(_ other: Cgroup) -> Bool {
        directory == other.directory || directory.hasPrefix(other.directory + "/")
    }

    /// Every directory named `name` in the hierarchy, breadth first, looking at no more than
    /// `limit` directories: how a unit's cgroup is found without asking systemd.
    public static func find(named name: String, limit: Int = 100_000) -> [Cgroup] {
        guard let root = mountPoint else { return [] }
        return Cgroup(directory: root).find(named: name, limit: limit).found
    }

    /// Every directory named `name` below this one, breadth first, looking at no more than
    /// `limit` directories; `cutShort` when the limit stopped the search before the tree did.
    public func find(named name: String, limit: Int) -> (found: [Cgroup], visited: Int, cutShort: Bool) {
        find(where: { $0.hasSuffix("/" + name) }, limit: limit)
    }

    /// Every directory below this one whose path satisfies `matches`, breadth first, looking
    /// at no more than `limit` directories; `cutShort` when the limit stopped the search.
    public func find(where matches: (String) -> Bool, limit: Int) -> (found: [Cgroup], visited: Int, cutShort: Bool) {
        var queue = [directory], index = 0, found: [Cgroup] = []
        var cutShort = false
        while index < queue.count {
            guard index < limit else {
                cutShort = true
                break
            }
            let directory = queue[index]
            index += 1
            for child in Cgroup(directory: directory).subdirectories() {
                if matches(child) { found.append(Cgroup(directory: child)) }
                if queue.count < limit { queue.append(child) } else { cutShort = true }
            }
        }
        return (found, index, cutShort)
    }

    /// The pids of the shallowest cgroups at or below this one that hold any, looking at no
    /// more than `limit` directories: where a scope's main process is, without listing a
    /// subtree of thousands.
    public func shallowestProcesses(limit: Int = 64) -> [Int32] {
        var level = [directory], visited = 0
        while !level.isEmpty, visited < limit {
            var pids: [Int32] = [], next: [String] = []
            for directory in level where visited < limit {
                visited += 1
                if let bytes = try? readFile(directory + "/cgroup.procs") {
                    pids += String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { Int32($0) }
                }
                if pids.isEmpty { next += Cgroup(directory: directory).subdirectories() }
            }
            if !pids.isEmpty { return pids }
            level = next
        }
        return []
    }

    /// The pids in this cgroup and every cgroup below it.
    public func processes() throws(Errno) -> [Int32] {
        try processes(cgroupsAtMost: .max).pids
    }

    /// The pids in this cgroup and the cgroups below it, looking into at most `limit` cgroups
    /// (this one first); `complete` is false if there were more.
    public func processes(cgroupsAtMost limit: Int) throws(Errno) -> (pids: [Int32], complete: Bool) {
        var pids: [Int32] = []
        var cgroups = limit
        let cutShort = try visitProcesses(readingBy: 4096, cgroups: &cgroups) { pids.append($0); return false }
        return (pids, !cutShort)
    }

    /// How many live cgroups are below this one (`cgroup.stat`'s `nr_descendants`): the
    /// kernel's count, one small read, no walk. Opened with `O_NOFOLLOW`, as `cgroup.procs`
    /// is: the directory may be its owner's.
    public func descendantCount() throws(Errno) -> Int {
        let text = try open("cgroup.stat", O_RDONLY | O_NOFOLLOW, parents: nil).read(upTo: 4096)
        for line in String(decoding: text, as: UTF8.self).split(separator: "\n") where line.hasPrefix("nr_descendants ") {
            if let count = Int(line.dropFirst("nr_descendants ".count)) { return count }
        }
        throw Errno(EINVAL, "cgroup.stat of \(directory) has no nr_descendants")
    }

    /// What `firstProcess` found.
    public enum Search: Equatable, Sendable {
        case found(Int32)
        /// Every process looked at, none matching.
        case none
        /// More cgroups than the look was allowed: it stopped there.
        case tooManyCgroups
    }

    /// The first pid in this cgroup or below it for which `matches` holds, looking into at
    /// most `limit` cgroups (this one first). `cgroup.procs` is read a few lines at a time,
    /// and no further than that pid: the kernel lists a cgroup's processes as they are read
    /// (the whole list of a cgroup of 10,000 took 4.3–7.5 ms here, its first 64 bytes
    /// 30–45 µs; of 300, 86 µs and 11 µs), and one process that is not an app's is all a look
    /// at a shared cgroup needs. `matches` is called with every pid looked at, in order.
    public func firstProcess(where matches: (Int32) -> Bool, cgroupsAtMost limit: Int = .max) throws(Errno) -> Search {
        var found: Int32?
        var cgroups = limit
        let stopped = try visitProcesses(readingBy: 128, cgroups: &cgroups) { pid in
            if matches(pid) { found = pid }
            return found != nil
        }
        if let found { return .found(found) }
        return stopped ? .tooManyCgroups : .none
    }

    /// Calls `visit` with each pid of this cgroup, then of the cgroups below it, until it
    /// returns true or `cgroups` (counted down, one a cgroup) runs out; returns whether it
    /// stopped early.
    private func visitProcesses(readingBy size: Int, cgroups: inout Int, _ visit: (Int32) -> Bool) throws(Errno) -> Bool {
        guard cgroups > 0 else { return true }
        cgroups -= 1
        let path = directory + "/cgroup.procs"
        let file = FileDescriptor(try systemCall("open(\(path))") { Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) })
        var pid: Int32 = 0, digits = false
        while case let chunk = try file.read(upTo: size), !chunk.isEmpty {
            for byte in chunk {
                if byte == UInt8(ascii: "\n") {
                    if digits, visit(pid) { return true }
                    (pid, digits) = (0, false)
                } else if byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                    (pid, digits) = (pid &* 10 &+ Int32(byte - UInt8(ascii: "0")), true)
                }
            }
        }
        if digits, visit(pid) { return true }
        file.close()  // before the cgroups below: one descriptor at a time, however deep
        for child in subdirectories() where try Cgroup(directory: child).visitProcesses(readingBy: size, cgroups: &cgroups, visit) {
            return true
        }
        return false
    }

    private func subdirectories() -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var result: [String] = []
        while let entry = readdir(dir) {
            guard entry.pointee.d_type == UInt8(DT_DIR) else { continue }
            let name = entryName(entry)
            if name != ".", name != ".." { result.append(directory + "/" + name) }
        }
        return result
    }

    /// Asks the kernel to freeze (or thaw) every process in the subtree; it happens
    /// asynchronously: see `isFrozen`. `cgroup.freeze`, opened from its parent's descriptor
    /// when `parents` holds one.
    public func setFrozen(_ frozen: Bool, parents: CgroupParents? = nil) throws(Errno) {
        try write(frozen ? "1" : "0", to: "cgroup.freeze", parents: parents)
    }

    /// Whether this cgroup's own `cgroup.freeze` says `1` (what was asked of it; `isFrozen`
    /// is what the kernel did, which an ancestor's freeze also makes true).
    public func freezeRequested() throws(Errno) -> Bool {
        String(decoding: try readFile(directory + "/cgroup.freeze"), as: UTF8.self).hasPrefix("1")
    }

    /// `frozen 1` in `cgroup.events`.
    public func isFrozen() throws(Errno) -> Bool {
        Self.isFrozen(events: try readFile(directory + "/cgroup.events"))
    }

    /// Whether `cgroup.events` text (read from a descriptor kept open: `openEvents`) says
    /// `frozen 1`.
    public static func isFrozen(events: [UInt8]) -> Bool {
        // A line that is exactly "frozen 1", found in the bytes: read once per freeze
        // confirmed, a String and an array of its lines were a twentieth of a freezer burst.
        var start = 0
        while start < events.count {
            let end = events[start...].firstIndex(of: UInt8(ascii: "\n")) ?? events.count
            if events[start..<end].elementsEqual("frozen 1".utf8) { return true }
            start = end + 1
        }
        return false
    }

    /// The uid that owns `cgroup.freeze`: the user this cgroup is delegated to (root for
    /// cgroups nobody delegated). `fstatat(2)`
    public func freezeOwner(parents: CgroupParents? = nil) throws(Errno) -> UInt32 {
        if let parents { return try parents.owner(of: "cgroup.freeze", of: self) }
        var st = stat()
        let path = directory + "/cgroup.freeze"
        try systemCall("stat(\(path))") { stat(path, &st) }
        return st.st_uid
    }

    /// The uid that owns the directory: the user it is delegated to (a user manager's
    /// subtree is its user's). `stat(2)`
    public func owner() throws(Errno) -> UInt32 {
        var st = stat()
        try systemCall("stat(\(directory))") { stat(directory, &st) }
        return st.st_uid
    }

    /// Which cgroup is at this path now: its directory's inode (the kernel's cgroup id, never
    /// reused while the machine runs) and, where systemd set it, the invocation of its unit
    /// (`user.invocation_id`; `trusted.` needs `CAP_SYS_ADMIN`). systemd makes a service's
    /// cgroup again when the service starts again (systemd 252), and starts it in the one it
    /// had, with a new invocation, when processes were left in it. The invocation counts only
    /// on a cgroup root owns: the user a cgroup is delegated to can set its own (uid 65534
    /// did, on its unit's). `nil`: none there. `stat(2)`, `getxattr(2)`
    public func instance() -> Instance? {
        var st = stat()
        guard stat(directory, &st) == 0 else { return nil }
        var id = [UInt8](repeating: 0, count: 64)
        let length = st.st_uid == 0 ? getxattr(directory, "user.invocation_id", &id, id.count) : -1
        return Instance(inode: UInt64(st.st_ino), invocation: length > 0 ? Array(id.prefix(length)) : nil)
    }

    /// A cgroup at its path (`instance()`): another one there is another instance of its unit.
    public struct Instance: Equatable, Sendable {
        public let inode: UInt64
        public let invocation: [UInt8]?

        public init(inode: UInt64, invocation: [UInt8]?) {
            self.inode = inode
            self.invocation = invocation
        }
    }

    /// Kills every process in the subtree with `SIGKILL`, atomically. `cgroup.kill`
    public func kill() throws(Errno) {
        try write("1", to: "cgroup.kill")
    }

    /// A descriptor on `cgroup.events` that polls `EPOLLPRI` when the events change.
    public func openEvents(parents: CgroupParents? = nil) throws(Errno) -> FileDescriptor {
        try open("cgroup.events", O_RDONLY, parents: parents)
    }

    /// `cgroup.freeze` opened for writing, to freeze and thaw through (`setFrozen(_:through:)`)
    /// without an open each time.
    public func openFreeze(parents: CgroupParents? = nil) throws(Errno) -> FileDescriptor {
        try open("cgroup.freeze", O_WRONLY, parents: parents)
    }

    /// Writes `1` (or `0`) to a `cgroup.freeze` held open (`openFreeze`): what `setFrozen`
    /// does, less the open and close (a kernfs open walks the path and allocates the file:
    /// 20 % of the daemon's time in a burst of 9,872 freezes, `perf`). At offset 0: a cgroup
    /// file takes each write whole, wherever the offset, and this keeps it from growing.
    /// `pwrite(2)`
    public static func setFrozen(_ frozen: Bool, through freeze: FileDescriptor) throws(Errno) {
        var value: UInt8 = frozen ? 0x31 : 0x30
        let fd = freeze.rawValue
        _ = try systemCall("write(cgroup.freeze)") { pwrite(fd, &value, 1, 0) }
    }

    private func write(_ value: String, to file: String, parents: CgroupParents? = nil) throws(Errno) {
        _ = try open(file, O_WRONLY, parents: parents).writeFile(Array(value.utf8))
    }

    private func open(_ file: String, _ flags: Int32, parents: CgroupParents?) throws(Errno) -> FileDescriptor {
        if let parents { return try parents.open(file, of: self, flags) }
        let path = directory + "/" + file
        return FileDescriptor(try systemCall("open(\(path))") { Glibc.open(path, flags | O_CLOEXEC) })
    }
}

/// Cgroup directories held open (`O_PATH`) to open their children's files from: a walk of
/// two names instead of the whole path's (every component of a kernfs path is looked up and
/// permission-checked; `/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/
/// app-foot-42.scope/cgroup.freeze` is eight). The apps of a session share a parent (its
/// `app.slice`), so a few are held, at most `limit` (all let go when it is reached). A
/// cgroup's parent never changes (cgroup v2 renames nothing); a held directory removed and
/// made again finds nothing, and is opened again once.
public final class CgroupParents {
    private var held: [String: FileDescriptor] = [:]
    private let limit: Int

    public init(limit: Int = 64) { self.limit = limit }

    /// `file` of `cgroup`, opened with `flags` (and `O_CLOEXEC`) from its parent's descriptor.
    /// `openat(2)`
    public func open(_ file: String, of cgroup: Cgroup, _ flags: Int32) throws(Errno) -> FileDescriptor {
        FileDescriptor(try relative(file, of: cgroup, "open") { openat($0, $1, flags | O_CLOEXEC) })
    }

    /// The uid that owns `file` of `cgroup`. `fstatat(2)`
    public func owner(of file: String, of cgroup: Cgroup) throws(Errno) -> UInt32 {
        var st = stat()
        try relative(file, of: cgroup, "stat") { fstatat($0, $1, &st, 0) }
        return st.st_uid
    }

    /// `call` on the directory descriptor of `cgroup`'s parent and the path of `file` from
    /// it (the whole path and `AT_FDCWD` for a cgroup with no parent to hold).
    @discardableResult
    private func relative(_ file: String, of cgroup: Cgroup, _ operation: String,
                          _ call: (Int32, UnsafePointer<CChar>) -> Int32) throws(Errno) -> Int32 {
        let directory = cgroup.directory
        guard let slash = directory.utf8.lastIndex(of: UInt8(ascii: "/")), slash != directory.utf8.startIndex else {
            let path = directory + "/" + file
            return try systemCall("\(operation)(\(path))") { call(AT_FDCWD, path) }
        }
        let parent = String(directory[..<slash])
        let relative = String(directory[directory.index(after: slash)...]) + "/" + file
        var fresh = false
        while true {
            let dir: FileDescriptor
            if let known = held[parent] {
                dir = known
            } else {
                if held.count >= limit { held.removeAll() }
                dir = FileDescriptor(try systemCall("open(\(parent))") { Glibc.open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC) })
                held[parent] = dir
                fresh = true
            }
            let result = call(dir.rawValue, relative)
            if result >= 0 { return result }
            let error = Errno.current("\(operation)(\(directory)/\(file))")
            guard error.code == EINTR || (error.code == ENOENT && !fresh) else { throw error }
            if error.code == ENOENT { held[parent] = nil }  // perhaps removed and made again
        }
    }

    /// How many directories are held (for tests).
    public var count: Int { held.count }
}
