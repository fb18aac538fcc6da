// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// Finding an app's processes: its own process and every descendant.
public enum ProcessTree {
    /// `members(of:owner:excluded:)` whatever the uids: every process of the tree.
    public static func members(of root: Pidfd) -> [Pidfd] {
        var excluded: [Int32] = [], unreached: [Int32] = []
        return members(of: root, owner: nil, excluded: &excluded, unreached: &unreached)
    }

    /// The process held by `root` and all its descendants, each held by a pidfd, parents
    /// before children. Membership never rests on a pid or start time alone (start times tick
    /// at 10 ms, so a pid recycled within a tick looks the same): a child counts only if,
    /// with its own pidfd open, `/proc` names it the child of a member whose pidfd is still
    /// alive. Empty when `root` has exited.
    ///
    /// Children come from `/proc/PID/task/TID/children` (cost proportional to the tree), or,
    /// where the kernel lacks those files, from one scan of every `/proc/*/stat`.
    ///
    /// With `owner`, only processes that uid may signal itself (`kill(2)`'s rule) are members,
    /// and nothing below a process that is not: a setuid program that became root, or a child
    /// that switched to another user, is never part of the app (DESIGN.md §3). Those left out
    /// are listed in `excluded`.
    ///
    /// What cannot be looked at for want of descriptors (`Errno.isShortage`: a process's pidfd,
    /// a member's list of children) is listed in `unreached`: a child by its pid, a member whose
    /// children were not read by its own.
    ///
    /// `visit` is called on each member before its children are read. Stopping a process
    /// there (`SIGSTOP`) makes the walk whole but for a fork already under way: a fork begun
    /// after the signal is sent fails and is restarted once the parent is continued, but one
    /// begun before it goes on (`copy_process` looks again for fatal signals only) and may put
    /// its child on the list after the list was read (measured, 6.18: a shell forking as fast
    /// as it could, stopped this way, had a child more on its list once stopped in 6 walks
    /// of 50). A walk made once every member is stopped (state `T`) is whole (the tests'
    /// `Spawned.killTree` walks so, and a suspended app's first stray-`SIGCONT` check looks
    /// so). `visit` returns whether the process is still there (a signal sent through its
    /// pidfd says so, `Pidfd.trySend`): one that is not is no member, and the root's pidfd is
    /// then not polled first (a poll per app suspended). A zombie takes a signal: visited, it
    /// counts as there.
    ///
    /// With `memory`, what the last walk of the tree with it held is read again where it can
    /// be (`Memory`), and what this one finds is held for the next.
    public static func members(of root: Pidfd, owner: UInt32?, excluded: inout [Int32], unreached: inout [Int32],
                               visit: ((Pidfd) -> Bool)? = nil, memory: Memory? = nil) -> [Pidfd] {
        if visit == nil, root.hasExited { return [] }
        if let owner, !belongs(root, to: owner) {
            if !root.hasExited { excluded.append(root.pid) }
            return []
        }
        let scan: [Int32: [Int32]]? = supportsChildrenFiles ? nil : scanParents()
        let memory = scan == nil ? memory : nil
        memory?.begin()
        defer { memory?.end() }
        var result = [root]
        var index = 0
        while index < result.count {
            let parent = result[index]
            if let visit, !visit(parent) {
                // Gone (reaped) since it was found: neither a member nor a parent.
                result.remove(at: index)
                continue
            }
            guard let listed = scan?[parent.pid] ?? (memory.map { $0.children(of: parent) } ?? children(of: parent.pid)) else {
                unreached.append(parent.pid)
                index += 1
                continue
            }
            for child in listed where child > 1 {
                // The child's pidfd first (nothing read with it: `open(member:)`), then its
                // parent read through it (`PIDFD_GET_INFO`, or /proc where the kernel lacks
                // it), then the parent still alive and the child too (a zombie is no member),
                // both in one poll: two were a system call a child more on the path of every
                // suspension of a walked app. (A zombie's pidfd is closed here, before the
                // next child's is opened: an app's dead children do not take the daemon's
                // descriptors from its live ones.) A pidfd the last walk held (`memory`) is
                // the child's if it passes the same checks; one that does not (its process
                // gone, the pid perhaps another's by now) is put aside and the pid opened.
                let pidfd: Pidfd
                var checked: (parentPID: Int32, uids: ProcessUIDs)?
                if let known = memory?.pidfd(of: child), isChild(known, of: parent, info: &checked) {
                    pidfd = known
                } else {
                    do {
                        pidfd = try Pidfd.open(member: child)
                    } catch {
                        if error.isShortage { unreached.append(child) }
                        continue  // else gone
                    }
                    guard isChild(pidfd, of: parent, info: &checked) else { continue }
                }
                if let owner, !(checked.map { $0.uids.signallable(by: owner) } ?? belongs(pidfd, to: owner)) {
                    excluded.append(child)
                    continue
                }
                result.append(pidfd)
            }
            index += 1
        }
        return result
    }

    /// Whether `pidfd`'s process is a child of `parent`'s and both live; `info` is what the
    /// pidfd told of it (`nil` where the kernel tells nothing: its parent came from `/proc`).
    private static func isChild(_ pidfd: Pidfd, of parent: Pidfd, info: inout (parentPID: Int32, uids: ProcessUIDs)?) -> Bool {
        info = pidfd.info
        guard let parentPID = info?.parentPID ?? (try? ProcStat.read(pid: pidfd.pid))?.parentPID else { return false }
        return parentPID == parent.pid && !Pidfd.eitherExited(parent, pidfd)
    }

    /// Every process in `cgroup` and below it, each held by a pidfd and found in the cgroup
    /// again once held (so a pid recycled meanwhile is not taken for a member); with `owner`,
    /// only those that uid may signal itself, the others listed in `excluded`. Those whose
    /// pidfd could not be had for want of descriptors are listed in `unreached`. At most
    /// `limit` cgroups are looked into (the owner makes those below a delegated one);
    /// `complete` is set to false if there were more.
    public static func members(of cgroup: Cgroup, owner: UInt32?, excluded: inout [Int32], unreached: inout [Int32],
                               cgroupsAtMost limit: Int, complete: inout Bool) -> [Pidfd] {
        var result: [Pidfd] = []
        let listed = (try? cgroup.processes(cgroupsAtMost: limit)) ?? (pids: [], complete: true)
        if !listed.complete { complete = false }
        for pid in listed.pids where pid > 1 {
            let pidfd: Pidfd
            do {
                pidfd = try Pidfd.open(pid: pid)
            } catch {
                if error.isShortage { unreached.append(pid) }
                continue
            }
            guard let current = Cgroup.of(pid: pid), current.isWithin(cgroup), !pidfd.hasExited else { continue }
            if let owner, !belongs(pidfd, to: owner) {
                excluded.append(pid)
                continue
            }
            result.append(pidfd)
        }
        return result
    }

    /// `belongs` for a process held by a pidfd (`Pidfd.uids`): from the pidfd where the
    /// kernel can; an exited one belongs to nobody.
    public static func belongs(_ pidfd: Pidfd, to owner: UInt32) -> Bool {
        pidfd.uids?.signallable(by: owner) ?? false
    }

    /// Whether `/proc/PID/task/TID/children` exists (`CONFIG_PROC_CHILDREN`).
    public static let supportsChildrenFiles: Bool = {
        let pid = getpid()
        return access("/proc/\(pid)/task/\(pid)/children", R_OK) == 0
    }()

    /// The children of every thread of `pid`; `nil` if they could not be read for want of
    /// descriptors. On the path of every suspension of every app.
    ///
    /// A process of one thread (most are) has one list, `/proc/PID/task/PID/children`, opened
    /// by its path once a `stat` of `/proc/PID/task` has counted the threads (its link count
    /// is 2 + the threads, `proc_task_getattr`): two system calls fewer than the directory's
    /// open, read and close, 4 of a walked app's 21 for foot and its shell (a suspension of
    /// uid 65534's walked apps of two processes cost the daemon 51–52 µs of CPU, not 59–61:
    /// the fastest of 30 bursts of 200, in turns). The count holds for a member the walk has
    /// stopped (`visit`): a process with a stop pending starts no new thread (a clone begun
    /// after the signal fails and is restarted once it is continued; one under way already
    /// may finish, as a fork may: see `members`), and the children of a thread that exited
    /// are its group's remaining thread's. Unvisited, the walk is a look at one moment either
    /// way: a thread started after the directory was read went unseen as well.
    ///
    /// Otherwise `/proc/PID/task` is held while its threads' lists are opened through it
    /// (`openat` of `TID/children`: a lookup of two names, not of five, each checking the
    /// process again), the thread ids come from `getdents64(2)` and the pids from the bytes,
    /// with no `String` for a path or a name (`opendir` costs an `fstat` more, and a string
    /// per entry).
    /// (`readSize`: for tests, a number split between reads.)
    public static func children(of pid: Int32, readSize: Int = 4096) -> [Int32]? {
        if threads(of: pid) == 1 {
            let fd = withPath({ $0.append("/proc/"); $0.append(pid); $0.append("/task/"); $0.append(pid); $0.append("/children") }) {
                open($0, O_RDONLY | O_CLOEXEC)
            }
            guard fd >= 0 else { return Errno.current("open").isShortage ? nil : [] }  // else gone
            defer { Glibc.close(fd) }
            var result: [Int32] = []
            readList(fd, into: &result, readSize: readSize)
            return result
        }
        let task = withPath({ $0.append("/proc/"); $0.append(pid); $0.append("/task") }) {
            open($0, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        }
        guard task >= 0 else { return Errno.current("open").isShortage ? nil : [] }
        defer { Glibc.close(task) }
        var result: [Int32] = []
        for thread in numberedEntries(of: task) {
            let fd = withPath({ $0.append(thread); $0.append("/children") }) { openat(task, $0, O_RDONLY | O_CLOEXEC) }
            guard fd >= 0 else {
                if Errno.current("open").isShortage { return nil }
                continue  // the thread is gone
            }
            defer { Glibc.close(fd) }
            readList(fd, into: &result, readSize: readSize)
        }
        return result
    }

    /// The threads of `pid` (`/proc/PID/task`'s link count less 2); `nil` if it cannot be
    /// looked at (gone, or /proc hides it).
    static func threads(of pid: Int32) -> Int? {
        var status = stat()
        let looked = withPath({ $0.append("/proc/"); $0.append(pid); $0.append("/task") }) { fstatat(AT_FDCWD, $0, &status, 0) }
        return looked == 0 && status.st_nlink > 2 ? Int(status.st_nlink) - 2 : nil
    }

    /// A list of children open at `fd`, appended to `result`: pids separated by spaces, read
    /// 4 KiB at a time (a number may straddle two reads) to its end, at most
    /// `maximumListBytes` of them.
    ///
    /// A read short of what was asked is not the end: the list is a `seq_file`, filled a
    /// page at a time with whole records, and a record that does not fit what is left of the
    /// page ends that read (4,092 bytes of 4,096, measured: a list of 1,500 children came as
    /// 4,092, 4,092 and 816). Stopping there, as this did until the forty-first round, left
    /// every child after the first ~580 out of the walk: a process app with more children
    /// had the rest neither stopped nor killed. The end is a read that leaves room for another
    /// record (`recordRoom`: a pid and its space) or returns nothing.
    static func readList(_ fd: Int32, into result: inout [Int32], readSize: Int) {
        var value: Int32 = 0, digits = 0, total = 0
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: readSize) { buffer in
            while total < maximumListBytes {
                // From the list's start, whatever was read of it before (a held list).
                let count = pread(fd, buffer.baseAddress, buffer.count, off_t(total))
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { return }
                total += count
                for byte in buffer[..<count] {
                    if byte >= 0x30, byte <= 0x39, digits < 9 {
                        value = value * 10 + Int32(byte - 0x30)
                        digits += 1
                    } else {
                        if digits > 0 { result.append(value) }
                        value = 0
                        digits = 0
                    }
                }
                if count <= buffer.count - recordRoom { break }
            }
        }
        if digits > 0 { result.append(value) }
    }

    /// The most a child takes in a list: ten digits and a space (pids are at most 2^22 on
    /// Linux, seven digits; the room is kept for any `int`).
    static let recordRoom = 11

    /// The most of one thread's list of children read (about 150,000 pids), as `readFile`
    /// reads at most: a walk's memory stays bounded whatever a process forks.
    static let maximumListBytes = 1 << 20

    /// A path of at most 63 bytes built in place (`/proc/PID/task/PID/children` and its
    /// pieces), NUL ended, for `body`.
    struct PathBuilder {
        let bytes: UnsafeMutableBufferPointer<CChar>
        var count = 0
        mutating func append(_ text: StaticString) {
            text.withUTF8Buffer { for byte in $0 where count < bytes.count - 1 { bytes[count] = CChar(bitPattern: byte); count += 1 } }
        }
        mutating func append(_ number: Int32) {
            var place: Int32 = 1
            while number / place >= 10 { place *= 10 }
            while place > 0, count < bytes.count - 1 {
                bytes[count] = CChar(0x30 + (number / place) % 10)
                count += 1
                place /= 10
            }
        }
    }

    static func withPath<T>(_ build: (inout PathBuilder) -> Void, _ body: (UnsafePointer<CChar>) -> T) -> T {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { bytes in
            var path = PathBuilder(bytes: bytes)
            build(&path)
            bytes[path.count] = 0
            return body(UnsafePointer(bytes.baseAddress!))
        }
    }

    /// The names that are numbers (pids, thread ids) in the directory open at `fd`, read with
    /// `getdents64`.
    static func numberedEntries(of fd: Int32) -> [Int32] {
        var result: [Int32] = []
        var done = false
        withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 8) { buffer in
            while !done {
                let count = bgtask_getdents64(fd, buffer.baseAddress, UInt(buffer.count))
                guard count > 0 else { return }
                // The kernel fills the buffer until the next entry does not fit (one is at most
                // 280 bytes): with more than that left, this was the last of them.
                defer { if count < buffer.count - 512 { done = true } }
                var offset = 0
                // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
                while offset + 19 < count {
                    let length = Int(buffer.load(fromByteOffset: offset + 16, as: UInt16.self))
                    guard length > 0 else { return }
                    var value: Int32 = 0, digits = 0, index = offset + 19
                    while index < offset + length, buffer[index] != 0 {
                        let byte = buffer[index]
                        guard byte >= 0x30, byte <= 0x39, digits < 9 else { digits = -1; break }
                        value = value * 10 + Int32(byte - 0x30)
                        digits += 1
                        index += 1
                    }
                    if digits > 0 { result.append(value) }
                    offset += length
                }
            }
        }
        return result
    }

    /// Parent → children for every process, from one pass over `/proc/*/stat`.
    static func scanParents() -> [Int32: [Int32]] {
        var children: [Int32: [Int32]] = [:]
        for name in directoryEntries("/proc") {
            guard let pid = Int32(name), let stat = try? ProcStat.read(pid: pid) else { continue }
            children[stat.parentPID, default: []].append(pid)
        }
        return children
    }

    /// The names in a directory (without `.` and `..`).
    public static func directoryNames(_ path: String) -> [String] { directoryEntries(path) }

    static func directoryEntries(_ path: String) -> [String] {
        guard let dir = opendir(path) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = entryName(entry)
            if name != ".", name != ".." { names.append(name) }
        }
        return names
    }
}
