// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import TestSupport
import Glibc
import Testing
import Varlink

/// The reference Varlink client, bgtaskctl, and access control across users.
@Suite(.serialized) struct ClientsEndToEndTests {
    /// The PyPI `varlink` package, which nobody here wrote, talks to the daemon.
    @Test func referencePythonClientCallsAndSubscribes() throws {
        let daemon = try TestDaemon(["GrantLatencyMaxSec=10ms"])
        let script = """
        import json, sys, varlink
        client = varlink.Client(address="unix:" + sys.argv[1])
        with client.open("org.varlink.service") as service:
            info = service.GetInfo()
        with client.open("io.bgtaskd.Manager", namespaced=False) as manager:
            status = manager.GetStatus()
        with client.open("io.bgtaskd.App", namespaced=False) as app:
            for event in app.Subscribe(_more=True):
                first = event
                break
        print(json.dumps({"interfaces": info["interfaces"], "apps": status["apps"], "event": first["event"]}))
        """
        let python = try Spawned("/usr/bin/env", ["python3", "-c", script, daemon.socketPath])
        python.closeInput()
        let output = try python.readAll(timeout: 20)
        let status = try python.wait(timeout: 20)
        #expect(Spawned.exitCode(status) == 0, "python printed: \(output)")
        let result = try JSON.parse(output)
        #expect(result["interfaces"] == .array(["org.varlink.service", "io.bgtaskd.App", "io.bgtaskd.Manager"]))
        #expect(result["apps"]?.intValue == 0)
        #expect(result["event"]?.stringValue == "subscribed")
    }

    /// `bgtaskctl --user`: the per-user daemon's socket, `$XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd`
    /// (where `make run` and the user unit listen), `/run/user/UID` where that is not set;
    /// `--socket` and `$BGTASKD_SOCKET` as before.
    @Test func ctlUserTalksToThePerUserDaemon() throws {
        let daemon = try TestDaemon()
        let ctl = Binaries.path("bgtaskctl")
        // A runtime directory whose `bgtaskd/` is the test daemon's directory.
        let runtime = daemon.directory + "/runtime"
        try systemCall("mkdir") { mkdir(runtime, 0o700) }
        try systemCall("symlink") { symlink(daemon.directory, runtime + "/bgtaskd") }
        let (code, output) = try SystemdTests.run([ctl, "--user", "status"], environment: ["XDG_RUNTIME_DIR=\(runtime)"])
        #expect(code == 0 && output.hasPrefix("bgtaskd 0.1.0 on \(runtime)/bgtaskd/io.bgtaskd\n"), "\(output)")
        let (_, unset) = try SystemdTests.run([ctl, "--user", "status"], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)"])
        #expect(unset.contains(" /run/user/\(getuid())/bgtaskd/io.bgtaskd"), "\(unset)")  // whether one listens there or not
        let (fromEnvironment, _) = try SystemdTests.run([ctl, "status"], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)"])
        #expect(fromEnvironment == 0)
        // No per-user daemon: how to have one. A socket named by hand: only the failure.
        let none = daemon.directory + "/none"
        let noDaemon = try SystemdTests.run([ctl, "--user", "status"], environment: ["XDG_RUNTIME_DIR=\(none)"])
        #expect(noDaemon == (1, "bgtaskctl: cannot connect to bgtaskd at \(none)/bgtaskd/io.bgtaskd: No such file or directory"
                + " (a per-user daemon runs once enabled: systemctl --user enable --now bgtaskd.socket)"))
        let named = try SystemdTests.run([ctl, "--socket", none + "/io.bgtaskd", "status"])
        #expect(named == (1, "bgtaskctl: cannot connect to bgtaskd at \(none)/io.bgtaskd: No such file or directory"))
    }

    /// The clients' rule for the socket: `--socket`, else `$BGTASKD_SOCKET`, else the per-user
    /// socket where a daemon answers, else the system socket. A user's apps then never split
    /// between the user's own daemon and the system's, whatever environment started them.
    /// The Swift library (`bgtask-libprobe`) and bgtaskctl given only `XDG_RUNTIME_DIR` reach
    /// the daemon answering there; with a socket file there that no daemon answers at (one
    /// left by a daemon gone), the system socket. (The C library: `CLibraryTests`;
    /// bgtask-session, which takes the same `DaemonSocket.path`: the session test.)
    @Test func everyClientFindsThePerUserDaemonThatAnswers() throws {
        let daemon = try TestDaemon()
        let runtime = daemon.directory + "/runtime"
        try systemCall("mkdir") { mkdir(runtime, 0o700) }
        try systemCall("symlink") { symlink(daemon.directory, runtime + "/bgtaskd") }
        let only = ["XDG_RUNTIME_DIR=\(runtime)"]
        let app = try Probe(process: try Spawned(Binaries.path("bgtask-libprobe"), [], environment: only))
        #expect(try daemon.app(app.pid)?["state"] == "foreground")
        let (code, status) = try SystemdTests.run([Binaries.path("bgtaskctl"), "status"], environment: only)
        #expect(code == 0 && status.hasPrefix("bgtaskd 0.1.0 on \(runtime)/bgtaskd/io.bgtaskd\n"), "\(status)")
        // What bgtaskctl status says of the system socket: its daemon's first line where one
        // answers, else the failure naming it (as on the machines the suite runs on).
        let systemAnswers = UnixSocket.isAnswering(path: "/run/bgtaskd/io.bgtaskd")
        func isTheSystemSocket(_ result: (Int32, String)) -> Bool {
            systemAnswers ? result.0 == 0 && result.1.hasPrefix("bgtaskd 0.1.0 on /run/bgtaskd/io.bgtaskd\n")
                : result.0 == 1 && result.1.hasPrefix("bgtaskctl: cannot connect to bgtaskd at /run/bgtaskd/io.bgtaskd: ")
        }
        // --system: the system daemon's, though the per-user one answers.
        let system = try SystemdTests.run([Binaries.path("bgtaskctl"), "--system", "status"], environment: only)
        #expect(isTheSystemSocket(system), "\(system)")
        // A socket file no daemon answers at: the system socket.
        let stale = daemon.directory + "/stale"
        try systemCall("mkdir") { mkdir(stale, 0o700) }
        try systemCall("mkdir") { mkdir(stale + "/bgtaskd", 0o700) }
        try UnixSocket.listen(path: stale + "/bgtaskd/io.bgtaskd").close()
        let fallen = try SystemdTests.run([Binaries.path("bgtaskctl"), "status"], environment: ["XDG_RUNTIME_DIR=\(stale)"])
        #expect(isTheSystemSocket(fallen), "\(fallen)")
    }

    /// The per-user socket is taken only where its daemon runs as the client's own user (or
    /// root): root with another user's `XDG_RUNTIME_DIR` (`sudo -E`, `su` without `-`) does not
    /// talk to that user's daemon — whatever the user runs there — but to the system's. uid
    /// 65534's daemon, in uid 65534's runtime directory: its own user's clients reach it.
    @Test(.enabled(if: getuid() == 0, "needs root to run a daemon and clients as another user"))
    func thePerUserSocketIsTakenOnlyWhereTheClientsOwnUserAnswers() throws {
        let directory = try temporaryDirectory("bgtaskd-users")
        try systemCall("chown") { chown(directory, 65534, 65534) }
        let daemon = try TestDaemon(directory: directory, wrapper: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        let runtime = try temporaryDirectory("bgtaskd-runtime")
        try systemCall("chown") { chown(runtime, 65534, 65534) }
        try systemCall("symlink") { symlink(directory, runtime + "/bgtaskd") }
        let only = ["XDG_RUNTIME_DIR=\(runtime)"]
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let own = try SystemdTests.run(nobody + [Binaries.path("bgtaskctl"), "status"], environment: only)
        #expect(own.0 == 0 && own.1.hasPrefix("bgtaskd 0.1.0 on \(runtime)/bgtaskd/io.bgtaskd\n"), "\(own)")
        let app = try Probe(process: try Spawned(nobody[0], Array(nobody.dropFirst()) + [Binaries.path("bgtask-libprobe")], environment: only))
        #expect(try daemon.app(app.pid)?["state"] == "foreground")
        // Root, in that user's runtime directory: the system socket.
        let systemAnswers = UnixSocket.isAnswering(path: "/run/bgtaskd/io.bgtaskd")
        let roots = try SystemdTests.run([Binaries.path("bgtaskctl"), "status"], environment: only)
        #expect(systemAnswers ? roots.0 == 0 && roots.1.hasPrefix("bgtaskd 0.1.0 on /run/bgtaskd/io.bgtaskd\n")
                : roots.0 == 1 && roots.1.hasPrefix("bgtaskctl: cannot connect to bgtaskd at /run/bgtaskd/io.bgtaskd: "),
                "\(roots)")
        // Root's app, the Swift library's: subscribed where it says (an error where no system
        // daemon answers), before its first line; not with uid 65534's daemon.
        let rootsApp = try Spawned(Binaries.path("bgtask-libprobe"), [], environment: only)
        let first = try JSON.parse(try #require(try rootsApp.readLine(timeout: 10)))
        #expect(first["ready"] != nil || first["error"]?.stringValue?.contains("/run/bgtaskd/io.bgtaskd") == true, "\(first)")
        #expect(try daemon.app(rootsApp.pid) == nil)
    }

    @Test func ctlShowsTablesJSONAndExitCodes() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=30s"])
        let app = try Spawned("/bin/sleep", ["60"])
        let (code, table) = try daemon.ctl(["background", "\(app.pid)"])
        #expect(code == 0)
        #expect(table.contains("suspended"))
        let (_, status) = try daemon.ctl(["status"])
        #expect(status.contains("Apps: 1 (0 background, 1 suspended)"))
        #expect(status.contains("   Keep awake: no (no app runs in the background)\n"))  // suspended at once
        let lines = status.split(separator: "\n")
        let header = try #require(lines.first { $0.hasPrefix("PID") })
        let row = try #require(lines.first { $0.hasPrefix("\(app.pid) ") })
        // Aligned: the STATE column starts at the same offset in the header and the row.
        #expect(offset(of: "STATE", in: header) != nil)
        #expect(offset(of: "STATE", in: header) == offset(of: "suspended", in: row))
        #expect(status.contains("1 app listed."))
        let (_, json) = try daemon.ctl(["--json", "apps"])
        #expect(try JSON.parse(json)["apps"]?.arrayValue?.first?["state"] == "suspended")
        let (_, noLegend) = try daemon.ctl(["--no-legend", "tasks"])
        #expect(noLegend.isEmpty)
        #expect(try daemon.ctl(["foreground", "\(app.pid)"]).0 == 0)
        #expect(try daemon.ctl(["foreground", "not-a-pid"]).0 == 2)
        #expect(try daemon.ctl(["frobnicate"]).0 == 2)
        #expect(try daemon.ctl(["terminate", "999999"]) == (1, "bgtaskctl: no app contains pid 999999"))
        #expect(try daemon.ctl(["background", "1"]) == (1, "bgtaskctl: invalid parameter: pid 1 cannot be managed"))
    }

    /// A non-root user cannot change another user's app, and sees only its own.
    @Test(.enabled(if: getuid() == 0, "needs root to run clients as another user"))
    func nonRootCannotManageAnotherUsersApp() throws {
        let daemon = try TestDaemon()
        let rootApp = try Spawned("/bin/sleep", ["60"])
        try daemon.setState(rootApp.pid, "foreground")  // registered, owned by uid 0
        let (code, output) = try daemon.ctl(["background", "\(rootApp.pid)"], asUser: 65534)
        #expect(code == 1)
        #expect(output == "bgtaskctl: permission denied: the app belongs to another user")
        #expect(processState(rootApp.pid) != "T")
        #expect(try daemon.app(rootApp.pid)?["state"]?.stringValue == "foreground")
        let (_, listed) = try daemon.ctl(["--json", "apps"], asUser: 65534)
        #expect(try JSON.parse(listed)["apps"] == .array([]))

        // Its own app it may manage.
        let ownApp = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sleep", "60"])
        try waitUntil("setpriv to exec sleep") { (try? ProcStat.read(pid: ownApp.pid))?.command == "sleep" }
        #expect(try daemon.ctl(["background", "\(ownApp.pid)"], asUser: 65534).0 == 0)
        try waitUntil("its own app stopped") { processState(ownApp.pid) == "T" }
    }

    @Test func errorsAreClearAndChangeNothing() throws {
        let daemon = try TestDaemon()
        let connection = try daemon.connect()
        func error(_ method: String, _ parameters: [String: JSON] = [:], more: Bool = false) throws -> String? {
            try connection.send(VarlinkCall(method: method, parameters: parameters, more: more))
            return try connection.receive(timeoutMilliseconds: 5000).error
        }
        #expect(try error("io.bgtaskd.Nope.Call") == "org.varlink.service.InterfaceNotFound")
        #expect(try error("io.bgtaskd.Manager.Nope") == "org.varlink.service.MethodNotFound")
        #expect(try error("io.bgtaskd.Manager.Monitor") == "org.varlink.service.ExpectedMore")
        #expect(try error("io.bgtaskd.Manager.SetAppState", ["pid": 1, "state": "background"])
                == "org.varlink.service.InvalidParameter")
        #expect(try error("io.bgtaskd.Manager.SetAppState", ["pid": .int(Int64(daemon.process.pid)), "state": "background"])
                == "org.varlink.service.InvalidParameter")
        #expect(try error("io.bgtaskd.Manager.SetAppState", ["pid": 2, "state": "background"])
                == "org.varlink.service.InvalidParameter")  // kthreadd
        #expect(try error("io.bgtaskd.Manager.SetAppState", ["pid": 12, "state": "sideways"])
                == "org.varlink.service.InvalidParameter")
        #expect(try error("io.bgtaskd.Manager.ListApps", ["bogus": true]) == "org.varlink.service.InvalidParameter")
        #expect(try error("io.bgtaskd.Manager.Terminate", ["pid": 999_999]) == "io.bgtaskd.Manager.NoSuchApp")
        // The interface is served verbatim from the repository's file.
        try connection.send(VarlinkCall(method: "org.varlink.service.GetInterfaceDescription",
                                        parameters: ["interface": "io.bgtaskd.App"]))
        let description = try connection.receive(timeoutMilliseconds: 5000).parameters["description"]?.stringValue
        #expect(description?.contains("interface io.bgtaskd.App\n") == true)
        #expect(description?.contains("interface io.bgtaskd.Manager") == false)
        // After all that, nothing changed and the daemon still serves.
        #expect(try daemon.apps().isEmpty)
        #expect(processState(daemon.process.pid) != "T")
    }
}

/// The character offset of `word` in `line`.
func offset(of word: String, in line: Substring) -> Int? {
    let characters = Array(line), target = Array(word)
    guard characters.count >= target.count else { return nil }
    return (0...(characters.count - target.count)).first { Array(characters[$0..<($0 + target.count)]) == target }
}
