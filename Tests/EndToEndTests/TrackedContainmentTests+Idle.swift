// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// What the process-events connector costs a daemon that has nothing to follow.
extension TrackedContainmentTests {
    /// The kernel's process events are asked for only while a process app is followed: a
    /// daemon with none is not woken by the processes the machine starts (each one woke it
    /// three times before, ~47 µs of its CPU), one with an app (here uid 65534's) is, a batch
    /// of them at a time (each process's fork and exit woke it twice before, ~40 µs: now a
    /// read leaves the connector unwatched for `processEventsHoldOff`), and once the app is
    /// gone it is not again.
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func processesElsewhereWakeTheDaemonOnlyWhileAProcessAppIsFollowed() throws {
        let daemon = try TestDaemon()
        /// The daemon's wake-ups (voluntary context switches) while `count` processes run and
        /// exit one after the other, between two calls (a call's own: its connection's accept,
        /// read and close, a handful).
        var elapsed = 0.0  // seconds the last `wakeUps` took
        func wakeUps(startingProcesses count: Int) throws -> Int {
            _ = try daemon.apps()
            let before = try voluntarySwitches(of: daemon.process.pid), start = Clock.monotonicNanoseconds()
            for _ in 0..<count {
                let process = try Spawned("/bin/true", [])
                _ = try process.wait(timeout: 10)
            }
            _ = try daemon.apps()
            elapsed = Double(Clock.monotonicNanoseconds() - start) / 1e9
            return try voluntarySwitches(of: daemon.process.pid) - before
        }
        let idle = try wakeUps(startingProcesses: 100)
        #expect(idle < 20, "\(idle) wake-ups for 100 processes of no app's, no app followed")

        // An unprivileged user's app: registering it is all it takes to make the daemon listen,
        // and its end is all it takes to stop it.
        let probe = try Probe(process: try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups",
                                                                         Binaries.path("bgtask-probe"), "--socket", daemon.socketPath]))
        try probe.call("remaining")  // registers the app: a process app, followed
        // Woken by them (it listens), but at most twice per hold-off (its timer, then the read),
        // and the calls' own few: not twice per process.
        let following = try wakeUps(startingProcesses: 100)
        let holdOff = 0.05  // `Daemon.processEventsHoldOff`
        let bound = 20 + Int(2 * elapsed / holdOff)
        #expect(following >= 1 && following <= min(bound, 100),
                "\(following) wake-ups for 100 processes' forks and exits in \(elapsed) s, an app followed")

        try probe.send("exit 0")
        try waitUntil("the app forgotten") { try daemon.apps().isEmpty }
        let after = try wakeUps(startingProcesses: 100)
        #expect(after < 20, "\(after) wake-ups for 100 processes of no app's, the app gone")
    }
}
