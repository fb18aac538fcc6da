// SPDX-License-Identifier: Apache-2.0
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
        let bytes = try readFile("/proc/\(pid)/stat", shortReadEnds: true)
        guard let stat = parse(bytes) else { throw Errno(EINVAL, "parse /proc/\(pid)/stat") }
        return stat
    }

    /// Parses the text of `/proc/PID/stat`; the command may hold spaces and parentheses.
    /// Read on every call that names a process: bytes in, no intermediate strings.
    public static func parse(_ bytes: [UInt8]) -> ProcStat? {
        guard let open = bytes.firstIndex(of: UInt8(ascii: "(")),
              let close = bytes.lastIndex(of: UInt8(ascii: ")")), open < close,
              let pid = number(bytes[..<open].filter { $0 != UInt8(ascii: " ") }[...]).map(Int32.init(truncatingIfNeeded:))
        else { return nil }
        let command = String(decoding: bytes[(open + 1)..<close], as: UTF8.self)
        // Fields 3 onwards of proc(5), each ended by a space (or the end).
        var fields: [ArraySlice<UInt8>] = []
        fields.reserveCapacity(20)
        var start = close + 2
        var index = start
        while index <= bytes.count, fields.count < 20 {
            if index == bytes.count || bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\n") {
                fields.append(bytes[start..<index])
                start = index + 1
            }
            index += 1
        }
        guard fields.count == 20, fields[0].count == 1, let parent = number(fields[1]), let flags = number(fields[6]),
              let startTime = number(fields[19]) else { return nil }
        return ProcStat(pid: pid, command: command, state: Character(Unicode.Scalar(fields[0].first!)),
                        parentPID: Int32(truncatingIfNeeded: parent), flags: flags, startTime: startTime)
    }

    /// An unsigned decimal field.
    static func number(_ digits: ArraySlice<UInt8>) -> UInt64? {
        guard !digits.isEmpty, digits.count <= 20 else { return nil }
        var value: UInt64 = 0
        for digit in digits {
            guard digit >= UInt8(ascii: "0"), digit <= UInt8(ascii: "9") else { return nil }
            let (times, overflow) = value.multipliedReportingOverflow(by: 10)
            guard !overflow else { return nil }
            value = times &+ UInt64(digit - UInt8(ascii: "0"))
        }
        return value
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
        let bytes = try readFile("/proc/\(pid)/status", shortReadEnds: true)
        guard let ids = parseUIDs(bytes) else { throw Errno(EINVAL, "parse /proc/\(pid)/status") }
        return ids
    }

    /// The `Uid:` line of a status text (real, effective, saved, filesystem).
    static func parseUIDs(_ bytes: [UInt8]) -> ProcessUIDs? {
        guard var index = uidLine(in: bytes) else { return nil }
        var ids: [UInt32] = []
        while ids.count < 3, index < bytes.count, bytes[index] != UInt8(ascii: "\n") {
            while index < bytes.count, bytes[index] == UInt8(ascii: "\t") || bytes[index] == UInt8(ascii: " ") { index += 1 }
            let start = index
            while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") { index += 1 }
            guard let id = ProcStat.number(bytes[start..<index]), id <= UInt64(UInt32.max) else { return nil }
            ids.append(UInt32(id))
        }
        return ids.count == 3 ? ProcessUIDs(real: ids[0], effective: ids[1], saved: ids[2]) : nil
    }

    /// Where the `Uid:` line's numbers start: a byte walk (`firstRange(of:)`, generic,
    /// cost more than reading the file: perf, a burst of 4,000 apps registering).
    static func uidLine(in bytes: [UInt8]) -> Int? {
        var index = 0
        while index + 5 <= bytes.count {
            if bytes[index] == 0x0A, bytes[index + 1] == UInt8(ascii: "U"), bytes[index + 2] == UInt8(ascii: "i"),
               bytes[index + 3] == UInt8(ascii: "d"), bytes[index + 4] == UInt8(ascii: ":") {
                return index + 5
            }
            index += 1
        }
        return nil
    }

    /// The effective uid of `pid`.
    public static func effectiveUID(pid: Int32) throws(Errno) -> UInt32 { try uids(pid: pid).effective }
}
