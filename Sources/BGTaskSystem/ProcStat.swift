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

    /// Reads a `/proc/PID/stat` held open (`Pidfd.openStat()`) again: one `pread(2)`, where a
    /// read by path is an open, a read and a close. Fails (`ESRCH`) once its process is gone,
    /// and is never another process's, as a read by path can be once the pid is reused.
    public static func read(held file: FileDescriptor) throws(Errno) -> ProcStat {
        // The line is some 50 numbers after a command of at most 64 bytes: well below 1 KiB.
        let fd = file.rawValue
        let bytes = try [UInt8](unsafeUninitializedCapacity: 1024) { buffer, initialized throws(Errno) in
            initialized = try systemCall("pread(/proc/PID/stat)") { pread(fd, buffer.baseAddress, 1024, 0) }
        }
        guard let stat = parse(bytes) else { throw Errno(EINVAL, "parse /proc/PID/stat") }
        return stat
    }

    /// Whether the process waits for the child it `vfork`ed (`CLONE_VFORK`: `posix_spawn`,
    /// dash's commands) to `exec` or exit: in `D` — which a stop does not end, so a stopped
    /// child keeps its parent there — inside `kernel_clone` (`/proc/PID/wchan`: the wait,
    /// `wait_for_vfork_done`, is inlined there; a sleep while the child is still being copied
    /// shows the function it sleeps in). That child is on the parent's list of children
    /// already: the parent is past its fork. `false` where `wchan` does not say (another
    /// kernel's name, a process not readable). Read by path, for a pid whose process the
    /// caller holds (a pidfd): were the pid another's by then, its process would be gone,
    /// which the caller takes as past any fork too.
    public static func waitsForVforkChild(pid: Int32) -> Bool {
        (try? readFile("/proc/\(pid)/wchan", limit: 64, shortReadEnds: true)) == Array("kernel_clone".utf8)
    }

    /// Parses the text of `/proc/PID/stat`; the command may hold spaces and parentheses.
    /// Read on every call that names a process and at every check of a stopped app: one pass
    /// over the bytes in place, the four numbers wanted summed as they go by (an array of
    /// field slices, each retaining the text, cost ~7,000 instructions a parse: callgrind).
    public static func parse(_ bytes: [UInt8]) -> ProcStat? {
        bytes.withUnsafeBufferPointer { bytes -> ProcStat? in
            guard let open = bytes.firstIndex(of: UInt8(ascii: "(")),
                  let close = bytes.lastIndex(of: UInt8(ascii: ")")), open < close,
                  let pid = number(UnsafeBufferPointer(rebasing: bytes[..<open]), trimming: true)
            else { return nil }
            let command = String(decoding: UnsafeBufferPointer(rebasing: bytes[(open + 1)..<close]), as: UTF8.self)
            // Fields 3 onwards of proc(5), each ended by a space (or a newline, or the end):
            // 3 state, 4 ppid, 9 flags, 22 starttime.
            var field = 3, start = close + 2, index = start
            var state: UInt8 = 0
            var parent: UInt64?, flags: UInt64?, startTime: UInt64?
            while index <= bytes.count, field <= 22 {
                if index == bytes.count || bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\n") {
                    let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
                    switch field {
                    case 3:
                        guard text.count == 1 else { return nil }
                        state = text[0]
                    case 4: parent = number(text)
                    case 9: flags = number(text)
                    case 22: startTime = number(text)
                    default: break
                    }
                    field += 1
                    start = index + 1
                }
                index += 1
            }
            guard field == 23, let parent, let flags, let startTime else { return nil }
            return ProcStat(pid: Int32(truncatingIfNeeded: pid), command: command, state: Character(Unicode.Scalar(state)),
                            parentPID: Int32(truncatingIfNeeded: parent), flags: flags, startTime: startTime)
        }
    }

    /// An unsigned decimal field; `trimming`: spaces around it are passed over.
    static func number(_ digits: UnsafeBufferPointer<UInt8>, trimming: Bool = false) -> UInt64? {
        var value: UInt64 = 0, count = 0
        for digit in digits {
            if trimming, digit == UInt8(ascii: " ") { continue }
            guard digit >= UInt8(ascii: "0"), digit <= UInt8(ascii: "9"), count < 20 else { return nil }
            let (times, overflow) = value.multipliedReportingOverflow(by: 10)
            guard !overflow else { return nil }
            value = times &+ UInt64(digit - UInt8(ascii: "0"))
            count += 1
        }
        return count == 0 ? nil : value
    }

    /// The same over a slice of an array.
    static func number(_ digits: ArraySlice<UInt8>) -> UInt64? {
        digits.withUnsafeBufferPointer { number($0) }
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

    /// The signals a service manager stops a process with (`KillSignal=`: `SIGTERM`, and
    /// `SIGINT`, `SIGHUP`, `SIGQUIT` as units set it), in that order of preference.
    public static let stopSignals: [Int32] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT]

    /// The first of `stopSignals` pending on `pid` (its own `SigPnd:` or its thread group's
    /// `ShdPnd:`), `nil` if none or it cannot be read.
    public static func pendingStopSignal(pid: Int32) -> Int32? {
        guard let bytes = try? readFile("/proc/\(pid)/status", shortReadEnds: true) else { return nil }
        let pending = parsePending(bytes)
        return stopSignals.first { pending & (1 << UInt64($0 - 1)) != 0 }
    }

    private static let pendingPrefixes = (own: Array("SigPnd:".utf8), shared: Array("ShdPnd:".utf8))

    /// `SigPnd:` and `ShdPnd:` of a status text, together (hexadecimal masks, bit N-1 for
    /// signal N); 0 where neither is there.
    static func parsePending(_ bytes: [UInt8]) -> UInt64 {
        var mask: UInt64 = 0
        for line in bytes.split(separator: UInt8(ascii: "\n")) {
            guard line.count > 7, line.starts(with: pendingPrefixes.own) || line.starts(with: pendingPrefixes.shared) else { continue }
            let digits = line.dropFirst(7).drop { $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: " ") }
            guard let value = UInt64(String(decoding: digits, as: UTF8.self), radix: 16) else { continue }
            mask |= value
        }
        return mask
    }
}
