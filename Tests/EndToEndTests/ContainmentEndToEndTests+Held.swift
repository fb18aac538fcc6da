// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
import Testing
import TestSupport

/// Performance III: a unit app's `cgroup.events` is held and watched from its registration to
/// its exit, and its `cgroup.freeze` held for writing, so that a freeze opens no kernfs file.
/// What it must not cost: a descriptor per freeze, or one that outlives the app (its cgroup
/// removed under it too).
extension ContainmentEndToEndTests {
    @Test func aUnitAppsEventsAndFreezeAreHeldFromItsRegistrationAndLetGoWithItsCgroup() throws {
        let unit = try TestUnit("held")
        let daemon = try TestDaemon()
        let app = try unit.spawn("echo ready; exec sleep 600")
        try app.expectLine("ready")
        let events = unit.cgroup.directory + "/cgroup.events"
        let freeze = unit.cgroup.directory + "/cgroup.freeze"
        let held = { descriptorCount(of: daemon.process.pid, linkingTo: events) }
        let heldFreeze = { descriptorCount(of: daemon.process.pid, linkingTo: freeze) }
        #expect(held() == 0 && heldFreeze() == 0)
        try daemon.setState(app.pid, "foreground")  // registers it, a unit app
        #expect(try daemon.app(app.pid)?["containment"] == "unit")
        try waitUntil("its cgroup.events and cgroup.freeze held") { held() == 1 && heldFreeze() == 1 }
        for round in 1...2 {  // each freeze and thaw through the two descriptors
            try daemon.setState(app.pid, "background")
            try waitUntil("frozen (\(round))") { try unit.cgroup.isFrozen() }
            #expect(held() == 1 && heldFreeze() == 1)
            try daemon.setState(app.pid, "foreground")
            try waitUntil("thawed (\(round))") { try !unit.cgroup.isFrozen() }
            #expect(held() == 1 && heldFreeze() == 1)
        }
        #expect(!daemon.log().contains { $0.contains("SIGSTOP") })

        // Its process moved out and its cgroup removed (kernfs reports nothing more on the
        // descriptor): the daemon goes on serving, and lets the descriptor go with the app.
        try "\(app.pid)\n".write(toFile: Cgroup.mountPoint! + "/cgroup.procs", atomically: false, encoding: .utf8)
        try waitUntil("the unit empty") { try unit.cgroup.processes().isEmpty }
        try systemCall("rmdir(\(unit.cgroup.directory))") { rmdir(unit.cgroup.directory) }
        #expect(try daemon.app(app.pid)?["state"] == "foreground")
        try app.signal(SIGKILL)
        try waitUntil("the app gone from the daemon") { try daemon.app(app.pid) == nil }
        #expect(held() == 0 && heldFreeze() == 0)
    }
}

extension ContainmentEndToEndTests {
    /// The held files never take the last descriptors (`Enforcer.spareDescriptors`: 64 under a
    /// limit of 80): without room, the unit app holds nothing while it runs, and each freeze
    /// and thaw opens its own files, as before the files were held.
    @Test func aUnitAppHoldsNothingWhereTheLastDescriptorsWouldGoAndIsFrozenAllTheSame() throws {
        let unit = try TestUnit("spare")
        let daemon = try TestDaemon([], wrapper: ["/usr/bin/prlimit", "--nofile=80:80", "--"])
        let app = try unit.spawn("echo ready; exec sleep 600")
        try app.expectLine("ready")
        let held = { (file: String) in descriptorCount(of: daemon.process.pid, linkingTo: unit.cgroup.directory + "/" + file) }
        try daemon.setState(app.pid, "foreground")  // registers it, a unit app: watched in the same pass
        #expect(try daemon.app(app.pid)?["containment"] == "unit")
        #expect(held("cgroup.events") == 0 && held("cgroup.freeze") == 0)
        try daemon.setState(app.pid, "background")
        try waitUntil("frozen") { try unit.cgroup.isFrozen() }
        // The freeze's own file is closed just after its write, which the kernel may have
        // carried out by then: not kept, but looked at once it was still open in one run under
        // ASan.
        try waitUntil("its freeze's cgroup.freeze let go") { held("cgroup.freeze") == 0 }
        try daemon.setState(app.pid, "foreground")
        try waitUntil("thawed") { try !unit.cgroup.isFrozen() }
        try waitUntil("its freeze's cgroup.events let go") { held("cgroup.events") == 0 }
        #expect(!daemon.log().contains { $0.contains("SIGSTOP") })
    }
}

extension ContainmentEndToEndTests {
    /// The held `cgroup.freeze` files give way when the daemon runs out of descriptors (here
    /// uid 65534 holding connections until one is refused, under a limit of 160): let go, said
    /// once, and none held from then on; the unit app is frozen and thawed all the same, through
    /// files it opens each time.
    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon and setpriv to uid 65534"))
    func heldFreezeFilesGiveWayWhenTheDaemonRunsOutOfDescriptors() throws {
        let unit = try TestUnit("yield")
        let daemon = try TestDaemon([], wrapper: ["/usr/bin/prlimit", "--nofile=160:160", "--"])
        let app = try unit.spawn("echo ready; exec sleep 600")
        try app.expectLine("ready")
        let held = { (file: String) in descriptorCount(of: daemon.process.pid, linkingTo: unit.cgroup.directory + "/" + file) }
        try daemon.setState(app.pid, "foreground")  // registers it, a unit app
        #expect(held("cgroup.events") == 1 && held("cgroup.freeze") == 1)

        let intruder = try Intruder(daemon)
        let connections = try intruder.run("connections 300", timeout: 30)
        #expect(connections["refused"] == "io.bgtaskd.App.LimitExceeded", "\(connections.serialized)")
        #expect(held("cgroup.freeze") == 0 && held("cgroup.events") == 1, "\(connections.serialized)")
        let yielded = { (line: String) in line.contains("cgroup.freeze files of 1 unit app(s) let go") }
        #expect(daemon.logged(yielded))
        #expect(try intruder.run("release")["released"] == connections["accepted"])
        try waitUntil("the daemon closed them") {
            try intruder.call("io.bgtaskd.Manager.GetStatus")["parameters"]?["connections"] == 1
        }

        for round in 1...2 {
            try daemon.setState(app.pid, "background")
            try waitUntil("frozen (\(round))") { try unit.cgroup.isFrozen() }
            try daemon.setState(app.pid, "foreground")
            try waitUntil("thawed (\(round))") { try !unit.cgroup.isFrozen() }
            #expect(held("cgroup.freeze") == 0)
        }
        #expect(!daemon.log().contains { $0.contains("SIGSTOP") })
        #expect(daemon.log().filter(yielded).count == 1)  // said once: nothing held to let go again
    }
}
