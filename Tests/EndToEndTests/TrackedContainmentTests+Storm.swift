// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
import Testing
import TestSupport

/// Performance III: a tracked app's suspension leaves its last read of the process-events
/// connector (what its members forked before their stops) to the end of the pass, one read
/// for every app suspended in it (`Enforcer.finishStops`). What that must not lose: a worker
/// forked just before the stop, read only then, is stopped by the suspension itself, not
/// found running later by the stray-`SIGCONT` sweep.
extension TrackedContainmentTests {
    /// Registers, says "ready", then double-forks up to 300 workers as fast as it can, each
    /// writing its pid to the file named, then pausing.
    static let stormingApp = #"""
    import json, os, signal, socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    s.sendall(json.dumps({"method": "io.bgtaskd.App.GetTimeRemaining", "parameters": {}}).encode() + b"\0")
    reply = b""
    while not reply.endswith(b"\0"): reply += s.recv(4096)
    print("ready", flush=True)
    for _ in range(300):
        if os.fork() == 0:
            if os.fork() == 0:
                with open(sys.argv[2], "a") as out: out.write("%d\n" % os.getpid())
                signal.pause(); os._exit(0)
            os._exit(0)
        os.wait()
    signal.pause()
    """#

    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func workersForkedAsTheAppIsSuspendedAreStoppedWithIt() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1min"])
        let file = daemon.directory + "/workers"
        let app = try Spawned("/usr/bin/python3", ["-c", Self.stormingApp, daemon.socketPath, file])
        // However the test ends: the app, and every worker — held stopped, or stopped before
        // it wrote its pid (in no list, and in no tree once double-forked), which the daemon,
        // stopping, would resume into its pause for ever (holding the test's stderr: `swift
        // test` once waited on it).
        var written: [Pidfd] = []
        defer {
            try? app.signal(SIGKILL)
            for worker in written { try? worker.send(signal: SIGKILL) }
            for stray in processesNaming(file) { try? stray.send(signal: SIGKILL) }
        }
        try app.expectLine("ready")
        #expect(try daemon.app(app.pid)?["containment"] == "tracked")
        // Read with `readFile`: Foundation's `String(contentsOfFile:)`, reading the file while
        // the app appended to it, once left a 4 KiB buffer of its own unfreed (LeakSanitizer).
        let workers = { ((try? readFile(file)) ?? []).split(separator: UInt8(ascii: "\n")).compactMap { Int32(String(decoding: $0, as: UTF8.self)) } }
        try waitUntil("the first workers") { workers().count >= 10 }
        try daemon.setState(app.pid, "background")  // while it forks
        try waitUntil("the app stopped") { processState(app.pid) == "T" }
        // Held while stopped (they cannot exit): killed at the end, with the app.
        written = try workers().map { try Pidfd.open(pid: $0) }
        #expect(written.count < 300, "the app finished forking before it was suspended: nothing was tested")
        try waitUntil("every worker stopped") { written.allSatisfy { processState($0.pid) == "T" } }
        #expect(!daemon.log().contains { $0.contains("was resumed while suspended") })
    }
}
