// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Findings 6 and 14 of the second review: a tracked app's workers, however they came to be.
extension TrackedContainmentTests {
    /// An app that registers, then double-forks a worker which either calls `BeginTask` at
    /// once it is re-parented (`call`) or execs `/bin/sleep` from a thread other than its
    /// main one (`exec`);
    /// prints `{"worker": PID, ...}`.
    static let escapingApp = #"""
    import json, os, select, signal, socket, sys, threading
    path, how = sys.argv[1], sys.argv[2]
    def connect():
        s = socket.socket(socket.AF_UNIX); s.connect(path); return s
    def call(s, method, params):
        s.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
        reply = b""
        while not reply.endswith(b"\0"): reply += s.recv(4096)
        return json.loads(reply[:-1])
    call(connect(), "io.bgtaskd.App.GetTimeRemaining", {})
    r, w = os.pipe()
    if os.fork() == 0:
        middle = os.pidfd_open(os.getpid())  # inherited by the worker, so the middle may be reaped
        if os.fork() == 0:
            # Re-parented once the middle process has exited (its pidfd readable): no ancestor is the app.
            select.select([middle], [], [], 10)
            if how == "call":
                reply = call(connect(), "io.bgtaskd.App.BeginTask", {"name": "worker"})
                os.write(w, json.dumps({"worker": os.getpid(), "reply": reply}).encode() + b"\n")
                signal.pause()
            else:
                os.write(w, json.dumps({"worker": os.getpid()}).encode() + b"\n")
                threading.Thread(target=lambda: os.execv("/bin/sleep", ["sleep", "600"])).start()
                signal.pause()  # the main thread waits; the exec replaces the whole process
            os._exit(0)
        os._exit(0)
    os.wait()
    print(os.fdopen(r).readline().strip(), flush=True)
    signal.pause()
    """#

    static func startEscaping(_ how: String, daemon: TestDaemon) throws -> (app: Spawned, worker: Pidfd, line: JSON) {
        let app = try Spawned("/usr/bin/python3", ["-c", Self.escapingApp, daemon.socketPath, how])
        let line = try JSON.parse(try #require(try app.readLine(timeout: 10)))
        let pid = try #require(line["worker"]?.intValue)
        // Held by a pidfd alone: an `exec` worker may be in its exec, whose change of leader
        // leaves `/proc/PID/stat` missing for a moment (`Pidfd.open(pid:)` reads it: ENOENT,
        // once in a full suite). It is alive (it wrote the line and waits), so the pid is its.
        return (app, try Pidfd.open(member: Int32(pid)), line)
    }

    /// 14: the worker's call was resolved before its fork event was read, so it became an
    /// app of its own (and a member of its app, frozen with it) holding the task.
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func aDoubleForkedWorkerCallingAtOnceIsItsAppsNotAnAppOfItsOwn() throws {
        let daemon = try TestDaemon()
        let (app, worker, line) = try Self.startEscaping("call", daemon: daemon)
        // The worker left the app's tree: it is killed here, or it would outlive the test
        // (holding the test's stderr open, which `swift test` waits on).
        defer { try? worker.send(signal: SIGKILL) }
        #expect(line["reply"]?["parameters"]?["taskId"]?.intValue != nil, "\(line.serialized)")
        let apps = try daemon.apps()
        #expect(apps.count == 1 && apps.first?["pid"]?.intValue == Int64(app.pid), "\(apps.map(\.serialized))")
        let tasks = try daemon.tasks()
        #expect(tasks.count == 1 && tasks.first?["appPid"]?.intValue == Int64(app.pid)
                && tasks.first?["pid"]?.intValue == Int64(worker.pid))
    }

    /// 6: a worker that execs from a thread other than its main one: the old leader's exit is
    /// reported, but the process lives on; it stays a member, stopped and killed with its app.
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func aWorkerThatExecsFromAThreadStaysInItsApp() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1s", "ExpirationWarningSec=0"])
        let (app, worker, _) = try Self.startEscaping("exec", daemon: daemon)
        defer { try? worker.send(signal: SIGKILL) }
        try waitUntil("the worker is sleep") { (try? ProcStat.read(pid: worker.pid))?.command == "sleep" }
        try daemon.setState(app.pid, "background")
        try waitUntil("the app and its worker stopped") { processState(app.pid) == "T" && processState(worker.pid) == "T" }
        #expect(try daemon.ctl(["terminate", String(app.pid)]).0 == 0)
        try waitUntil("the worker killed with its app") { worker.hasExited }
    }

    /// 7: when the kernel dropped events (a fork storm beyond the socket buffer), following
    /// restarted from each app's tree, so a worker that re-parented before the loss was lost.
    /// Now members still provably the same process are kept. The buffer is made tiny
    /// (`BGTASKD_PROCESS_EVENTS_BUFFER`) and the daemon stopped while 5,000 processes come and go.
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func aWorkerThatReparentedBeforeALossStaysInItsApp() throws {
        // 256 KiB: some 300 datagrams, plenty while the daemon runs (the connector reports every
        // fork of the machine, and the suite forks a lot), far too few for the storm below.
        let daemon = try TestDaemon(["BackgroundTimeSec=1min"], environment: ["BGTASKD_PROCESS_EVENTS_BUFFER=262144"])
        let app = try Spawned("/usr/bin/python3", ["-c", Self.forkingApp, daemon.socketPath])
        let line = try #require(try app.readLine(timeout: 10))
        let pids = try #require(try JSON.parse(line)["workers"]?.arrayValue?.compactMap(\.intValue).map(Int32.init))
        let workers = try pids.map { try Pidfd.open(pid: $0) }
        defer { for worker in workers { try? worker.send(signal: SIGKILL) } }
        // The workers are known: a suspension stops them.
        try daemon.setState(app.pid, "background")
        try waitUntil("the workers stopped") { workers.allSatisfy { processState($0.pid) == "T" } }
        try daemon.setState(app.pid, "foreground")
        try waitUntil("the workers running") { workers.allSatisfy { Self.isRunning($0.pid) } }
        // A storm the stopped daemon cannot read.
        try daemon.process.signal(SIGSTOP)
        let storm = try Spawned("/usr/bin/python3", ["-c", "import os\nfor _ in range(5000):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\n"])
        _ = try storm.wait(timeout: 30)
        try daemon.process.signal(SIGCONT)
        try daemon.setState(app.pid, "background")
        try waitUntil("the loss logged", timeout: 15) { daemon.log().contains { $0.contains("dropped process events") } }
        try waitUntil("the workers stopped after the loss", timeout: 15) { workers.allSatisfy { processState($0.pid) == "T" } }
    }
}

extension TrackedContainmentTests {
    /// A tracked app terminated with a catchable signal whose handler forks a worker (into a
    /// session of its own) and exits within the grace: the worker, forked after the signal,
    /// got none, and no walk finds it once the app's own process is gone — but the tracker
    /// saw its fork: it is the app's, killed when the grace ends. Before, it lived on (so did
    /// the child of a fork under way in another thread as the app stopped: the same path).
    /// Also for uid 65534's app, and across a restart within the grace (the worker is saved
    /// with the termination).
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector, and setpriv (root)"),
          arguments: zip([false, true, false], [false, false, true]))
    func whatATrackedAppForksInItsGraceIsKilledWhenTheGraceEnds(asNobody: Bool, restarting: Bool) throws {
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let command = (asNobody ? nobody : []) + ["/usr/bin/python3", "-c", """
            import os, signal
            def handler(*_):
                child = os.fork()
                if child == 0:
                    os.setsid()
                    if os.fork() == 0:
                        os.write(1, b'worker %d\\n' % os.getpid())
                        os.execv('/bin/sleep', ['sleep', '1000'])
                    os._exit(0)
                os.waitpid(child, 0)
                os._exit(0)
            signal.signal(signal.SIGTERM, handler)
            print('ready', flush=True)
            while True: signal.pause()
            """]
        let app = try Spawned(command[0], Array(command.dropFirst()))
        try app.expectLine("ready")
        let settings = ["TerminateSignal=SIGTERM", "TerminateGraceSec=\(restarting ? 2 : 1)s"]
        var daemon = try TestDaemon(settings)
        try daemon.setState(app.pid, "foreground")
        try #require(try daemon.app(app.pid)?["containment"] == "tracked")
        try daemon.manager("Terminate", ["pid": .int(Int64(app.pid))])
        guard let line = try app.readLine(timeout: 5) else {
            // Seen once in CI (cause unknown): every writer of the app's output gone before the
            // worker's line. What the daemon did to it says why, next time.
            let status = try? app.wait(timeout: 1)
            Issue.record("the app's output ended before its worker's line (wait status \(status.map { String($0) } ?? "unknown")); the daemon's log:\n\(daemon.log().suffix(30).joined(separator: "\n"))")
            return
        }
        let signalled = Clock.monotonicNanoseconds()
        let worker = try Pidfd.open(pid: try #require(Int32(line.split(separator: " ").last ?? ""), "not a pid: \(line)"))
        defer { try? worker.send(signal: SIGKILL) }  // the test's own, if the daemon missed it
        #expect(Spawned.exitCode(try app.wait(timeout: 5)) == 0)  // the handler's exit, within the grace
        #expect(!worker.hasExited)
        if restarting {
            // Answered in a pass that read the app's exit (its pidfd was ready before the call):
            // the worker is in the state file.
            _ = try daemon.apps()
            try daemon.crash()
            daemon = try daemon.restart(settings)
        }
        try waitUntil("the worker killed at the grace's end", timeout: 5) { worker.hasExited }
        let killed = Double(Clock.monotonicNanoseconds() - signalled) / 1e9
        #expect(killed >= (restarting ? 1.5 : 0.5), "killed \(killed)s after the signal; the grace is \(settings[1])")
        #expect(daemon.logged { $0.contains("App pid \(app.pid) still had 1 process(es) after the terminate grace; sent SIGKILL") })
    }
}
