// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// The daemon keeps, on each connection, that its caller is its own app while no app was
/// added, removed or replaced (`Daemon.appCaller`). uid 65534 keeps such a connection open
/// in a child after its app exited.
extension UnprivilegedUserTests {
    /// As uid 65534: an app registers and calls (its connection now known as the app's),
    /// forks a child that keeps the connection, and exits. Once the daemon forgot the app,
    /// the child's calls on that connection are answered as the app's calls would be now,
    /// an error that it is gone, not from what the connection knew; and the daemon serves on.
    static let orphanedConnection = #"""
    import json, os, signal, socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    \#(UnprivilegedFloodTests.call)
    task = call("io.bgtaskd.App.BeginTask", {"name": "own"})["parameters"]["taskId"]
    call("io.bgtaskd.App.EndTask", {"taskId": task})
    call("io.bgtaskd.App.GetTimeRemaining", {})
    print("ready", flush=True)
    sys.stdin.readline()
    if os.fork() != 0:
        os._exit(0)
    signal.alarm(30)  # the child ends by itself, whatever happens to the test
    sys.stdin.readline()
    remaining = call("io.bgtaskd.App.GetTimeRemaining", {})
    begun = call("io.bgtaskd.App.BeginTask", {"name": "orphan"})
    print(json.dumps({"remaining": remaining.get("error"), "begun": begun.get("error")}), flush=True)
    """#

    @Test func aConnectionKeptPastItsAppsExitIsAnsweredAsTheAppIsGone() throws {
        let daemon = try TestDaemon()
        let app = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                  "/usr/bin/python3", "-c", Self.orphanedConnection, daemon.socketPath])
        defer { app.killTree() }
        try app.expectLine("ready", timeout: 30)
        #expect(try daemon.app(app.pid) != nil)
        try app.send("fork")
        _ = try app.wait(timeout: 10)
        try waitUntil("the exited app forgotten") { try daemon.app(app.pid) == nil }
        try app.send("call")
        let line = try #require(try app.readLine(timeout: 10))
        let answers = try JSON.parse(line)
        #expect(answers["remaining"] == .string("io.bgtaskd.Manager.NoSuchApp"), "\(line)")
        #expect(answers["begun"] == .string("io.bgtaskd.Manager.NoSuchApp"), "\(line)")
        #expect(try daemon.manager("GetStatus")["apps"] != nil)
        #expect(try daemon.apps().isEmpty)
    }
}
