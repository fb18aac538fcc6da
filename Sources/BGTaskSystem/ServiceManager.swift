// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A systemd manager (the system's, or one user's), reached over its private socket: moves
/// processes into a transient scope of their own. Asynchronous on the event loop: the
/// answer comes to a closure, nothing waits. One connection per request: it is dropped once
/// answered, so a dead manager is never kept, and a peer that sends anything unasked is cut
/// off (its messages are not queued). `sd-bus(3)`, `org.freedesktop.systemd1(5)`
public final class ServiceManager {
    private let bus: OpaquePointer
    private let loop: EventLoop

    /// The system manager's private socket.
    public static let systemPath = "/run/systemd/private"

    /// User `uid`'s manager's private socket (it admits that user and root).
    public static func userPath(uid: UInt32) -> String { "/run/user/\(uid)/systemd/private" }

    /// Who listens on a manager's socket, from the kernel.
    public struct Listener: Sendable {
        public var pid: Int32
        public var uid: UInt32
    }

    /// Connects to the manager at `path` (`systemPath`, `userPath(uid:)`) without following
    /// a symbolic link on the way, and goes on only if `vouch` accepts who listens there
    /// (`nil`; else why not, thrown as `EPERM` before a word is sent).
    public init(path: String, loop: EventLoop, vouch: (Listener) -> String?) throws(Errno) {
        var peer = bgtask_ucred()
        let fd = bgtask_manager_connect(path, &peer)
        guard fd >= 0 else { throw Errno(-fd, "connect to \(path) (no symbolic links followed)") }
        if let refusal = vouch(Listener(pid: peer.pid, uid: peer.uid)) {
            Glibc.close(fd)
            throw Errno(EPERM, "\(path): \(refusal)")
        }
        var bus: OpaquePointer?
        try systemdCall("sd-bus on \(path)") { bgtask_manager_bus_open(fd, loop.event, &bus) }
        self.bus = bus!
        self.loop = loop
        loop.eventSourcesChanged()
    }

    deinit { sd_bus_flush_close_unref(bus) }

    /// Asks for a transient scope `name` holding `pids`, in `slice` (the manager's default
    /// when `nil`); `done` gets `nil` once the manager took the job, or why it refused.
    public func startScope(_ name: String, pids: [Int32], slice: String?, description: String,
                           done: @escaping (String?) -> Void) {
        let box = Unmanaged.passRetained(Reply(done))
        let raw = pids.map { UInt32(bitPattern: $0) }
        let result = raw.withUnsafeBufferPointer { buffer in
            bgtask_start_transient_scope(bus, name, slice, description, buffer.baseAddress, buffer.count, { message, userdata, _ in
                let reply = Unmanaged<Reply>.fromOpaque(userdata!).takeRetainedValue()
                if let error = sd_bus_message_get_error(message), sd_bus_error_is_set(error) != 0 {
                    reply.done(String(cString: error.pointee.message ?? error.pointee.name))
                } else {
                    reply.done(nil)
                }
                return 0
            }, box.toOpaque())
        }
        loop.eventSourcesChanged()
        if result < 0 {
            box.release()
            done(String(cString: strerror(-result)))
        }
    }

    private final class Reply {
        let done: (String?) -> Void
        init(_ done: @escaping (String?) -> Void) { self.done = done }
    }
}
