import Glibc

/// The fields of `/proc/PID/stat` the daemon uses.
public struct ProcStat: Equatable, Sendable {
    public var pid: Int32
    /// The command name (`comm`), at most 15 bytes, as the kernel keeps it.
    public var command: String
    /// One letter: `R`, `S`, `D`, `T` (stopped), `t`, `Z`, ...
    public var state: Character
    public var parentPID: Int32
    /// The kernel's `PF_*` flags.
    public var flags: UInt64
    /// Start time in clock ticks after boot: with the pid, the process's identity.
    public var startTime: UInt64

    /// `PF_KTHREAD`: a kernel thread, never to be managed.
    public var isKernelThread: Bool { flags & 0x0020_0000 != 0 }

    /// Reads `/proc/PID/stat`.
    public static func read(pid: Int32) throws(Errno) -> ProcStat {
        let bytes = try readFile("/proc/\(pid)/stat")
        guard let stat = parse(bytes) else { throw Errno(EINVAL, "parse /proc/\(pid)/stat") }
        return stat
    }

    /// Parses the text of `/proc/PID/stat`; the command may hold spaces and parentheses.
    public static func parse(_ bytes: [UInt8]) -> ProcStat? {
        guard let open = bytes.firstIndex(of: UInt8(ascii: "(")),
              let close = bytes.lastIndex(of: UInt8(ascii: ")")), open < close else { return nil }
        guard let pid = Int32(String(decoding: bytes[..<open], as: UTF8.self).filter { $0 != " " }) else { return nil }
        let command = String(decoding: bytes[(open + 1)..<close], as: UTF8.self)
        let fields = bytes[(close + 1)...].split(separator: UInt8(ascii: " ")).map { String(decoding: $0, as: UTF8.self) }
        // fields[0] is field 3 of proc(5).
        guard fields.count > 19, let state = fields[0].first, let parent = Int32(fields[1]),
              let flags = UInt64(fields[6]), let start = UInt64(fields[19]) else { return nil }
        return ProcStat(pid: pid, command: command, state: state, parentPID: parent, flags: flags, startTime: start)
    }
}

/// A process's uids, from the `Uid:` line of `/proc/PID/status`.
public struct ProcessUIDs: Equatable, Sendable {
    public var real: UInt32
    public var effective: UInt32
    public var saved: UInt32

    public init(real: UInt32, effective: UInt32, saved: UInt32) {
        self.real = real
        self.effective = effective
        self.saved = saved
    }

    /// Whether a process running as `uid` may signal this one: `kill(2)`'s rule for an
    /// unprivileged sender (its real or effective uid is this one's real or saved uid).
    /// Root may signal anything.
    public func signallable(by uid: UInt32) -> Bool {
        uid == 0 || real == uid || saved == uid
    }
}

/// `/proc/PID/status` lines the daemon uses.
public enum ProcStatus {
    /// The real, effective and saved uids of `pid`.
    public static func uids(pid: Int32) throws(Errno) -> ProcessUIDs {
        let text = String(decoding: try readFile("/proc/\(pid)/status"), as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("Uid:") {
            let ids = line.dropFirst(4).split(whereSeparator: { $0 == "\t" || $0 == " " }).compactMap { UInt32($0) }
            if ids.count >= 3 { return ProcessUIDs(real: ids[0], effective: ids[1], saved: ids[2]) }
        }
        throw Errno(EINVAL, "parse /proc/\(pid)/status")
    }

    /// The effective uid of `pid`.
    public static func effectiveUID(pid: Int32) throws(Errno) -> UInt32 { try uids(pid: pid).effective }
}
