// SPDX-License-Identifier: Apache-2.0
import Glibc

/// Paths: creating directories and checking that nobody else can write where the daemon
/// keeps its socket or state (as sshd's `StrictModes` does).
public enum FileSystem {
    /// Creates `path` and its missing parents, each with `mode`. `mkdir(2)`
    public static func makeDirectories(_ path: String, mode: mode_t = 0o755) throws(Errno) {
        var prefix = ""
        for component in path.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, mode) != 0, errno != EEXIST { throw Errno.current("mkdir(\(prefix))") }
        }
    }

    /// Refuses a directory that another user could write: it must belong to this process's
    /// user (or root) and not be writable by group or others. Anyone who can write there can
    /// swap a symlink or a state file under the daemon. `stat(2)`
    public static func requireOwnDirectory(_ path: String) throws(Errno) {
        var st = stat()
        try systemCall("stat(\(path))") { stat(path, &st) }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw Errno(ENOTDIR, "\(path) is not a directory") }
        let me = geteuid()
        guard st.st_uid == me || st.st_uid == 0 else {
            throw Errno(EPERM, "refusing \(path): it belongs to uid \(st.st_uid), not to uid \(me) or root")
        }
        guard st.st_mode & 0o022 == 0 else {
            throw Errno(EPERM, "refusing \(path): it is writable by \(st.st_mode & 0o002 != 0 ? "everyone" : "its group") (mode \(String(st.st_mode & 0o7777, radix: 8)))")
        }
    }

    /// Whether something exists at `path`. `access(2)`
    public static func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    /// Removes the file at `path`, if any. `unlink(2)`
    public static func remove(_ path: String) { unlink(path) }
}

/// The daemon's private state directory: mode 0700, owned by the daemon's user, locked for
/// as long as the daemon runs (two daemons never share it), and every file in it reached by
/// `openat` on the directory's descriptor, never following a symlink.
public final class StateDirectory {
    /// The directory's path, for messages.
    public let path: String
    private let directory: FileDescriptor
    private let lock: FileDescriptor

    /// Opens `path` (creating it, and its parents, as needed), checks it and takes the lock.
    /// Throws `EBUSY` if another daemon holds it, `EPERM` (with a sentence) if it is not safe.
    public init(path: String, lockName: String = "bgtaskd.lock") throws(Errno) {
        self.path = path
        if let slash = path.lastIndex(of: "/"), slash != path.startIndex {
            try FileSystem.makeDirectories(String(path[..<slash]))
        }
        if mkdir(path, 0o700) != 0, errno != EEXIST { throw Errno.current("mkdir(\(path))") }
        directory = FileDescriptor(try systemCall("open(\(path))") {
            open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        })
        var st = stat()
        let fd = directory.rawValue
        try systemCall("fstat(\(path))") { fstat(fd, &st) }
        guard st.st_uid == geteuid() else {
            throw Errno(EPERM, "refusing state directory \(path): it belongs to uid \(st.st_uid), not to uid \(geteuid())")
        }
        guard st.st_mode & 0o022 == 0 else {
            throw Errno(EPERM, "refusing state directory \(path): others may write it (mode \(String(st.st_mode & 0o7777, radix: 8)))")
        }
        if st.st_mode & 0o077 != 0 { fchmod(fd, 0o700) }  // ours, but readable by others: close it
        lock = FileDescriptor(try systemCall("open(\(path)/\(lockName))") {
            openat(fd, lockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        })
        guard flock(lock.rawValue, LOCK_EX | LOCK_NB) == 0 else {
            throw errno == EWOULDBLOCK ? Errno(EBUSY, "another bgtaskd keeps its state in \(path)")
                                       : Errno.current("flock(\(path)/\(lockName))")
        }
    }

    /// One line of a file read by `readLines`.
    public enum Line {
        case text(ArraySlice<UInt8>)
        /// Longer than the bound: skipped without being held in memory.
        case tooLong
    }

    /// Reads the regular file `name` line by line, holding at most `maximumLineBytes` of a
    /// line at a time, and at most `maximumBytes` in all. The text ends at the first NUL (a
    /// `MappedLog` reserves room ahead, as zeros). Returns false if there is no such file.
    public func readLines(_ name: String, maximumLineBytes: Int, maximumBytes: Int,
                          _ body: (Line) -> Void) throws(Errno) -> Bool {
        let fd = openat(directory.rawValue, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return false }
            throw Errno.current("open(\(path)/\(name))")
        }
        let file = FileDescriptor(fd)
        var st = stat()
        try systemCall("fstat(\(path)/\(name))") { fstat(fd, &st) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw Errno(EINVAL, "\(path)/\(name) is not a regular file") }
        var line: [UInt8] = []
        var skipping = false
        var total = 0
        var ended = false  // a NUL: the text is over
        while total < maximumBytes, !ended {
            var chunk = try file.read(upTo: min(65536, maximumBytes - total))
            if let end = chunk.firstIndex(of: 0) {
                chunk.removeSubrange(end...)
                ended = true
            }
            if chunk.isEmpty { break }
            total += chunk.count
            var start = chunk.startIndex
            while let newline = chunk[start...].firstIndex(of: UInt8(ascii: "\n")) {
                if skipping || line.count + (newline - start) > maximumLineBytes {
                    body(.tooLong)
                } else if line.isEmpty {
                    body(.text(chunk[start..<newline]))
                } else {
                    line += chunk[start..<newline]
                    body(.text(line[...]))
                }
                line.removeAll(keepingCapacity: true)
                skipping = false
                start = newline + 1
            }
            if !skipping {
                line += chunk[start...]
                if line.count > maximumLineBytes {
                    skipping = true
                    line.removeAll()
                }
            }
        }
        if skipping { body(.tooLong) } else if !line.isEmpty { body(.text(line[...])) }
        return true
    }

    /// Writes `contents` to a new file that then replaces `name` (created with `O_EXCL`, so
    /// nothing planted under the temporary name is ever written through), and returns it
    /// open for reading and writing (to be mapped: `MappedLog`). `openat(2)`, `renameat(2)`
    public func replace(_ name: String, with contents: [UInt8]) throws(Errno) -> FileDescriptor {
        let temporary = name + ".new"
        let dir = directory.rawValue
        unlinkat(dir, temporary, 0)
        let file = FileDescriptor(try systemCall("open(\(path)/\(temporary))") {
            openat(dir, temporary, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        })
        do {
            try file.writeAll(contents)
            try systemCall("rename(\(temporary), \(name))") { renameat(dir, temporary, dir, name) }
        } catch {
            unlinkat(dir, temporary, 0)  // a half-written copy would only take up room
            throw error
        }
        return file
    }

    /// Renames `name` to `newName` inside the directory. `renameat(2)`
    public func rename(_ name: String, to newName: String) {
        renameat(directory.rawValue, name, directory.rawValue, newName)
    }
}
