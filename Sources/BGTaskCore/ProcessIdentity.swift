/// A process, identified so that a recycled pid can never be mistaken for it: the pid and
/// the process's start time (clock ticks after boot, field 22 of `/proc/PID/stat`).
///
/// The model only names processes; the daemon holds each one by pidfd.
public struct ProcessIdentity: Hashable, Sendable, CustomStringConvertible {
    /// The process id, for display and for opening a pidfd.
    public var pid: Int32
    /// The start time in clock ticks after boot; with `pid`, unique for the boot.
    public var startTime: UInt64

    public init(pid: Int32, startTime: UInt64) {
        self.pid = pid
        self.startTime = startTime
    }

    public var description: String { "pid \(pid)" }
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

    public init(identity: ProcessIdentity, uid: UInt32, command: String, ancestors: [ProcessIdentity] = []) {
        self.identity = identity
        self.uid = uid
        self.command = command
        self.ancestors = ancestors
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
