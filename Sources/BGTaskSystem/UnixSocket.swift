// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// What the kernel says about the process at the other end of a Unix socket.
public struct PeerCredentials: Sendable {
    /// `SO_PEERCRED`: pid, effective uid and gid at `connect()` time.
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    /// `SO_PEERGROUPS`: supplementary groups.
    public var groups: [UInt32]

    /// Whether the peer runs as this process's user (real or effective) or root: the one to
    /// talk to at a path found by itself — the per-user daemon's socket for a client, the
    /// compositor's for the session agent (`bgtask_wlr_connect` says the same in C).
    public var isThisUserOrRoot: Bool { uid == 0 || uid == getuid() || uid == geteuid() }
}

/// `AF_UNIX` stream sockets: listen, connect, accept, and peer credentials.
public enum UnixSocket {
    /// Longest path a `sockaddr_un` holds (without its NUL).
    public static let maximumPathLength = 107

    private static func withAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) throws(Errno) -> T {
        let bytes = Array(path.utf8)
        guard !bytes.isEmpty, bytes.count <= maximumPathLength else {
            throw Errno(ENAMETOOLONG, "socket path '\(path)' (at most \(maximumPathLength) bytes)")
        }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                body($0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }

    /// A new non-blocking, close-on-exec listening socket bound at `path`, mode 0666 (access
    /// is decided per call from peer credentials, not by the file mode). `EADDRINUSE` if a
    /// file is there already.
    ///
    /// The socket is bound under a name of its own beside `path` (`.bgtaskd-PID-N`), listens,
    /// and is renamed into place (`RENAME_NOREPLACE`: an existing file is refused as `bind`
    /// would): a client that finds the file finds a socket listening. Bound at `path` itself,
    /// a client that connected as soon as the file appeared could be refused
    /// (`ECONNREFUSED`) before the `listen` (`make bench`'s daemon under callgrind was). Where
    /// the name does not fit in a socket address, it is bound at `path` as before. Both names
    /// are reached by path: `path`'s directory must be one nobody else can write
    /// (`DaemonMain.openListener` requires it, as for the socket itself).
    public static func listen(path: String, backlog: Int32 = 4096) throws(Errno) -> FileDescriptor {
        let fd = FileDescriptor(try systemCall("socket") {
            socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        })
        let raw = fd.rawValue
        let directory = path.lastIndex(of: "/").map { String(path[...$0]) } ?? ""
        let number = temporaryNames.withLock { count in
            count += 1
            return count
        }
        let temporary = directory + stagingPrefix + "\(getpid())-\(number)"
        let staged = !path.isEmpty && temporary.utf8.count <= maximumPathLength
        let bound = staged ? temporary : path
        if staged { unlink(temporary) }  // left by a process of this pid that was killed here
        let bindError = try withAddress(bound) { address, length in bindOpenToAll(raw, address, length) }
        if bindError != 0 { throw Errno(bindError, "bind(\(path))") }
        do throws(Errno) {
            try systemCall("listen(\(path))") { Glibc.listen(raw, backlog) }
            if staged {
                let renamed = bgtask_rename_noreplace(temporary, path)
                if renamed != 0 { throw Errno(renamed == -EEXIST ? EADDRINUSE : -renamed, "bind(\(path))") }
            }
        } catch {
            if staged { unlink(temporary) }
            throw error
        }
        return fd
    }

    /// Removes the sockets `listen` left under its staging names (`.bgtaskd-PID-N`) in
    /// `directory`: a process killed between its bind and its rename leaves one (a daemon
    /// starting again under another pid never reuses the name). Only a socket, and only of a
    /// process that is gone (`pidfd_open` says `ESRCH`): a name of a live process may be
    /// binding now, or its pid was reused; a file left there is harmless, a listener's name
    /// removed under it would not be. For a directory nobody else can write (the daemon's:
    /// `FileSystem.requireOwnDirectory`). Returns the names removed.
    @discardableResult
    public static func removeStaleStagingNames(in directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        let at = dirfd(dir)
        var removed: [String] = []
        while let entry = readdir(dir) {
            let name = entryName(entry)
            guard name.hasPrefix(stagingPrefix) else { continue }
            let parts = name.dropFirst(stagingPrefix.count).split(separator: "-", omittingEmptySubsequences: false)
            guard parts.count == 2, let pid = Int32(parts[0]), pid > 1, UInt64(parts[1]) != nil else { continue }
            let probe = pidfd_open(pid, 0)
            if probe >= 0 {
                Glibc.close(probe)
                continue  // alive
            }
            guard errno == ESRCH else { continue }
            var status = stat()
            guard fstatat(at, name, &status, AT_SYMLINK_NOFOLLOW) == 0, status.st_mode & S_IFMT == S_IFSOCK,
                  unlinkat(at, name, 0) == 0 else { continue }
            removed.append(name)
        }
        return removed
    }

    /// The start of the names `listen` binds under before renaming.
    static let stagingPrefix = ".bgtaskd-"

    /// Numbers the names `listen` binds under before renaming: one process may listen on many
    /// sockets, from several threads (a test process does), and two alike would unlink each
    /// other's.
    private static let temporaryNames = Locked(0)

    /// Binds with the socket file's mode 0666. The mode comes from the umask at `bind` (a
    /// chmod by path afterwards could be swapped to another file in between), and the umask
    /// is the whole process's: set by the calling thread, every file another thread created
    /// meanwhile lost the bits it masks (a test process compiling and spawning programs while
    /// another test listened got them without execute bits: `posix_spawn` refused them). So
    /// the bind runs on a thread of its own that first takes a private copy of the
    /// process's file-system context (`unshare(CLONE_FS)`: its umask, root and working
    /// directory; no privilege needed, and no namespace, which `RestrictNamespaces=` allows)
    /// and sets the umask there. Where that is refused, the calling thread sets it as before.
    /// Returns 0 or the errno of `bind`.
    private static func bindOpenToAll(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
        let job = BindJob(fd: fd, address: address, length: length)
        var thread = pthread_t()
        let context = Unmanaged.passRetained(job).toOpaque()
        let created = pthread_create(&thread, nil, { raw in
            let job = Unmanaged<BindJob>.fromOpaque(raw!).takeRetainedValue()
            guard bgtask_unshare_fs() == 0 else { return nil }  // `isolated` stays false
            job.isolated = true
            umask(0o111)
            job.error = bind(job.fd, job.address, job.length) == 0 ? 0 : errno
            return nil
        }, context)
        if created == 0 {
            pthread_join(thread, nil)
        } else {
            Unmanaged<BindJob>.fromOpaque(context).release()
        }
        if job.isolated { return job.error }
        let previous = umask(0o111)
        let bound = bind(fd, address, length)
        let error = bound == 0 ? 0 : errno
        umask(previous)
        return error
    }

    /// What `bindOpenToAll`'s thread is handed, and hands back.
    private final class BindJob {
        let fd: Int32
        let address: UnsafePointer<sockaddr>
        let length: socklen_t
        var isolated = false
        var error: Int32 = 0
        init(fd: Int32, address: UnsafePointer<sockaddr>, length: socklen_t) {
            self.fd = fd
            self.address = address
            self.length = length
        }
    }

    /// The path a socket is bound at (`getsockname`): systemd's, passed by socket activation;
    /// `nil` for an abstract or unnamed one.
    public static func boundPath(_ socket: FileDescriptor) -> String? {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let result = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socket.rawValue, $0, &length) }
        }
        guard result == 0, address.sun_family == sa_family_t(AF_UNIX) else { return nil }
        let path = withUnsafeBytes(of: address.sun_path) { raw in
            String(decoding: raw.prefix(max(0, Int(length) - MemoryLayout<sa_family_t>.size)).prefix { $0 != 0 }, as: UTF8.self)
        }
        return path.hasPrefix("/") ? path : nil
    }

    /// A close-on-exec connection to `path`. A non-blocking one fails with `EAGAIN` where a
    /// blocking one would wait (the listener's backlog is full).
    public static func connect(path: String, nonBlocking: Bool = false) throws(Errno) -> FileDescriptor {
        let flags = Int32(SOCK_CLOEXEC.rawValue) | (nonBlocking ? Int32(SOCK_NONBLOCK.rawValue) : 0)
        let fd = FileDescriptor(try systemCall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | flags, 0) })
        let raw = fd.rawValue
        while true {
            let result = try withAddress(path) { address, length in Glibc.connect(raw, address, length) }
            if result == 0 { return fd }
            if errno == EINTR { continue }
            throw Errno.current("connect(\(path))")
        }
    }

    /// Accepts one connection, non-blocking and close-on-exec; `nil` when none is waiting.
    public static func accept(_ listener: FileDescriptor) throws(Errno) -> FileDescriptor? {
        while true {
            let fd = accept4(listener.rawValue, nil, nil, Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue))
            if fd >= 0 { return FileDescriptor(fd) }
            switch errno {
            case EINTR, ECONNABORTED: continue
            case EAGAIN: return nil
            default: throw Errno.current("accept4")
            }
        }
    }

    /// The peer's credentials. `getsockopt(SO_PEERCRED, SO_PEERGROUPS)`
    public static func peerCredentials(_ socket: FileDescriptor) throws(Errno) -> PeerCredentials {
        var cred = bgtask_ucred()
        try systemCall("getsockopt(SO_PEERCRED)") { bgtask_peer_credentials(socket.rawValue, &cred) }
        var groups = [gid_t](repeating: 0, count: 64)
        var groupLength = socklen_t(groups.count * MemoryLayout<gid_t>.size)
        if getsockopt(socket.rawValue, SOL_SOCKET, SO_PEERGROUPS, &groups, &groupLength) < 0 {
            if errno == ERANGE {
                groups = [gid_t](repeating: 0, count: Int(groupLength) / MemoryLayout<gid_t>.size)
                try systemCall("getsockopt(SO_PEERGROUPS)") {
                    getsockopt(socket.rawValue, SOL_SOCKET, SO_PEERGROUPS, &groups, &groupLength)
                }
            } else {
                groupLength = 0
            }
        }
        return PeerCredentials(pid: cred.pid, uid: cred.uid, gid: cred.gid,
                               groups: Array(groups.prefix(Int(groupLength) / MemoryLayout<gid_t>.size)))
    }

    /// The peer's pidfd from `SO_PEERPIDFD` (Linux 6.5+); `nil` where the kernel lacks it.
    /// Throws only for want of a descriptor (`Errno.isShortage`): the peer has one.
    public static func peerPidfd(_ socket: FileDescriptor) throws(Errno) -> FileDescriptor? {
        var fd: Int32 = -1
        var length = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(socket.rawValue, SOL_SOCKET, SO_PEERPIDFD, &fd, &length) != 0 {
            let error = Errno.current("getsockopt(SO_PEERPIDFD)")
            if error.isShortage { throw error }
            return nil
        }
        return fd >= 0 ? FileDescriptor(fd) : nil
    }

    /// Makes `MSG_PEEK` reads move along the socket's input (`SO_PEEK_OFF`): each peek
    /// returns what follows the last, and consuming reads move the offset back. Returns false
    /// where the kernel does not offer it for the socket.
    public static func enablePeekOffset(_ socket: FileDescriptor) -> Bool {
        var offset: Int32 = 0
        return setsockopt(socket.rawValue, SOL_SOCKET, SO_PEEK_OFF, &offset, socklen_t(MemoryLayout<Int32>.size)) == 0
    }

    /// Whether something accepts connections at `path` now.
    public static func isAnswering(path: String) -> Bool {
        (try? connect(path: path)) != nil
    }
}
