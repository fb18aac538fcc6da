import BGTaskSystem
import Glibc

/// Suspending, resuming and terminating a process, always through its pidfd.
enum Enforcement {
    static func suspend(_ pidfd: Pidfd) throws(Errno) { try pidfd.send(signal: SIGSTOP) }

    static func resume(_ pidfd: Pidfd) throws(Errno) { try pidfd.send(signal: SIGCONT) }

    /// Thaws first so a stopped process can act on a catchable signal.
    static func terminate(_ pidfd: Pidfd, signal: Int32) throws(Errno) {
        if signal != SIGKILL { try pidfd.send(signal: SIGCONT) }
        try pidfd.send(signal: signal)
    }

    static func kill(_ pidfd: Pidfd) throws(Errno) { try pidfd.send(signal: SIGKILL) }
}
