// SPDX-License-Identifier: Apache-2.0
import Glibc

extension ProcessTree {
    /// What a walk of one tree held of its members, for the next walk of the same tree: each
    /// member's pidfd, its `/proc/PID/task` directory and its threads' lists of children,
    /// open. The next walk reads the lists again (`pread` from their start: a list is made
    /// anew at each read) and counts the threads with an `fstat` of the held directory, where
    /// a fresh one opens, reads and closes a file by a path of five names and `stat`s another
    /// for each process, and opens a pidfd for each child (measured on this machine, 400
    /// processes: `pidfd_open` 4.3 µs, a path `stat` 4.3, an open 5.7, a `close` 2.2, a read
    /// 1.8 — a session lock's 200 windows walked were 17.6 ms of the daemon's CPU).
    ///
    /// A held file is its process's or thread's for as long as it is open (`/proc` binds it
    /// to the process, not to the pid: once the process is gone it lists nothing), and a
    /// remembered pidfd stands for a listed pid only while that process lives, so nothing a
    /// walk finds rests on a pid that may have been given to another process meanwhile: a
    /// listed pid whose remembered process has exited is opened afresh, and every child is
    /// checked through its pidfd (its parent, its owner, alive) as in a walk with no memory.
    /// A thread started since the last walk is seen by the count (the directory is listed
    /// again when there is more than one), a child forked since then by the read.
    ///
    /// Bounds: files are held only while their numbers stay below `holdBelow` (the caller's
    /// spare stays free), for at most `processesAtMost` processes of a walk (a tree of more
    /// has the rest's files opened, read and closed as a walk without memory does, not held
    /// until the caller finds the memory past its bound), and at most `listsPerProcess`
    /// threads' lists a process (the others are opened, read and closed at each walk). One
    /// thread's: the daemon's loop.
    public final class Memory {
        let holdBelow: Int
        let processesAtMost: Int
        /// The walk's members whose files are held (`processesAtMost`).
        private var holding = 0
        /// The members of the last walk, by pid.
        private(set) var members: [Int32: Member] = [:]
        /// The members of the walk under way (`begin`, `end`).
        private var walking: [Int32: Member]?

        /// The most threads' lists of children held for one process.
        public static let listsPerProcess = 4

        /// Files are held while their numbers are below `holdBelow` (0: none), for at most
        /// `processesAtMost` processes of a walk.
        public init(holdBelow: Int, processesAtMost: Int = .max) {
            self.holdBelow = holdBelow
            self.processesAtMost = processesAtMost
        }

        /// How many processes are remembered.
        public var count: Int { members.count }

        /// The descriptors held beside the remembered pidfds (directories, lists, stat files).
        public var heldFiles: Int {
            members.values.reduce(0) { $0 + ($1.task == nil ? 0 : 1) + $1.lists.count + ($1.stat == nil ? 0 : 1) }
        }

        final class Member {
            let pidfd: Pidfd
            /// `/proc/PID/task`, checked to be this process's when opened (`nil`: not held).
            var task: FileDescriptor?
            /// Thread id → that thread's `children`, open.
            var lists: [Int32: FileDescriptor] = [:]
            /// Whether the directory was looked for (held or not: not tried again).
            var opened = false
            /// `/proc/PID/stat`, for its owner's reads of the process's state (`stat(of:)`).
            var stat: FileDescriptor?

            init(_ pidfd: Pidfd) { self.pidfd = pidfd }
        }

        /// The pidfd the last walk held for `pid`: that pid's process if it still lives (its
        /// pid is then certainly its), which the walk checks as it checks a pidfd it opens.
        func pidfd(of pid: Int32) -> Pidfd? { members[pid]?.pidfd }

        /// The `/proc/PID/stat` of a remembered process, held with its other files: the one
        /// held already, or `open()`'s (kept if it gives one). `open()`'s alone for a process
        /// not remembered (held by that pidfd object).
        public func stat(of pidfd: Pidfd, open: () -> FileDescriptor?) -> FileDescriptor? {
            guard let member = members[pidfd.pid], member.pidfd === pidfd else { return open() }
            if let stat = member.stat { return stat }
            member.stat = open()
            return member.stat
        }

        func begin() {
            walking = [:]
            holding = 0
        }

        /// The walk's members become what is remembered; the rest is closed.
        func end() {
            if let walking { members = walking }
            walking = nil
        }

        /// The member held by `pidfd` (that object: a new pidfd for the same pid is another
        /// process, or was opened afresh), noted as one of the walk under way; outside a walk,
        /// only one remembered (what is remembered changes with walks only).
        private func member(_ pidfd: Pidfd) -> Member? {
            let known = members[pidfd.pid].flatMap { $0.pidfd === pidfd ? $0 : nil }
            guard walking != nil else { return known }
            let member = known ?? Member(pidfd)
            walking?[pidfd.pid] = member
            if member.task != nil { holding += 1 }
            return member
        }

        /// The children of every thread of `pidfd`'s process, read through held files where
        /// there are (opened and held where there is room, in a walk); `nil` if they could
        /// not be read for want of descriptors. As `ProcessTree.children(of:)`, which it falls
        /// back on where nothing is held.
        public func children(of pidfd: Pidfd, readSize: Int = 4096) -> [Int32]? {
            guard let member = member(pidfd) else { return ProcessTree.children(of: pidfd.pid, readSize: readSize) }
            if !member.opened, walking == nil || holding < processesAtMost {
                member.opened = true
                let fd = withPath({ $0.append("/proc/"); $0.append(pidfd.pid); $0.append("/task") }) {
                    open($0, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                }
                if fd >= 0 {
                    let task = FileDescriptor(fd)
                    // The process lived once it was open: the directory is its (a poll, once).
                    if fd < holdBelow, !pidfd.hasExited {
                        member.task = task
                        if walking != nil { holding += 1 }
                    }
                }
            }
            guard let task = member.task else { return ProcessTree.children(of: pidfd.pid, readSize: readSize) }
            var status = Glibc.stat()
            guard fstat(task.rawValue, &status) == 0 else { return [] }
            let threads = Int(status.st_nlink) - 2
            guard threads > 0 else { return [] }  // gone
            let tids: [Int32]
            if threads == 1 {
                tids = [pidfd.pid]
            } else {
                // Listed from its start again (getdents goes on from where the last read ended).
                guard lseek(task.rawValue, 0, SEEK_SET) == 0 else { return ProcessTree.children(of: pidfd.pid, readSize: readSize) }
                tids = ProcessTree.numberedEntries(of: task.rawValue)
            }
            var result: [Int32] = []
            var held: [Int32: FileDescriptor] = [:]
            for tid in tids {
                if let list = member.lists[tid] {
                    ProcessTree.readList(list.rawValue, into: &result, readSize: readSize)
                    held[tid] = list
                    continue
                }
                let fd = withPath({ $0.append(tid); $0.append("/children") }) { openat(task.rawValue, $0, O_RDONLY | O_CLOEXEC) }
                guard fd >= 0 else {
                    if Errno.current("open").isShortage { return nil }
                    continue  // the thread is gone
                }
                let list = FileDescriptor(fd)
                ProcessTree.readList(fd, into: &result, readSize: readSize)
                if fd < holdBelow, held.count < Self.listsPerProcess { held[tid] = list }
            }
            // A thread gone takes its list with it; one not listed this time (more than one
            // thread: the directory was read) is gone too.
            member.lists = held
            return result
        }
    }
}
