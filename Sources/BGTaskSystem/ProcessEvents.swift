// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// The kernel's process-events connector (`NETLINK_CONNECTOR`, `CN_IDX_PROC`): every fork and
/// exit on the machine, as it happens, so a process that re-parents (a double fork, `setsid`)
/// is still known to be its app's. Needs `CAP_NET_ADMIN`. `cn_proc`
public final class ProcessEvents {
    public enum Event: Equatable, Sendable {
        /// A new process (not a thread) `child`, forked by process `parent`.
        case fork(parent: Int32, child: Int32)
        case exit(Int32)
    }

    /// Readable when events wait.
    public let descriptor: FileDescriptor
    /// A socket buffer for bursts: 32 MiB holds some 400,000 events (a fork storm of 68,000
    /// events a second held up by a 3 s stall overflowed 4 MiB).
    public static let receiveBufferBytes: Int32 = 32 << 20

    /// One datagram's room, kept: a read that finds nothing (most of them: the tracker reads
    /// before every process action) costs the `recv`, not an allocation and a 4 KiB memset.
    private let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 4096)

    private init(descriptor: FileDescriptor) { self.descriptor = descriptor }

    deinit { buffer.deallocate() }

    /// Subscribes to the events. `EPERM` without `CAP_NET_ADMIN`, or in a container: the
    /// kernel reports only to listeners in the initial pid and user namespaces (elsewhere it
    /// would accept the subscription and send nothing).
    /// `bufferBytes`: the socket's receive buffer (the tests make it tiny to overflow it).
    public static func open(bufferBytes: Int32 = receiveBufferBytes) throws(Errno) -> ProcessEvents {
        guard Host.inInitialNamespaces else {
            throw Errno(EPERM, "process-events connector: not in the initial pid and user namespaces")
        }
        let fd = bgtask_proc_events_open(bufferBytes)
        guard fd >= 0 else { throw Errno(-fd, "process-events connector") }
        return ProcessEvents(descriptor: FileDescriptor(fd))
    }

    /// The events waiting, oldest first, from at most `limit` datagrams (the rest stay
    /// queued). `ENOBUFS` when the kernel dropped some (the buffer overflowed): what was
    /// missed cannot be known.
    public func read(limit: Int = .max) throws(Errno) -> [Event] {
        var events: [Event] = []
        let fd = descriptor.rawValue
        for _ in 0..<limit {
            let length = recv(fd, buffer.baseAddress, buffer.count, 0)
            if length < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK { return events }
                if errno == EINTR { continue }
                throw Errno.current("recv(process-events connector)")
            }
            var first: Int32 = 0, second: Int32 = 0
            switch bgtask_proc_event(buffer.baseAddress, length, &first, &second) {
            case 1: events.append(.fork(parent: first, child: second))
            case 2: events.append(.exit(first))
            default: skipped += 1
            }
        }
        return events
    }

    /// Datagrams read that were neither a process's fork nor its exit (an exec, a thread's
    /// creation or exit, an id change): the socket's filter drops those in the kernel, so
    /// this stays 0 where the filter could be attached.
    public private(set) var skipped = 0

    /// Whether the kernel sends this socket the events (it does from `open()`).
    public private(set) var isListening = true

    /// Stops or starts again the events. Stopped, the socket receives nothing and, when no
    /// other socket listens, the kernel makes no event at all: a daemon following no process
    /// is not woken by every fork and exit on the machine. Started, every event made after
    /// this returns is received. What was queued before a stop is dropped with it.
    public func listen(_ listening: Bool) throws(Errno) {
        guard listening != isListening else { return }
        let result = bgtask_proc_events_listen(descriptor.rawValue, listening ? 1 : 0)
        guard result == 0 else { throw Errno(-result, listening ? "process-events connector: listen" : "process-events connector: ignore") }
        isListening = listening
        if !listening { while recv(descriptor.rawValue, buffer.baseAddress, buffer.count, 0) > 0 {} }
    }

    public func close() { descriptor.close() }
}
