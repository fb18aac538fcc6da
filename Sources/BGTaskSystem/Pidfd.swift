// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A process held by pidfd: signals sent through it can never reach a recycled pid.
public final class Pidfd: @unchecked Sendable {
    /// The pidfd; readable once the process has exited.
    public let descriptor: FileDescriptor
    /// The pid the pidfd refers to.
    public let pid: Int32
    /// The process's start time (clock ticks after boot), read while the pidfd was held; 0
    /// for a process `open(member:)` opened that had exited before it was first asked.
    public var startTime: UInt64 { identity.startTime }
    /// The pidfd's inode on pidfs (Linux ≥ 6.9): unique per process for the boot, so two
    /// processes on one pid never share it, even when they started within one clock tick.
    /// 0 on older kernels, where every pidfd is the same anonymous inode.
    public var inode: UInt64 { identity.inode }

    /// Read at opening, or for `open(member:)` when first asked (one thread's pidfds: the
    /// daemon's loop, which walks trees).
    private var knownIdentity: (startTime: UInt64, inode: UInt64)?

    private var identity: (startTime: UInt64, inode: UInt64) {
        if let knownIdentity { return knownIdentity }
        // While the process lives, /proc/PID is it; once it has exited, the pid may be
        // another's, and its start time is not read.
        let startTime = (try? ProcStat.read(pid: pid)).map { hasExited ? 0 : $0.startTime } ?? 0
        let read = (startTime: startTime, inode: Self.pidfsInode(descriptor))
        knownIdentity = read
        return read
    }

    private init(descriptor: FileDescriptor, pid: Int32, startTime: UInt64) {
        self.descriptor = descriptor
        self.pid = pid
        self.knownIdentity = (startTime, Self.pidfsInode(descriptor))
    }

    private init(unidentified descriptor: FileDescriptor, pid: Int32) {
        self.descriptor = descriptor
        self.pid = pid
    }

    /// `PIDFS_MAGIC` from `<linux/magic.h>`.
    static let pidfsMagic = 0x5049_4446

    /// `fstatfs(2)` says whether the pidfd lives on pidfs (asked once: it is the kernel's
    /// property, not the process's); `fstat(2)` gives its inode.
    private static func pidfsInode(_ descriptor: FileDescriptor) -> UInt64 {
        if onPidfs == nil {
            var fs = statfs()
            onPidfs = fstatfs(descriptor.rawValue, &fs) == 0 && Int(fs.f_type) == pidfsMagic
        }
        var st = stat()
        guard onPidfs == true, fstat(descriptor.rawValue, &st) == 0 else { return 0 }
        return UInt64(st.st_ino)
    }

    nonisolated(unsafe) private static var onPidfs: Bool?

    /// The process's parent and uids, from the pidfd (`PIDFD_GET_INFO`, Linux 6.13): one
    /// `ioctl` where `/proc/PID/stat` and `status` are a read and a parse each. `nil` if the
    /// process has exited or the kernel lacks it.
    public var info: (parentPID: Int32, uids: ProcessUIDs)? {
        guard Self.hasInfo else { return nil }
        var info = bgtask_pidfd_info()
        let result = bgtask_pidfd_info(descriptor.rawValue, &info)
        if result == -ENOTTY || result == -EINVAL {
            Self.hasInfo = false
            return nil
        }
        guard result == 0 else { return nil }
        return (Int32(bitPattern: info.ppid), ProcessUIDs(real: info.ruid, effective: info.euid, saved: info.suid))
    }

    nonisolated(unsafe) private static var hasInfo = true

    /// Opens a pidfd for `pid` and reads its start time. `ESRCH` if there is no such process.
    /// pid 0, negative pids and pid 1 are refused with `EPERM` before any system call.
    /// `pidfd_open(2)`
    public static func open(pid: Int32) throws(Errno) -> Pidfd {
        try openReading(pid: pid).pidfd
    }

    /// Opens a pidfd for `pid` and nothing else: for a tree's walk, which finds each child
    /// under its parent and checks it through the pidfd (`ProcessTree.members`), and signals
    /// it; its start time and inode are read if asked (four system calls a child fewer on
    /// the path of every suspension of a process app without a connector). May hold a process
    /// that has exited. pid 0, negative pids and pid 1 are refused with `EPERM`.
    public static func open(member pid: Int32) throws(Errno) -> Pidfd {
        guard pid > 1 else { throw Errno(EPERM, "pidfd_open(\(pid)): refusing pid \(pid)") }
        let fd = try systemCall("pidfd_open(\(pid))") { pidfd_open(pid, 0) }
        return Pidfd(unidentified: FileDescriptor(fd), pid: pid)
    }

    /// Opens a pidfd for our own child, which may already have exited: until we reap it, its
    /// pid cannot be reused, so the pidfd is certainly for it.
    public static func open(child pid: Int32) throws(Errno) -> Pidfd {
        let fd = try systemCall("pidfd_open(\(pid))") { pidfd_open(pid, 0) }
        let stat = try ProcStat.read(pid: pid)
        return Pidfd(descriptor: FileDescriptor(fd), pid: pid, startTime: stat.startTime)
    }

    /// Takes a pidfd received from the kernel (e.g. `SO_PEERPIDFD`).
    public static func adopt(_ descriptor: FileDescriptor) throws(Errno) -> Pidfd {
        try adopt(descriptor, pid: pid(of: descriptor)).pidfd
    }

    /// The pid a pidfd refers to: by `PIDFD_GET_INFO` (Linux 6.13), one `ioctl` where
    /// `/proc/self/fdinfo` is an open, two reads and a close (each connection's peer is named
    /// so), else by `fdinfo`. `ESRCH` once the process has exited.
    static func pid(of descriptor: FileDescriptor) throws(Errno) -> Int32 {
        if hasInfo {
            var info = bgtask_pidfd_info()
            let result = bgtask_pidfd_info(descriptor.rawValue, &info)
            if result == -ESRCH { throw Errno(ESRCH, "pidfd \(descriptor.rawValue): process has exited") }
            if result == 0, info.tgid > 0 { return Int32(bitPattern: info.tgid) }
            if result == -ENOTTY || result == -EINVAL { hasInfo = false }
        }
        return try pidFromFdinfo(descriptor)
    }

    /// The pid of a pidfd from `/proc/self/fdinfo` (`Pid:`, -1 once the process has exited).
    static func pidFromFdinfo(_ descriptor: FileDescriptor) throws(Errno) -> Int32 {
        let text = String(decoding: try readFile("/proc/self/fdinfo/\(descriptor.rawValue)"), as: UTF8.self)
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Pid:") }),
              let pid = Int32(line.dropFirst(4).filter { $0 != " " && $0 != "\t" }) else {
            throw Errno(EINVAL, "fdinfo of pidfd \(descriptor.rawValue)")
        }
        guard pid > 0 else { throw Errno(ESRCH, "pidfd \(descriptor.rawValue): process has exited") }
        return pid
    }

    /// Opens a pidfd for `pid` and returns it with the `/proc/PID/stat` its start time was
    /// read from: the pidfd's process's (it reported no exit after the read). For a walk up a
    /// tree, which wants the parent's parent and command too: `open(pid:)` and a read after
    /// it read the file twice. pid 0, negative pids and pid 1 are refused with `EPERM`.
    public static func openReading(pid: Int32) throws(Errno) -> (pidfd: Pidfd, stat: ProcStat) {
        guard pid > 1 else { throw Errno(EPERM, "pidfd_open(\(pid)): refusing pid \(pid)") }
        let fd = try systemCall("pidfd_open(\(pid))") { pidfd_open(pid, 0) }
        return try adopt(FileDescriptor(fd), pid: pid)
    }

    private static func adopt(_ descriptor: FileDescriptor, pid: Int32) throws(Errno) -> (pidfd: Pidfd, stat: ProcStat) {
        let stat = try ProcStat.read(pid: pid)
        let pidfd = Pidfd(descriptor: descriptor, pid: pid, startTime: stat.startTime)
        // If the process is still alive now, /proc/PID was it (its pid cannot have been reused).
        guard !pidfd.hasExited else { throw Errno(ESRCH, "pid \(pid) exited") }
        return (pidfd, stat)
    }

    /// The process's uids: from the pidfd (`info`), else `/proc/PID/status` read while the
    /// pidfd reports no exit (so not a recycled pid's). `nil` if it has exited.
    public var uids: ProcessUIDs? {
        if let info { return info.uids }
        guard let uids = try? ProcStatus.uids(pid: pid), !hasExited else { return nil }
        return uids
    }

    /// This process's `/proc/PID/stat`, open, for `ProcStat.read(held:)`: checked to be its
    /// (the pidfd reported no exit once it was open, so the pid was not yet another's). `nil`
    /// if the process has exited or the open failed.
    public func openStat() -> FileDescriptor? {
        let fd = Glibc.open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        let file = FileDescriptor(fd)
        return hasExited ? nil : file
    }

    /// Whether the process has exited (the pidfd polls readable).
    public var hasExited: Bool {
        (try? descriptor.waitReadable(timeoutMilliseconds: 0)) ?? true
    }

    /// Whether `first` or `second` has exited (`hasExited` of both, in one `poll(2)`).
    public static func eitherExited(_ first: Pidfd, _ second: Pidfd) -> Bool {
        var entries = (pollfd(fd: first.descriptor.rawValue, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: second.descriptor.rawValue, events: Int16(POLLIN), revents: 0))
        let ready = withUnsafeMutableBytes(of: &entries) { poll($0.baseAddress!.assumingMemoryBound(to: pollfd.self), 2, 0) }
        return ready != 0  // ready, or the poll failed: either way neither is known to live
    }

    /// Sends `signal` to the process. `pidfd_send_signal(2)`
    public func send(signal: Int32) throws(Errno) {
        let fd = descriptor.rawValue
        try systemCall("pidfd_send_signal(\(pid), \(signal))") { pidfd_send_signal(fd, signal, nil, 0) }
    }

    /// Sends `signal` to the process; false only if it has exited (`ESRCH`): the signal
    /// tells what a poll of the pidfd (`hasExited`) would, without a system call of its own.
    /// Any other failure (`EPERM`) leaves the process there.
    public func trySend(signal: Int32) -> Bool {
        do throws(Errno) {
            try send(signal: signal)
            return true
        } catch {
            return error.code != ESRCH
        }
    }
}
