// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A logind inhibitor lock asked for (`org.freedesktop.login1.Manager.Inhibit`), on a
/// connection of its own to the system bus: the answer — the lock's descriptor, or why not —
/// comes to a closure on the event loop; nothing waits. The lock is the descriptor (closing it
/// releases it), so the connection is kept only until the answer: the caller drops the
/// request then (not inside the closure: the connection is calling it). Nothing else is asked
/// of the bus; what another peer sends meanwhile is dropped (a call answered "unknown
/// object" by sd-bus itself), and the connection lives 25 s at most (sd-bus's call timeout).
/// `org.freedesktop.login1(5)`
public final class InhibitorRequest {
    private let bus: OpaquePointer
    private let answer: Answer

    /// Asks for `what` (`idle`, `sleep`, ...) in `mode` (`block`, `delay`), listed by
    /// `systemd-inhibit --list` as `who` and `why`. Throws when the system bus cannot be
    /// reached (`ENOENT` without one).
    public init(what: String, who: String, why: String, mode: String, loop: EventLoop,
                done: @escaping (Result<FileDescriptor, Errno>) -> Void) throws(Errno) {
        answer = Answer(done)
        var bus: OpaquePointer?
        let userdata = Unmanaged.passUnretained(answer).toOpaque()
        try systemdCall("ask logind for an inhibitor on the system bus") {
            bgtask_logind_inhibit(loop.event, what, who, why, mode, { message, userdata, _ in
                let answer = Unmanaged<Answer>.fromOpaque(userdata!).takeUnretainedValue()
                var why: UnsafePointer<CChar>?
                let fd = bgtask_logind_inhibitor(message, &why)
                answer.give(fd >= 0 ? .success(FileDescriptor(fd))
                                    : .failure(Errno(-fd, why.map { String(cString: $0) } ?? "logind's Inhibit")))
                return 0
            }, userdata, &bus)
        }
        self.bus = bus!
        loop.eventSourcesChanged()
    }

    deinit { sd_bus_flush_close_unref(bus) }

    /// The closure, called once (the bus's callback holds this without retaining it: the
    /// request outlives its connection).
    private final class Answer {
        private var done: ((Result<FileDescriptor, Errno>) -> Void)?
        init(_ done: @escaping (Result<FileDescriptor, Errno>) -> Void) { self.done = done }
        func give(_ result: Result<FileDescriptor, Errno>) {
            let done = self.done
            self.done = nil
            done?(result)
        }
    }
}
