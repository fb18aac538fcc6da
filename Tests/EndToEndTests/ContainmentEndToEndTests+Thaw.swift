// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// Finding 15 of the second review: the README said "the freezer needs no check: SIGCONT
/// cannot thaw a frozen cgroup", but the owner of a delegated unit can write `0` to its
/// `cgroup.freeze`: the app ran while listed `suspended`. Now the daemon watches the frozen
/// unit's `cgroup.events` and freezes it again. (The other way, systemd thawing a slice's
/// units, is checked under a real systemd: Tests/systemd/checks.sh.)
extension ContainmentEndToEndTests {
    @Test func aUnitItsOwnerThawsIsFrozenAgain() throws {
        let unit = try TestUnit("thawed")
        for path in [unit.cgroup.directory, unit.cgroup.directory + "/cgroup.procs", unit.cgroup.directory + "/cgroup.freeze"] {
            try systemCall("chown(\(path))") { chown(path, 65534, 65534) }
        }
        let daemon = try TestDaemon()
        let app = try unit.spawn("exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sleep 600")
        try waitUntil("the sleep in its unit as uid 65534") {
            (try? ProcStatus.uids(pid: app.pid))?.real == 65534 && (try? ProcStat.read(pid: app.pid))?.command == "sleep"
        }
        #expect(try daemon.ctl(["background", "--unit", "/" + unit.name], asUser: 65534).0 == 0)
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        let thaw = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                   "echo 0 > \(unit.cgroup.directory)/cgroup.freeze"])
        #expect(try thaw.wait(timeout: 5) == 0)
        try waitUntil("the thaw noticed") { daemon.log().contains { $0.contains("was thawed while suspended") } }
        try waitUntil("the unit frozen again") { try unit.cgroup.isFrozen() }
        #expect(try daemon.app(app.pid)?["state"] == "suspended")
        // A resume by the daemon is not a thaw to undo.
        #expect(try daemon.ctl(["foreground", "--unit", "/" + unit.name], asUser: 65534).0 == 0)
        try waitUntil("the unit thawed") { try !unit.cgroup.isFrozen() }
        #expect(daemon.log().filter { $0.contains("was thawed while suspended") }.count == 1)
        #expect(try !unit.cgroup.isFrozen())
    }
}
