// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// `Wake` through the client library (`bgtask-libprobe`), the daemon and `bgtaskctl`.
@Suite(.serialized) struct WakeEndToEndTests {
    /// A library app, suspended after an empty background transition, and a monitor.
    static func suspendedApp(_ daemon: TestDaemon, mode: String = "complete") throws -> (Probe, Spawned) {
        let monitor = try Spawned(Binaries.path("bgtaskctl"), ["--socket", daemon.socketPath, "--json", "monitor"])
        #expect(try JSON.parse(try #require(try monitor.readLine(timeout: 5)))["event"] == "monitoring")
        let app = try Probe(daemon: daemon, binary: "bgtask-libprobe")
        try app.send("wake-mode \(mode)")
        _ = try app.next { $0["wakeMode"] != nil }
        try daemon.setState(app.pid, "background")
        try waitUntil("the app suspended") { try daemon.app(app.pid)?["state"] == "suspended" }
        return (app, monitor)
    }

    /// Reads monitor lines until one matches; returns it and when the test saw it.
    static func next(_ monitor: Spawned, _ predicate: (JSON) -> Bool) throws -> (JSON, Int64) {
        while true {
            guard let line = try monitor.readLine(timeout: 5) else { throw TestFailure("monitor ended") }
            let event = try JSON.parse(line)
            if predicate(event) { return (event, Clock.realtimeNanoseconds()) }
        }
    }

    @Test func aSilentPushWakesTheAppWhichIsSuspendedAgainOnceItsHandlerCompletes() throws {
        let daemon = try TestDaemon(["WakeTimeSec=5s"])
        let (app, monitor) = try Self.suspendedApp(daemon)
        let (code, output) = try daemon.ctl(["wake", "\(app.pid)", "--reason", "push", "--payload", #"{"message":42}"#])
        #expect(code == 0, "\(output)")
        let woke = try app.next { $0["wake"] != nil }
        #expect(woke["wake"] == "push" && woke["payload"]?["message"] == 42)
        let completed = try #require(woke["completed"]?.intValue)
        _ = try Self.next(monitor) { $0["event"] == "woken" }  // the suspension before it is not the one
        let (suspended, seen) = try Self.next(monitor) { $0["event"] == "suspended" }
        #expect(suspended["entry"]?["reason"] == "wakeFinished")
        // From the completion handler's call to the monitor's line, in the test's own clock.
        #expect(seen - completed < 50_000_000, "suspended \((seen - completed) / 1_000_000) ms after the handler completed")
        #expect(app.lines.filter { $0["wake"] != nil }.count == 1)
        let history = try daemon.history()
        #expect(history.contains { $0["action"] == "woken" && $0["detail"] == "push" })
        #expect(try daemon.ctl(["history"]).1.contains("WAKE"))
    }

    @Test func anAppThatIgnoresTheWakeIsSuspendedAtTheWindowsEnd() throws {
        let daemon = try TestDaemon(["WakeTimeSec=500ms"])
        let (app, monitor) = try Self.suspendedApp(daemon, mode: "ignore")
        try daemon.manager("Wake", ["pid": .int(Int64(app.pid)), "reason": "fetch"])
        _ = try app.next { $0["wake"] != nil }
        _ = try Self.next(monitor) { $0["event"] == "woken" }
        let (suspended, _) = try Self.next(monitor) { $0["event"] == "suspended" }
        #expect(suspended["entry"]?["pid"]?.intValue == Int64(app.pid))
        #expect(try daemon.app(app.pid)?["state"] == "suspended")
    }

    @Test func anAppHoldingATaskPastTheWindowIsTerminated() throws {
        let daemon = try TestDaemon(["WakeTimeSec=500ms", "ExpirationWarningSec=100ms", "GrantLatencyMaxSec=5ms"])
        let (app, monitor) = try Self.suspendedApp(daemon, mode: "keep")
        try daemon.manager("Wake", ["pid": .int(Int64(app.pid)), "reason": "sync"])
        let (terminated, _) = try Self.next(monitor) { $0["event"] == "terminated" }
        #expect(terminated["entry"]?["reason"] == "assertionsBeyondPermittedTime" && terminated["entry"]?["tasks"] == .array(["kept"]))
        try app.process.wait(timeout: 5)
    }

    @Test func aForegroundAppIsNotWokenAndNobodyElsesAppCanBe() throws {
        let daemon = try TestDaemon()
        let app = try Probe(daemon: daemon, binary: "bgtask-libprobe")
        try daemon.setState(app.pid, "foreground")
        let reply = try daemon.manager("Wake", ["pid": .int(Int64(app.pid)), "reason": "x"])
        #expect(reply["outcome"] == "foreground")
        // Nor expire it, or read its policy: the same rights as SetAppState.
        for verb in [["wake"], ["expire"], ["expire", "--deadline"], ["policy"]] {
            let (code, output) = try daemon.ctl(verb + ["\(app.pid)"], asUser: 65534)
            #expect(code == 1 && output.contains("permission denied"), "\(verb): \(output)")
        }
        let (bad, refusal) = try daemon.ctl(["wake", "\(app.pid)", "--payload", "[1,2]"])
        #expect(bad == 2 && refusal.contains("JSON object"), "\(refusal)")
        #expect(throws: (any Error).self) {  // over 4 KiB
            try daemon.manager("Wake", ["pid": .int(Int64(app.pid)), "payload": .object(["x": .string(String(repeating: "a", count: 5000))])])
        }
    }
}
