// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// From the second review: per-call records let one user write 121,000 journal lines in
/// 15 s, past journald's own rate limit, which then dropped other users' records.
extension UnprivilegedUserTests {
    @Test func oneUsersRecordsAreRateLimitedAndOthersStillLogged() throws {
        let daemon = try TestDaemon()
        let sleeper = try spawnUnprivilegedSleep()
        let intruder = try Intruder(daemon)
        for _ in 0..<300 {
            for state in ["background", "foreground"] {
                try intruder.call("io.bgtaskd.Manager.SetAppState", "{\"pid\":\(sleeper.pid),\"state\":\"\(state)\"}")
            }
        }
        let own = daemon.log().filter { $0.contains("App pid \(sleeper.pid) ") }.count
        #expect(own <= UnprivilegedUserTests.logBurst, "\(own) records about uid 65534's app")  // of some 1,500
        let rootApp = try Spawned("/bin/sleep", ["600"])
        try daemon.setState(rootApp.pid, "background")
        try waitUntil("root's app still logged") { daemon.log().contains { $0.contains("App pid \(rootApp.pid) ") } }
    }

    /// `Daemon.logBurst`, as the daemon ships it.
    static let logBurst = 200
}
