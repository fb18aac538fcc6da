// SPDX-License-Identifier: Apache-2.0
import Glibc

/// A failed system call: the call's name and its `errno`.
public struct Errno: Error, Equatable, Sendable, CustomStringConvertible {
    /// The `errno` value (positive).
    public var code: Int32
    /// What failed, e.g. `pidfd_open(1234)`.
    public var operation: String

    public init(_ code: Int32, _ operation: String) {
        self.code = code
        self.operation = operation
    }

    /// The current `errno` for `operation`.
    public static func current(_ operation: String) -> Errno { Errno(errno, operation) }

    public var description: String { "\(operation): \(String(cString: strerror(code)))" }

    public static let interrupted = EINTR
}

/// Runs a call that returns -1 and sets `errno` on failure, retrying `EINTR`.
/// Returns the call's non-negative result.
@discardableResult
public func systemCall<T: BinaryInteger>(_ operation: @autoclosure () -> String,
                                        _ call: () -> T) throws(Errno) -> T {
    while true {
        let result = call()
        if result >= 0 { return result }
        if errno == EINTR { continue }
        throw Errno.current(operation())
    }
}

/// Runs a libsystemd call that returns `-errno` on failure.
@discardableResult
public func systemdCall(_ operation: @autoclosure () -> String, _ call: () -> Int32) throws(Errno) -> Int32 {
    let result = call()
    if result < 0 { throw Errno(-result, operation()) }
    return result
}
