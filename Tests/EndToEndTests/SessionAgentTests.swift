// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// bgtask-session against a real sway with real foot windows, all as uid 65534, and a root
/// daemon: the workspace, the scratchpad and the focus decide, no bgtaskctl call. Serialized:
/// each test runs a compositor of its own.
@Suite(.serialized) struct SessionAgentTests {
    /// A compositor, a daemon and an agent for one test.
    final class Rig {
        let sway: SwaySession
        let daemon: TestDaemon
        var agent: Spawned?
        /// Each agent started logs to a file of its own.
        var agentLog: String { sway.directory + "/agent\(started).log" }
        var started = 0

        init(daemonSettings: [String] = [], swayCgroup: String? = nil) throws {
            sway = try SwaySession(cgroup: swayCgroup)
            daemon = try TestDaemon(["BackgroundTimeSec=3s", "ExpirationWarningSec=1s"] + daemonSettings)
        }

        deinit { if let agent { agent.killTree(); _ = try? agent.wait(timeout: 5) } }

        func startAgent(_ settings: [String] = ["BackgroundDelaySec=300ms"], daemon: TestDaemon? = nil) throws {
            let target = daemon ?? self.daemon
            started += 1
            agent = try sway.agent(socket: target.socketPath, settings, log: agentLog)
            try waitUntil("the agent to follow sway", timeout: 10) { agentLines().contains { $0.contains("following sway") } }
        }

        func agentLines() -> [String] {
            String(decoding: (try? readFile(agentLog)) ?? [], as: UTF8.self).split(separator: "\n").map(String.init)
        }
    }

    /// Cgroups `names` in the user's delegated subtree, the user's own as systemd delegates
    /// them; the user may also write the subtree's cgroup.procs (the common ancestor), so it
    /// can move its processes between them.
    func userScopes(_ names: [String], in subtree: DelegatedSubtree) throws -> [String] {
        var made: [String] = []
        for name in names {
            let path = subtree.root.directory + "/" + name
            try systemCall("mkdir(\(path))") { mkdir(path, 0o755) }
            made.append(path)
            for owned in [path, path + "/cgroup.procs"] {
                try systemCall("chown(\(owned))") { chown(owned, SwaySession.uid, SwaySession.uid) }
            }
        }
        let procs = subtree.root.directory + "/cgroup.procs"
        try systemCall("chown(\(procs))") { chown(procs, SwaySession.uid, SwaySession.uid) }
        return made
    }

    func stopped(_ pid: Int32) -> Bool { processState(pid) == "T" }
    func running(_ pid: Int32) -> Bool { if let state = processState(pid) { state != "T" } else { false } }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func aWorkspaceSwitchSuspendsTheHiddenWindowAndBringsItBack() throws {
        let rig = try Rig()
        let one = try rig.sway.openFoot(on: "1"), two = try rig.sway.openFoot(on: "2")
        try rig.sway.msg("workspace", "1")
        try rig.startAgent()
        // two is on the hidden workspace 2: background after the delay; one stays.
        try waitUntil("foot on workspace 2 to be suspended", timeout: 1.3 + 2) { stopped(two) }
        #expect(running(one))
        try rig.sway.msg("workspace", "2")
        // Foreground is immediate: the event, the tree, the call.
        let shown = Clock.monotonicNanoseconds()
        try waitUntil("foot on workspace 2 to run again", timeout: 1) { running(two) }
        let latency = Double(Clock.monotonicNanoseconds() - shown) / 1e6
        // BackgroundDelaySec (300 ms) + 1 s, from the event.
        let left = Clock.monotonicNanoseconds()
        try waitUntil("foot on workspace 1 to be suspended", timeout: 1.3) { stopped(one) }
        #expect(Double(Clock.monotonicNanoseconds() - left) / 1e6 >= 250, "not before the delay")
        #expect(running(two))
        print("SessionAgentTests: foreground \(latency) ms after swaymsg returned")
        // Who and why: the MANAGER column and the journal.
        let (status, table) = try rig.daemon.ctl(["apps"], asUser: SwaySession.uid)
        #expect(status == 0 && table.contains("bgtask-session[\(rig.agent!.pid)]"))
        #expect(rig.daemon.logged { $0.contains("App pid \(one) (foot) entered the background") && $0.contains("window left workspace 1") })
        try rig.sway.msg("workspace", "1")
        try waitUntil("foot on workspace 1 to run again", timeout: 1) { running(one) }
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func theScratchpadBackgroundsAndShowingItBringsBack() throws {
        let rig = try Rig()
        let foot = try rig.sway.openFoot(on: "1")
        try rig.startAgent(["BackgroundDelaySec=0"])
        // Its first tree read (a window seen on workspace 1, then leaving it): "following sway"
        // is logged as the tree is asked for, and a move sent then may come first (ASan, once).
        try waitUntil("the agent to see foot's window", timeout: 5) { rig.agentLines().contains { $0.contains("following pid \(foot)'s windows") } }
        try rig.sway.msg("[pid=\(foot)]", "move", "scratchpad")
        try waitUntil("foot in the scratchpad to be suspended", timeout: 2) { stopped(foot) }
        #expect(rig.daemon.logged { $0.contains("App pid \(foot)") && $0.contains("window left workspace 1") })
        try rig.sway.msg("[pid=\(foot)]", "scratchpad", "show")
        try waitUntil("foot shown from the scratchpad to run", timeout: 2) { running(foot) }
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func focusedModeForegroundsOnlyTheFocusedWindow() throws {
        let rig = try Rig()
        let left = try rig.sway.openFoot(on: "1"), right = try rig.sway.openFoot(on: "1")  // side by side
        try rig.sway.msg("[pid=\(right)]", "focus")
        try rig.startAgent(["FocusMode=focused", "BackgroundDelaySec=0"])
        try waitUntil("the unfocused foot to be suspended", timeout: 2) { stopped(left) }
        #expect(running(right))
        try rig.sway.msg("[pid=\(left)]", "focus")
        try waitUntil("the focus to swap who runs", timeout: 2) { running(left) && stopped(right) }
    }

    @Test(.enabled(if: SwaySession.available && Capabilities.cgroupsWritable, "needs sway, foot and a writable cgroup v2"))
    func aWorkspaceSwitchRunsTheWholeLifecycle() throws {
        // foot and the app it runs are one unit app (a cgroup named as a launcher names it),
        // as a desktop starts them; the app uses the Swift library's expiration handler.
        // sway runs in a scope of the user's manager, as a session's compositor does, so that
        // the user may move what it starts into another cgroup of its own.
        let subtree = try DelegatedSubtree(uid: SwaySession.uid, cgroups: 0)
        let made = try userScopes(["sway-session.scope", "app-foot-4242.scope"], in: subtree)
        defer { for path in made.reversed() { rmdir(path) } }
        let session = made[0], scope = made[1]
        let rig = try Rig(swayCgroup: session)
        let output = rig.sway.runtime + "/example.log"  // the user's to write
        try rig.sway.msg("workspace", "1")
        let before = Set(try rig.sway.windowPIDs())
        // (sway expands `$` in commands: 0 is "the writer itself" to cgroup.procs.)
        let command = "sh -c 'echo 0 > \(scope)/cgroup.procs && BGTASKD_SOCKET=\(rig.daemon.socketPath) exec foot sh -c \"exec \(Binaries.path("bgtask-example")) > \(output) 2>&1\"'"
        try rig.sway.msg("exec", command)
        try waitUntil("the example's window", timeout: 15) { try !rig.sway.windowPIDs().filter { !before.contains($0) }.isEmpty }
        func said(_ text: String) -> Bool { String(decoding: (try? readFile(output)) ?? [], as: UTF8.self).contains(text) }
        try waitUntil("the example to register", timeout: 10) { said("running in the foreground") }
        try rig.startAgent(["BackgroundDelaySec=0"])
        let switched = Clock.monotonicNanoseconds()
        try rig.sway.msg("workspace", "2")
        try waitUntil("the example to enter the background", timeout: 3) { said("entered the background") }
        try waitUntil("its task to begin", timeout: 3) { said("began background task") }
        try waitUntil("its expiration handler", timeout: 6) { said("time is nearly up") }
        // Warned before its deadline (3 s of background time, the warning 1 s before it).
        #expect(Double(Clock.monotonicNanoseconds() - switched) / 1e9 < 3)
        // Suspended: its cgroup frozen, or (the daemon's choice for a user's own cgroup) every
        // process of it stopped.
        func members() -> [Int32] {
            String(decoding: (try? readFile(scope + "/cgroup.procs")) ?? [], as: UTF8.self).split(separator: "\n").compactMap { Int32($0) }
        }
        func suspended() -> Bool {
            String(decoding: (try? readFile(scope + "/cgroup.events")) ?? [], as: UTF8.self).contains("frozen 1")
                || (!members().isEmpty && members().allSatisfy { processState($0) == "T" })
        }
        try waitUntil("the unit app suspended: \(rig.daemon.log().suffix(3))", timeout: 6) { suspended() }
        #expect(rig.daemon.logged { $0.contains("entered the background") && $0.contains("bgtask-session[") })
        #expect(!rig.daemon.log().contains { $0.contains("terminated") })
        try rig.sway.msg("workspace", "1")
        try waitUntil("the unit app running again", timeout: 2) { !suspended() }
        try waitUntil("the example back in the foreground", timeout: 3) { said("back in the foreground") }
        // Its processes are killed with sway; the scope is removed once empty.
        rig.sway.process.killTree()
        try waitUntil("the scope to empty", timeout: 5) {
            String(decoding: (try? readFile(scope + "/cgroup.procs")) ?? [], as: UTF8.self).isEmpty
        }
    }

    @Test(.enabled(if: SwaySession.available && Capabilities.cgroupsWritable, "needs sway, foot and a writable cgroup v2"))
    func wlrToplevelsMatchedToUnitsFollowTheFocus() throws {
        // Toplevels carry no pid: each foot runs in a unit named by the desktop convention
        // for its app_id, and the agent finds it there.
        let subtree = try DelegatedSubtree(uid: SwaySession.uid, cgroups: 0)
        let made = try userScopes(["sway-session.scope", "app-foot-1234.scope", "app-launcher-term2-5678.scope"], in: subtree)
        defer { for path in made.reversed() { rmdir(path) } }
        let session = made[0], units = ["foot": made[1], "term2": made[2]]
        let rig = try Rig(swayCgroup: session)
        var pids: [String: Int32] = [:]
        for (appID, unit) in units.sorted(by: { $0.key < $1.key }) {
            let before = Set(try rig.sway.windowPIDs())
            try rig.sway.msg("exec", "sh -c 'echo 0 > \(unit)/cgroup.procs && exec foot --app-id=\(appID) sleep 86400'")
            try waitUntil("foot \(appID)'s window", timeout: 15) {
                pids[appID] = try rig.sway.windowPIDs().first { !before.contains($0) }
                return pids[appID] != nil
            }
        }
        let foot = pids["foot"]!, term2 = pids["term2"]!
        try rig.sway.msg("[pid=\(foot)]", "focus")
        rig.started += 1
        rig.agent = try rig.sway.agent(socket: rig.daemon.socketPath, ["FocusMode=focused", "BackgroundDelaySec=0", "Compositor=wlr"],
                                       log: rig.agentLog)
        try waitUntil("term2 (not activated) suspended: \(rig.agentLines().suffix(4))", timeout: 5) { stopped(term2) }
        #expect(running(foot))
        #expect(rig.daemon.logged { $0.contains("as unit app-launcher-term2-5678.scope") })
        func states() -> String {
            "foot \(processState(foot).map { String($0) } ?? "gone"), term2 \(processState(term2).map { String($0) } ?? "gone"); agent: \(rig.agentLines().suffix(6)); daemon: \(rig.daemon.log().suffix(6))"
        }
        try rig.sway.msg("[pid=\(term2)]", "focus")
        try waitUntil("the activation to swap who runs: \(states())", timeout: 3) { running(term2) && stopped(foot) }
        try rig.sway.msg("[pid=\(foot)]", "focus")
        try waitUntil("foot activated again: \(states())", timeout: 3) { running(foot) && stopped(term2) }
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func stoppingTheAgentLeavesNothingStopped() throws {
        let rig = try Rig()
        let one = try rig.sway.openFoot(on: "1")
        try rig.sway.msg("workspace", "2")
        try rig.startAgent(["BackgroundDelaySec=0"])
        try waitUntil("foot on workspace 1 suspended", timeout: 2) { stopped(one) }
        try rig.agent!.signal(SIGTERM)
        #expect(try rig.agent!.wait(timeout: 5) == 0)
        #expect(running(one), "the agent brought back what it backgrounded before it left")
        #expect(rig.daemon.logged { $0.contains("App pid \(one)") && $0.contains("bgtask-session stopping") })
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func aRestartedAgentTakesOverWhatTheLastOneBackgrounded() throws {
        let rig = try Rig()
        let one = try rig.sway.openFoot(on: "1")
        try rig.sway.msg("workspace", "2")
        try rig.startAgent(["BackgroundDelaySec=0"])
        try waitUntil("foot on workspace 1 suspended", timeout: 2) { stopped(one) }
        try rig.agent!.signal(SIGKILL)  // no chance to bring anything back
        _ = try rig.agent!.wait(timeout: 5)
        #expect(stopped(one))
        try rig.startAgent(["BackgroundDelaySec=0"])
        #expect(rig.agentLines().contains { $0.contains("taking over 1 apps") })
        try rig.sway.msg("workspace", "1")
        try waitUntil("the new agent to bring foot back", timeout: 2) { running(one) }
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func killingTheCompositorLeavesNothingStopped() throws {
        let rig = try Rig()
        let one = try rig.sway.openFoot(on: "1")
        let foot = try Pidfd.open(pid: one)  // to see it exit, once resumed
        try rig.sway.msg("workspace", "2")
        try rig.startAgent(["BackgroundDelaySec=0"])
        try waitUntil("foot on workspace 1 suspended", timeout: 2) { stopped(one) }
        // Only sway itself: its clients lose their display.
        try rig.sway.process.signal(SIGKILL)  // the spawned child is sway (setpriv and python exec'd into it)
        try waitUntil("foot resumed (and gone with its display)", timeout: 5) { foot.hasExited || running(one) }
        #expect(rig.agentLines().contains { $0.contains("bringing back the apps") })
        #expect(rig.agent?.hasExited == false, "the agent keeps running, looking for the compositor")
    }

    @Test(.enabled(if: SwaySession.available, SwaySession.missing))
    func aDaemonKilledAndRestartedLeavesNothingStopped() throws {
        let rig = try Rig()
        let one = try rig.sway.openFoot(on: "1"), two = try rig.sway.openFoot(on: "2")
        try rig.startAgent(["BackgroundDelaySec=0"])
        try waitUntil("foot on workspace 1 suspended", timeout: 2) { stopped(one) }
        try rig.daemon.crash()
        // While the daemon is away the user switches: the agent keeps the decisions.
        try rig.sway.msg("workspace", "1")
        let restarted = try rig.daemon.restart(["BackgroundTimeSec=3s", "ExpirationWarningSec=1s"])
        try waitUntil("the agent to reconnect and bring foot 1 back", timeout: 5) { running(one) }
        try waitUntil("foot 2 suspended by the restarted daemon", timeout: 5) { stopped(two) }
        #expect(rig.agentLines().contains { $0.contains("lost bgtaskd") })
        #expect(restarted.logged { $0.contains("App pid \(one)") && $0.contains("resumed: foreground") })
    }
}

/// A compositor socket that lies: windows of pid 1 and of another user, a 64 KiB app_id of
/// control characters, garbage, a frame claiming 1 GiB. The agent logs, ignores, reconnects,
/// and stays small.
@Suite struct SessionAgentHostileCompositorTests {
    func frame(_ type: UInt32, _ payload: String) -> [UInt8] {
        var out = Array("i3-ipc".utf8)
        withUnsafeBytes(of: UInt32(payload.utf8.count)) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: type) { out.append(contentsOf: $0) }
        return out + Array(payload.utf8)
    }

    @Test func aLyingCompositorIsLoggedAndIgnored() throws {
        let daemon = try TestDaemon()
        let directory = daemon.directory + "/fake-sway"
        try systemCall("mkdir") { mkdir(directory, 0o755) }
        let path = directory + "/sway-ipc.sock"
        let listener = try UnixSocket.listen(path: path)
        chmod(path, 0o666)
        // Windows: pid 1, a process of root's, and one of the user's own with a hostile app_id.
        let rootProcess = try Spawned("/bin/sleep", ["60"])
        let own = try Spawned("/usr/bin/setpriv", SwaySession.asUser + ["/bin/sleep", "60"])
        let hostile = String(repeating: "\u{1b}[2J\u{7}", count: 64 * 1024 / 6)
        let tree = """
        {"type":"root","nodes":[{"type":"output","name":"X","nodes":[{"type":"workspace","name":"1","nodes":[
          {"type":"con","pid":1,"visible":false,"nodes":[]},
          {"type":"con","pid":\(rootProcess.pid),"visible":false,"nodes":[]},
          {"type":"con","pid":\(own.pid),"visible":false,"app_id":\(JSON.string(hostile).serialized),"nodes":[]}]}]}]}
        """
        let log = daemon.directory + "/agent.log"
        let agent = try Spawned("/usr/bin/setpriv", SwaySession.asUser + [Binaries.path("bgtask-session"), "--socket", daemon.socketPath,
                                                                          "--set", "BackgroundDelaySec=0"],
                                environment: ["PATH=/usr/bin:/bin", "SWAYSOCK=\(path)"], standardError: .file(log))
        defer { agent.killTree(); _ = try? agent.wait(timeout: 5) }
        func lines() -> String { String(decoding: (try? readFile(log)) ?? [], as: UTF8.self) }
        func accept() throws -> FileDescriptor {
            var connection: FileDescriptor?
            try waitUntil("the agent to connect", timeout: 5) { connection = try UnixSocket.accept(listener); return connection != nil }
            return connection!
        }
        func send(_ socket: FileDescriptor, _ bytes: [UInt8]) throws {
            var rest = bytes[...]
            try waitUntil("the agent to read \(bytes.count) bytes", timeout: 5) {
                if let written = try socket.writeAvailable(rest) { rest = rest.dropFirst(written) }
                return rest.isEmpty
            }
        }
        // 1. A tree with windows it must refuse, and one it may manage.
        let first = try accept()
        try send(first, frame(2, #"{"success":true}"#) + frame(4, tree))
        try waitUntil("the user's own window backgrounded and suspended", timeout: 5) { processState(own.pid) == "T" }
        #expect(lines().contains("window of pid 1 left alone: not an app"))
        #expect(lines().contains("window of pid \(rootProcess.pid) left alone: another user's (uid 0)"))
        #expect(try daemon.apps().map { $0["pid"]?.intValue } == [Int64(own.pid)])
        #expect(processState(rootProcess.pid) != "T")
        // 2. Garbage: the agent lets go of what it backgrounded and connects again.
        try send(first, Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8))
        try waitUntil("the app brought back", timeout: 5) { processState(own.pid) != "T" }
        #expect(lines().contains("not i3 IPC"))
        first.close()
        // 3. A frame claiming 1 GiB: refused before anything is buffered.
        let second = try accept()
        var header = Array("i3-ipc".utf8)
        withUnsafeBytes(of: UInt32(1 << 30)) { header.append(contentsOf: $0) }
        withUnsafeBytes(of: UInt32(4)) { header.append(contentsOf: $0) }
        try send(second, header + [UInt8](repeating: 0x41, count: 4096))
        try waitUntil("the huge frame refused", timeout: 5) { lines().contains("a frame of 1073741824 bytes") }
        second.close()
        let third = try accept()  // still there, and trying again
        third.close()
        #expect(!agent.hasExited)
        let status = String(decoding: try readFile("/proc/\(agent.pid)/status"), as: UTF8.self)
        let rss = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }.flatMap { $0.split(separator: " ").dropFirst().first }.flatMap { Int($0) } ?? 0
        #expect(rss > 0 && rss < 64 * 1024, "agent RSS \(rss) KiB")
    }

    /// Another user's socket at `$SWAYSOCK` (sway's is in `/tmp` without `$XDG_RUNTIME_DIR`:
    /// uid 65533 takes the path while sway restarts) naming one of the agent's user's
    /// processes as a hidden window: the agent does not follow it — it would suspend that
    /// process with its user's rights — logs it once, and looks again each second.
    @Test(.enabled(if: getuid() == 0, "needs root to run the impostor and the agent as two other users (setpriv)"))
    func anotherUsersSocketAtSwaysockIsNotFollowed() throws {
        let daemon = try TestDaemon()
        let directory = daemon.directory + "/impostor"
        try systemCall("mkdir") { mkdir(directory, 0o755) }
        try systemCall("chown") { chown(directory, 65533, 65533) }
        let path = directory + "/sway-ipc.sock"
        let victim = try Spawned("/usr/bin/setpriv", SwaySession.asUser + ["/bin/sleep", "60"])
        let tree = """
        {"type":"root","nodes":[{"type":"output","name":"X","nodes":[{"type":"workspace","name":"1","nodes":[
          {"type":"con","pid":\(victim.pid),"visible":false,"nodes":[]}]}]}]}
        """
        let impostor = try Spawned("/usr/bin/setpriv", ["--reuid=65533", "--regid=65533", "--clear-groups", "/usr/bin/python3", "-c", """
            import os, socket, struct, sys
            def frame(kind, text):
                data = text.encode()
                return b"i3-ipc" + struct.pack("<II", len(data), kind) + data
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(sys.argv[1])
            os.chmod(sys.argv[1], 0o666)
            listener.listen(8)
            print("listening", flush=True)
            kept = []
            while True:
                connection, _ = listener.accept()
                print("accepted", flush=True)
                try: connection.sendall(frame(2, '{"success":true}') + frame(4, sys.argv[2]))
                except OSError: pass
                kept.append(connection)
            """, path, tree])
        defer { impostor.killTree(); _ = try? impostor.wait(timeout: 5) }
        try impostor.expectLine("listening")
        let log = daemon.directory + "/agent.log"
        let agent = try Spawned("/usr/bin/setpriv", SwaySession.asUser + [Binaries.path("bgtask-session"), "--socket", daemon.socketPath,
                                                                          "--set", "BackgroundDelaySec=0"],
                                environment: ["PATH=/usr/bin:/bin", "SWAYSOCK=\(path)"], standardError: .file(log))
        defer { agent.killTree(); _ = try? agent.wait(timeout: 5) }
        // Followed, the agent would stay connected: a second connection is its look again.
        try impostor.expectLine("accepted")
        try impostor.expectLine("accepted", timeout: 5)
        let lines = String(decoding: try readFile(log), as: UTF8.self).split(separator: "\n")
        let refused = "the compositor at \(path) answers as uid 65533, neither this user (uid 65534) nor root: not followed"
        #expect(lines.filter { $0.contains(refused) }.count == 1, "\(lines)")
        #expect(!lines.contains { $0.contains("following sway") })
        #expect(processState(victim.pid) != "T")
        #expect(try daemon.apps().isEmpty)
    }

    /// The same for a real sway and its Wayland display, uid 65534's, to an agent of root's:
    /// neither the IPC socket nor the display is followed.
    @Test(.enabled(if: getuid() == 0 && SwaySession.available, "needs root, sway and foot"))
    func anotherUsersRealCompositorIsNotFollowed() throws {
        let daemon = try TestDaemon()
        let session = try SwaySession()
        for (compositor, environment, refused) in [
            ("sway", ["SWAYSOCK=\(session.socket)"], "the compositor at \(session.socket) answers as uid 65534"),
            ("wlr", ["WAYLAND_DISPLAY=\(session.runtime)/wayland-1"], "the compositor at Wayland display \(session.runtime)/wayland-1 answers as uid 65534"),
        ] {
            let log = daemon.directory + "/agent-\(compositor).log"
            let agent = try Spawned(Binaries.path("bgtask-session"), ["--socket", daemon.socketPath, "--compositor", compositor],
                                    environment: ["PATH=/usr/bin:/bin"] + environment, standardError: .file(log))
            defer { agent.killTree(); _ = try? agent.wait(timeout: 5) }
            func lines() -> String { String(decoding: (try? readFile(log)) ?? [], as: UTF8.self) }
            try waitUntil("the \(compositor) refusal logged", timeout: 5) { lines().contains(refused + ", neither this user (uid 0) nor root: not followed") }
            #expect(!lines().contains("following"), "\(lines())")
        }
    }
}

/// bgtask-session's command line: help, usage errors, settings errors naming file:line.
@Suite struct SessionAgentCommandLineTests {
    func run(_ arguments: [String], environment: [String] = ["PATH=/usr/bin:/bin"]) throws -> (Int32, String) {
        let process = try Spawned(Binaries.path("bgtask-session"), arguments, environment: environment, standardError: .mergeIntoOutput)
        let output = try process.readAll(timeout: 10)
        return (Spawned.exitCode(try process.wait(timeout: 10)) ?? -1, output)
    }

    @Test func helpUsageAndSettings() throws {
        for flag in ["-h", "--help"] {
            let (status, output) = try run([flag])
            #expect(status == 0 && output.contains("Usage: bgtask-session") && output.contains("Example:"))
        }
        let (unknown, usage) = try run(["--frobnicate"])
        #expect(unknown == 2 && usage.contains("unknown option '--frobnicate'") && usage.contains("Usage:"))
        let (badSet, why) = try run(["--set", "FocusMode=everything"])
        #expect(badSet == 2 && why.contains("FocusMode must be visible or focused"))
        var template = Array("/tmp/bgtask-session-conf-XXXXXX".utf8CString)
        let directory = String(cString: mkdtemp(&template)!)
        defer { _ = try? Spawned("/bin/rm", ["-rf", directory]).wait(timeout: 5) }
        try writeFile(directory + "/session.conf", Array("[Session]\nFocusMode=focused\nBackgroundDelaySec=soon\n".utf8))
        let (badFile, where_) = try run(["--config", directory + "/session.conf", "--check-config"])
        #expect(badFile == 1 && where_.contains("\(directory)/session.conf:3: BackgroundDelaySec"))
        try writeFile(directory + "/session.conf", Array("[Session]\nFocusMode=focused\n".utf8))
        let (good, printed) = try run(["--config", directory + "/session.conf", "--set", "BackgroundDelaySec=250ms", "--check-config"])
        #expect(good == 0 && printed.hasPrefix("FocusMode=focused\nBackgroundDelaySec=250ms\n"), "\(printed)")
    }
}

/// What uid 65534 can put in SetAppState's `reason` and `manager`: at most 256 bytes, and
/// nothing a terminal or log reader takes for more than text.
@Suite struct SetAppStateReasonTests {
    @Test func aReasonIsBoundedAndEscapedAndTheCallerIsTheManager() throws {
        let daemon = try TestDaemon()
        let own = try Spawned("/usr/bin/setpriv", SwaySession.asUser + ["/bin/sleep", "60"])
        try waitUntil("the user's sleep to exec", timeout: 5) { (try? ProcStat.read(pid: own.pid))?.command == "sleep" }
        let script = """
        import json, socket, sys
        s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
        def call(params):
            s.sendall(json.dumps({"method": "io.bgtaskd.Manager.SetAppState", "parameters": params}).encode() + b"\\0")
            reply = b""
            while not reply.endswith(b"\\0"): reply += s.recv(65536)
            return json.loads(reply[:-1])
        pid = int(sys.argv[2])
        print(json.dumps(call({"pid": pid, "state": "background", "reason": "x" * 257})))
        print(json.dumps(call({"pid": pid, "state": "background", "reason": "left\\n\\u001b[2Jworkspace 1"})))
        """
        let client = try Spawned("/usr/bin/setpriv", SwaySession.asUser + ["/usr/bin/python3", "-c", script, daemon.socketPath, "\(own.pid)"],
                                 standardError: .mergeIntoOutput)
        let output = try client.readAll(timeout: 10)
        #expect(Spawned.exitCode(try client.wait(timeout: 10)) == 0, "\(output)")
        let replies = output.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
        #expect(replies.count == 2, "\(output)")
        #expect(replies.first?["error"]?.stringValue == "org.varlink.service.InvalidParameter")
        #expect(replies.first?["parameters"]?["parameter"]?.stringValue == "reason")
        #expect(replies.last?["parameters"]?["app"]?["manager"]?.stringValue?.hasPrefix("python3[\(client.pid)]") == true
                || replies.last?["parameters"]?["app"]?["manager"]?.stringValue == "python3[\(client.pid)]", "\(output)")
        // Written as the pass that replied ends (`TestDaemon.logged`): the reply may come first.
        let entered = "App pid \(own.pid) (sleep) entered the background"
        #expect(daemon.logged { $0.contains(entered) })
        let line = daemon.log().first { $0.contains(entered) }
        #expect(line?.contains(#"(by python3["# ) == true && line?.contains(#"left\n\x1b[2Jworkspace 1)"#) == true, "\(line ?? "none")")
    }
}
