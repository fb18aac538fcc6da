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

    /// The enforcement's records about a user's apps count against that user's records too.
    /// They went straight to the journal: uid 65534 continuing its own suspended apps by
    /// hand had the stray-`SIGCONT` check log a line for each app at each sweep (200 apps: 200
    /// lines a second, for as long as it went on). The apps are stopped again all the same.
    @Test func theEnforcementsRecordsAboutAUsersAppsAreRateLimitedToo() throws {
        let daemon = try TestDaemon()
        let count = 200
        let shell = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                     "/bin/sh", "-c", "for i in $(seq \(count)); do sleep 1000 & echo $!; done; wait"])
        defer { shell.killTree() }
        var sleeps: [Pidfd] = []
        for _ in 0..<count {
            guard let line = try shell.readLine(timeout: 10), let pid = Int32(line) else { throw TestFailure("no sleep pid") }
            sleeps.append(try Pidfd.open(pid: pid))
        }
        let intruder = try Intruder(daemon)
        for sleep in sleeps {
            try intruder.call("io.bgtaskd.Manager.SetAppState", "{\"pid\":\(sleep.pid),\"state\":\"background\"}")
        }
        try waitUntil("the user's \(count) apps stopped") { sleeps.allSatisfy { processState($0.pid) == "T" } }
        // Three sweeps of stray SIGCONTs: 600 records unbounded; within the user's limit, at
        // most one window's (the suspensions' records used up the first).
        for round in 1...3 {
            for sleep in sleeps { try sleep.send(signal: SIGCONT) }
            try waitUntil("the \(count) apps stopped again (round \(round))", timeout: 10) {
                sleeps.allSatisfy { processState($0.pid) == "T" }
            }
        }
        let resumed = daemon.log().filter { $0.contains("was resumed while suspended") }.count
        #expect(resumed <= UnprivilegedUserTests.logBurst, "\(resumed) records of stray SIGCONTs to uid 65534's apps")
        print("theEnforcementsRecordsAboutAUsersAppsAreRateLimitedToo: \(resumed) records of 600 stray SIGCONTs")
    }

    /// `Daemon.logBurst`, as the daemon ships it.
    static let logBurst = 200
}
