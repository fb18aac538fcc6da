// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// Signal numbers the daemon sends or handles, so callers need not import the C library.
public enum Signal {
    public static let hangup = SIGHUP
    public static let interrupt = SIGINT
    public static let kill = SIGKILL
    public static let terminate = SIGTERM
    public static let stop = SIGSTOP
    public static let `continue` = SIGCONT

    /// Stops `SIGPIPE` from killing the process: a write to a closed peer fails with `EPIPE`.
    public static func ignoreBrokenPipe() { signal(SIGPIPE, SIG_IGN) }
}

/// Facts about this process: its pid, uid, environment, limits, standard error.
public enum Host {
    /// This process's pid. `getpid(2)`
    public static let pid: Int32 = getpid()

    /// Names the calling thread, for `top -H` and `/proc/PID/task/TID/comm` (Foundation's
    /// `Thread.name` does not reach the kernel here). At most 15 bytes. `prctl(2)`
    public static func nameThread(_ name: String) { bgtask_name_thread(name) }

    /// This process's effective uid. `geteuid(2)`
    public static var effectiveUID: UInt32 { geteuid() }

    /// Whether this process runs in the initial pid and user namespaces (not in a container):
    /// one pid in `NSpid`, the identity `uid_map`. Machine-wide kernel reports (the
    /// process-events connector) are sent only there.
    public static var inInitialNamespaces: Bool {
        guard let status = try? readFile("/proc/self/status"), let map = try? readFile("/proc/self/uid_map") else { return false }
        let nspid = String(decoding: status, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix("NSpid:") }
        let pids = nspid?.dropFirst(6).split(whereSeparator: { $0 == " " || $0 == "\t" }) ?? []
        let mapping = String(decoding: map, as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" })
        return pids.count == 1 && mapping == ["0", "0", "4294967295"]
    }

    /// The name of user `uid`, if it has one. `getpwuid_r(3)`
    public static func userName(uid: UInt32) -> String? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid, &entry, &buffer, buffer.count, &result) == 0, result != nil, let name = entry.pw_name else {
            return nil
        }
        return String(cString: name)
    }

    /// The path of `pid`'s executable (`/proc/PID/exe`): the kernel's, not the process's own
    /// claim, and only if the file at that path, as this process sees it, is the very file
    /// the process runs (same device and inode). The link shows the path in the process's own
    /// mount namespace: a user who bind-mounted another program over `/usr/bin/sleep` there
    /// shows `/usr/bin/sleep`. `nil` where it cannot be read (another user's process, without
    /// `CAP_SYS_PTRACE`), was deleted, or is not the file at its path.
    public static func executable(pid: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: 4097)
        let length = readlink("/proc/\(pid)/exe", &buffer, 4096)
        guard length > 0 else { return nil }
        let path = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard !path.hasSuffix(" (deleted)") else { return nil }
        var running = stat(), named = stat()
        guard stat("/proc/\(pid)/exe", &running) == 0, stat(path, &named) == 0,
              running.st_dev == named.st_dev, running.st_ino == named.st_ino else { return nil }
        return path
    }

    /// The environment variable `name`, if set. `getenv(3)`
    public static func environment(_ name: String) -> String? {
        getenv(name).map { String(cString: $0) }
    }

    /// Raises the soft limit on open descriptors to the hard limit. `setrlimit(2)`
    public static func raiseDescriptorLimit() {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(resource, &limit)
    }

    /// The soft limit on open descriptors (`Int.max` if unlimited or unknown). `getrlimit(2)`
    public static var descriptorLimit: Int {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return .max }
        return Int(clamping: limit.rlim_cur)
    }

    /// Writes `text` and a newline to standard error, unbuffered.
    public static func printError(_ text: String) {
        let bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }

    /// The gid of group `name` (a number is taken as it is); `nil` if there is no such group.
    /// `getgrnam(3)`
    public static func groupID(named name: String) -> UInt32? {
        if let number = UInt32(name) { return number }
        return getgrnam(name).map { $0.pointee.gr_gid }
    }

    /// Formats nanoseconds since the epoch as RFC 3339 UTC: `2026-11-29T13:45:01.123Z`. `gmtime_r(3)`
    ///
    /// Written as 24 bytes in place: every action's history entry carries one, two calls per
    /// action (each field padded through a `String` of its own cost ~3,700 instructions a call).
    public static func rfc3339(_ nanoseconds: Int64) -> String {
        let (quotient, remainder) = nanoseconds.quotientAndRemainder(dividingBy: 1_000_000_000)
        var seconds = time_t(remainder < 0 ? quotient - 1 : quotient)
        let millis = Int32((remainder < 0 ? remainder + 1_000_000_000 : remainder) / 1_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let year = parts.tm_year + 1900
        guard (0...9999).contains(year) else { return "\(year)-\(parts.tm_mon + 1)-\(parts.tm_mday)T\(parts.tm_hour):\(parts.tm_min):\(parts.tm_sec).\(millis)Z" }
        return String(unsafeUninitializedCapacity: 24) { out in
            var index = 0
            func put(_ value: Int32, _ width: Int) {
                var value = value
                for position in stride(from: index + width - 1, through: index, by: -1) {
                    out[position] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
                index += width
            }
            func put(_ character: Unicode.Scalar) {
                out[index] = UInt8(ascii: character)
                index += 1
            }
            put(year, 4); put("-"); put(parts.tm_mon + 1, 2); put("-"); put(parts.tm_mday, 2); put("T")
            put(parts.tm_hour, 2); put(":"); put(parts.tm_min, 2); put(":"); put(parts.tm_sec, 2); put(".")
            put(millis, 3); put("Z")
            return index
        }
    }
}

extension Errno {
    /// `ENOENT`: no such file.
    public var isNotFound: Bool { code == ENOENT }
    /// `ESRCH` (or `ENOENT` from `/proc`): the process is gone.
    public var isNoSuchProcess: Bool { code == ESRCH || code == ENOENT }
    /// `EMFILE`, `ENFILE`, `ENOBUFS` or `ENOMEM`: the caller is out of descriptors or memory,
    /// which says nothing of what it asked for (a process is not gone, a connection not bad).
    public var isShortage: Bool { [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(code) }
    /// `EAGAIN`: a non-blocking call would block.
    public var wouldBlock: Bool { code == EAGAIN || code == EWOULDBLOCK }
    /// An `EADDRINUSE` error for `operation`.
    public static func addressInUse(_ operation: String) -> Errno { Errno(EADDRINUSE, operation) }

    /// `ENOSPC` or `EDQUOT`: the file system is full.
    public var isNoSpace: Bool { code == ENOSPC || code == EDQUOT }
}
