// SPDX-License-Identifier: Apache-2.0
/// A process, identified so that a recycled pid can never be mistaken for it: the inode of
/// its pidfd where the kernel has pidfs (Linux ≥ 6.9: unique for the boot, even between two
/// processes started on the same pid within one clock tick), and the pid with the process's
/// start time (clock ticks after boot, field 22 of `/proc/PID/stat`) everywhere.
///
/// The model only names processes; the daemon holds each one by pidfd.
public struct ProcessIdentity: Hashable, HashWord, Sendable, CustomStringConvertible {
    /// The process id, for display and for opening a pidfd.
    public var pid: Int32
    /// The start time in clock ticks after boot.
    public var startTime: UInt64
    /// The pidfs inode of its pidfd; 0 where the kernel has no pidfs.
    public var inode: UInt64

    public init(pid: Int32, startTime: UInt64, inode: UInt64 = 0) {
        self.pid = pid
        self.startTime = startTime
        self.inode = inode
    }

    public var description: String { "pid \(pid)" }

    /// One word for the hasher, not three: equal identities give equal words.
    var hashWord: UInt64 { (inode &* 0x9E37_79B9_7F4A_7C15) ^ (startTime &<< 22) ^ UInt64(UInt32(bitPattern: pid)) }

    public func hash(into hasher: inout Hasher) { hasher.combine(hashWord) }

    /// What a dictionary or set asks for: the word mixed with the table's seed by
    /// SplitMix64's finalizer (a bijection), not a SipHash over a `Hasher`. The model and the
    /// daemon look identities up some ten times per call, each ~225 instructions through the
    /// `Hasher` (callgrind: a tenth of a call). Pids, start times and inodes come from the
    /// kernel, and a key drawn at random when the process starts is mixed in with the
    /// table's seed: a local user cannot line identities up in one bucket.
    public func _rawHashValue(seed: Int) -> Int { seededHash(hashWord, seed: seed) }
}

/// Drawn once per process, for `seededHash`.
private let hashKey = UInt64.random(in: .min ... .max)

/// `word` mixed with a random key and a hash table's `seed` by SplitMix64's finalizer.
@inline(__always)
func seededHash(_ word: UInt64, seed: Int) -> Int {
    var x = word ^ hashKey ^ UInt64(UInt(bitPattern: seed))
    x = (x ^ (x &>> 30)) &* 0xBF58_476D_1CE4_E5B9
    x = (x ^ (x &>> 27)) &* 0x94D0_49BB_1331_11EB
    return Int(truncatingIfNeeded: x ^ (x &>> 31))
}

/// What the daemon learned about a calling or named process before asking the model.
public struct ProcessDescription: Sendable {
    /// The process itself.
    public var identity: ProcessIdentity
    /// Its real uid, from the kernel (`SO_PEERCRED` or `/proc`).
    public var uid: UInt32
    /// Its command name (`/proc/PID/comm`).
    public var command: String
    /// Its ancestors, parent first, up to (not including) pid 1.
    public var ancestors: [ProcessIdentity]
    /// The cgroup path of the unit it lives in, when that unit is an app of its own
    /// (`AppUnit.of(cgroupPath:daemonUnit:)`).
    public var unit: String?

    public init(identity: ProcessIdentity, uid: UInt32, command: String, ancestors: [ProcessIdentity] = [],
                unit: String? = nil) {
        self.identity = identity
        self.uid = uid
        self.command = command
        self.ancestors = ancestors
        self.unit = unit
    }
}

/// A client connection, numbered by the daemon; tasks begun with `more` die with it.
public struct ConnectionID: Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "connection \(rawValue)" }
}

/// A background task's id, unique for the daemon's lifetime; never 0 (UIKit's `.invalid`).
public typealias TaskID = Int
