// SPDX-License-Identifier: Apache-2.0
import Glibc

/// Descriptors held for the moment a process has none left (`EMFILE`): given back to the
/// kernel for one open that must not fail for want of a descriptor, and taken again after.
/// A listener whose next connection cannot be accepted polls readable for ever; with the
/// reserve, the connection is accepted, told why, and closed (nginx and libuv do the same).
public final class DescriptorReserve {
    private var held: [Int32] = []
    /// How many descriptors it keeps.
    public let count: Int

    public init(count: Int) {
        self.count = count
        refill()
    }

    deinit { release() }

    /// Whether it holds all it should (it takes what it lacks at each use).
    public var isFull: Bool { held.count == count }

    /// Runs `body` with the reserve's descriptors closed, then takes them again (as many as
    /// are free: whatever `body` keeps open is one fewer). `body` must close what it opens.
    public func withReleased<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        release()
        defer { refill() }
        return try body()
    }

    /// Takes descriptors until it holds `count` (`/dev/null`, read-only: they are never used).
    private func refill() {
        while held.count < count {
            let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return }
            held.append(fd)
        }
    }

    private func release() {
        for fd in held { close(fd) }
        held = []
    }
}
