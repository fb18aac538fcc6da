// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
import Glibc
import Testing
import TestSupport

/// What a `tree` app's suspension stopped is what its resumption continues (the daemon in a
/// network namespace of its own: no process-events connector, the app is its process tree).
/// A resumption walked the tree again: a member whose parent was killed while the app was
/// suspended, re-parented and below the app's process no more, was left stopped for ever; so
/// were the processes stopped with an app whose own process exited while it was suspended.
/// uid 65534's app, backgrounded and foregrounded by uid 65534.
extension ContainmentEndToEndTests {
    static let orphanWrapper = ["/usr/bin/unshare", "--net", "--"]

    /// The pids below `pid`, parents before children (the test's own walk).
    static func descendants(of pid: Int32) throws -> [Int32] {
        Array(ProcessTree.members(of: try Pidfd.open(pid: pid)).map(\.pid).dropFirst())
    }

    /// uid 65534's app (sh) → middle (sh) → leaf (sleep), backgrounded by uid 65534 (all three
    /// stopped), then the middle shell killed: the sleep is re-parented, out of the app's
    /// tree, still stopped. `then` gets the daemon, the app and the sleep (killed after it).
    func withAMemberReparentedWhileSuspended(_ then: (TestDaemon, Spawned, Pidfd) throws -> Void) throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1min"], wrapper: Self.orphanWrapper)
        // Once its child is gone, the app's process waits on as `sleep`.
        let app = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                   "sh -c 'sleep 60 & wait' & echo ready; wait; exec sleep 60"])
        defer { app.killTree() }
        try app.expectLine("ready")
        var below: [Int32] = []
        try waitUntil("the middle shell and its sleep") {
            below = try Self.descendants(of: app.pid)
            return below.count == 2 && (try? ProcStat.read(pid: below[1]))?.command == "sleep"
        }
        let middle = try Pidfd.open(pid: below[0]), leaf = try Pidfd.open(pid: below[1])
        defer { try? leaf.send(signal: SIGKILL) }
        #expect(try daemon.ctl(["background", String(app.pid)], asUser: 65534).0 == 0)
        try waitUntil("the app's three processes stopped") { [app.pid, middle.pid, leaf.pid].allSatisfy { processState($0) == "T" } }
        #expect(daemon.logged { $0.contains("(containment tree") })
        try middle.send(signal: SIGKILL)
        try waitUntil("the sleep re-parented") { (try? ProcStat.read(pid: leaf.pid))?.parentPID != middle.pid }
        #expect(processState(leaf.pid) == "T")
        try then(daemon, app, leaf)
    }

    @Test(.enabled(if: getuid() == 0, "needs root: a network namespace (unshare --net) and setpriv to uid 65534"))
    func aMemberReparentedWhileSuspendedIsContinuedWithTheApp() throws {
        try withAMemberReparentedWhileSuspended { daemon, app, leaf in
            #expect(try daemon.ctl(["foreground", String(app.pid)], asUser: 65534).0 == 0)
            try waitUntil("the re-parented sleep continued") { processState(leaf.pid) == "S" }
            try waitUntil("the app continued") { processState(app.pid) == "S" }
        }
    }

    /// And a termination ends it with the app.
    @Test(.enabled(if: getuid() == 0, "needs root: a network namespace (unshare --net) and setpriv to uid 65534"))
    func aMemberReparentedWhileSuspendedIsTerminatedWithTheApp() throws {
        try withAMemberReparentedWhileSuspended { daemon, app, leaf in
            #expect(try daemon.ctl(["terminate", String(app.pid)], asUser: 65534).0 == 0)
            try waitUntil("the app killed") { app.hasExited }
            try waitUntil("the re-parented sleep killed") { leaf.hasExited }
        }
    }

    /// And the stray-`SIGCONT` check reads what the suspension kept: continued by someone
    /// else, the re-parented sleep is stopped again (a walk from the app's process no longer
    /// reaches it).
    @Test(.enabled(if: getuid() == 0, "needs root: a network namespace (unshare --net) and setpriv to uid 65534"))
    func aMemberReparentedWhileSuspendedAndContinuedIsStoppedAgain() throws {
        try withAMemberReparentedWhileSuspended { daemon, app, leaf in
            try leaf.send(signal: SIGCONT)
            try waitUntil("the check's log line") {
                daemon.logged { $0.contains("was resumed while suspended (pid \(leaf.pid) ") }
            }
            try waitUntil("the re-parented sleep stopped again") { processState(leaf.pid) == "T" }
            #expect(try daemon.ctl(["foreground", String(app.pid)], asUser: 65534).0 == 0)
            try waitUntil("the re-parented sleep continued with the app") { processState(leaf.pid) == "S" }
        }
    }

    /// What a suspension kept is checked against the owner again at the resumption and at a
    /// termination: a member continued by someone else meanwhile that became root (a setuid
    /// program) is neither sent `SIGCONT` nor killed for uid 65534, though the suspension
    /// stopped it.
    @Test(.enabled(if: getuid() == 0, "needs root: a network namespace (unshare --net) and a setuid-root helper"),
          arguments: ["foreground", "terminate"])
    func aKeptMemberThatBecameRootIsNeitherContinuedNorKilled(_ action: String) throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1min"], wrapper: Self.orphanWrapper)
        let becoming = try BecomingRoot(in: daemon.directory)
        defer { becoming.remove() }
        // The child waits on a FIFO with no child of its own (a `sleep` would be stopped with
        // it, and keep it waiting), then becomes root.
        let app = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                   "\"$@\" & echo ready; wait", "app", "/usr/bin/python3", "-c", becoming.program])
        defer { app.killTree() }
        try app.expectLine("ready")
        var below: [Int32] = []
        try waitUntil("the waiting child") { below = try Self.descendants(of: app.pid); return !below.isEmpty }
        let child = try Pidfd.open(pid: below[0])
        defer { try? child.send(signal: SIGKILL) }
        #expect(try daemon.ctl(["background", String(app.pid)], asUser: 65534).0 == 0)
        try waitUntil("the app and its child stopped") { processState(app.pid) == "T" && processState(child.pid) == "T" }
        // Continued by someone else, it becomes root; then it is stopped again (by root).
        try child.send(signal: SIGCONT)
        try becoming.release()
        guard let line = try app.readLine(timeout: 10), Int32(line) == child.pid else { throw TestFailure("the shell did not become root") }
        #expect(try ProcStatus.uids(pid: child.pid) == ProcessUIDs(real: 0, effective: 0, saved: 0))
        try child.send(signal: SIGSTOP)
        try waitUntil("root's process stopped") { processState(child.pid) == "T" }
        #expect(try daemon.ctl([action, String(app.pid)], asUser: 65534).0 == 0)
        if action == "foreground" {
            try waitUntil("the app continued") { processState(app.pid) == "S" }
        } else {
            _ = try app.wait(timeout: 5)
        }
        #expect(processState(child.pid) == "T", "root's process \(action == "foreground" ? "continued" : "killed") for uid 65534")
    }

    @Test(.enabled(if: getuid() == 0, "needs root: a network namespace (unshare --net) and setpriv to uid 65534"))
    func whatWasStoppedWithAnAppThatExitsWhileSuspendedIsContinued() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1min"], wrapper: Self.orphanWrapper)
        let app = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c",
                                                   "sleep 60 & echo ready; wait"])
        defer { app.killTree() }
        try app.expectLine("ready")
        var below: [Int32] = []
        try waitUntil("the shell's sleep") {
            below = try Self.descendants(of: app.pid)
            return below.count == 1 && (try? ProcStat.read(pid: below[0]))?.command == "sleep"
        }
        let child = try Pidfd.open(pid: below[0])
        defer { try? child.send(signal: SIGKILL) }
        #expect(try daemon.ctl(["background", String(app.pid)], asUser: 65534).0 == 0)
        try waitUntil("the app and its sleep stopped") { processState(app.pid) == "T" && processState(child.pid) == "T" }
        try app.signal(SIGKILL)
        try waitUntil("the exit noticed, and what was stopped with it continued") {
            daemon.log().contains { $0.contains("exited while suspended; 1 of the processes stopped with it continued") }
        }
        try waitUntil("the sleep running") { processState(child.pid) == "S" }
    }
}
