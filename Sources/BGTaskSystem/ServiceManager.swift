import CSystemd
import Glibc

/// A systemd manager (the system's, or one user's), reached over its private socket: moves
/// processes into a transient scope of their own. Asynchronous on the event loop: the
/// answer comes to a closure, nothing waits. `sd-bus(3)`, `org.freedesktop.systemd1(5)`
public final class ServiceManager {
    private let bus: OpaquePointer

    /// The system manager's private socket.
    public static let systemAddress = "unix:path=/run/systemd/private"

    /// User `uid`'s manager's private socket (it admits that user and root).
    public static func userAddress(uid: UInt32) -> String { "unix:path=/run/user/\(uid)/systemd/private" }

    /// Connects to the manager at `address` (`systemAddress`, `userAddress(uid:)`).
    public init(address: String, loop: EventLoop) throws(Errno) {
        var bus: OpaquePointer?
        try systemdCall("sd-bus connect to \(address)") { bgtask_manager_bus_open(address, loop.event, &bus) }
        self.bus = bus!
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
