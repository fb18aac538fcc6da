// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
import Testing
import TestSupport

/// Performance III: a unit app's `cgroup.events` is held and watched from its registration to
/// its exit, so that a freeze opens one kernfs file, not two. What it must not cost: a
/// descriptor per freeze, or one that outlives the app (its cgroup removed under it too).
extension ContainmentEndToEndTests {
    @Test func aUnitAppsEventsAreHeldFromItsRegistrationAndLetGoWithItsCgroup() throws {
        let unit = try TestUnit("held")
        let daemon = try TestDaemon()
        let app = try unit.spawn("echo ready; exec sleep 600")
        try app.expectLine("ready")
        let events = unit.cgroup.directory + "/cgroup.events"
        let held = { descriptorCount(of: daemon.process.pid, linkingTo: events) }
        #expect(held() == 0)
        try daemon.setState(app.pid, "foreground")  // registers it, a unit app
        #expect(try daemon.app(app.pid)?["containment"] == "unit")
        try waitUntil("its cgroup.events held") { held() == 1 }
        for round in 1...2 {  // each freeze and thaw through the one descriptor
            try daemon.setState(app.pid, "background")
            try waitUntil("frozen (\(round))") { try unit.cgroup.isFrozen() }
            #expect(held() == 1)
            try daemon.setState(app.pid, "foreground")
            try waitUntil("thawed (\(round))") { try !unit.cgroup.isFrozen() }
            #expect(held() == 1)
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
        #expect(held() == 0)
    }
}
