// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// DESIGN.md rule 7a end to end: no app is terminated for time without a warning it could
/// act on, and a task end that reached the daemon in time counts however busy it was.
@Suite(.serialized) struct WarnedBeforeKilledTests {
    /// `count` apps, each a process forked by one python: connects, begins a task, says
    /// `ready PID`; on a line `go` from the test, every app sends `EndTask` (and reads
    /// nothing).
    static let script = #"""
    import json, os, socket, sys
    path, count = sys.argv[1], int(sys.argv[2])
    pipes = []
    for _ in range(count):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            s = socket.socket(socket.AF_UNIX); s.connect(path)
            def call(method, params, read=True):
                s.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
                if not read: return None
                buf = b""
                while not buf.endswith(b"\0"): buf += s.recv(65536)
                return json.loads(buf[:-1])
            task = call("io.bgtaskd.App.BeginTask", {"name": "upload", "expirationHandler": True})["parameters"]["taskId"]
            os.write(1, b"ready %d\n" % os.getpid())
            f = os.fdopen(r)
            f.readline()
            call("io.bgtaskd.App.EndTask", {"taskId": task}, read=False)
            f.readline()
            os._exit(0)
        os.close(r)
        pipes.append(os.fdopen(w, "w"))
    for line in sys.stdin:
        for p in pipes:
            p.write(line); p.flush()
    """#

    /// Finding 13 of the second review: in a 10k burst with 1 s from warning to deadline,
    /// about 2,000 apps were killed though their task ends had reached the daemon. Here the
    /// daemon is made as busy as it can be (stopped) while 100 apps end their tasks before
    /// their deadline; when it runs again, past the deadline, none is killed.
    @Test func taskEndsThatArrivedInTimeCountWhenTheDaemonIsLate() throws {
        let count = 100
        let daemon = try TestDaemon(["BackgroundTimeSec=1s", "ExpirationWarningSec=500ms", "GrantLatencyMaxSec=0",
                                     "MaxAppsPerUser=1000"])
        let path = daemon.directory + "/apps.py"
        try FileDescriptor(systemCall("open") { open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644) })
            .writeAll(Array(Self.script.utf8))
        let apps = try Spawned("/bin/sh", ["-c", "exec /usr/bin/python3 \"$0\" \"$1\" \"$2\" 2>&1", path, daemon.socketPath, String(count)])
        defer { apps.killTree() }
        var pids: [Int32] = []
        while pids.count < count {
            let line = try apps.readLine(timeout: 30)
            guard let line, line.hasPrefix("ready "), let pid = Int32(line.dropFirst(6)) else {
                throw TestFailure("an app did not start: \(line ?? "end of output")")
            }
            pids.append(pid)
        }
        let manager = try daemon.connect()
        let start = Clock.monotonicNanoseconds()
        for pid in pids {
            _ = try manager.call("io.bgtaskd.Manager.SetAppState", ["pid": .int(Int64(pid)), "state": "background"],
                                 timeoutMilliseconds: 5000)
        }
        try daemon.process.signal(SIGSTOP)
        defer { try? daemon.process.signal(SIGCONT) }
        try apps.send("go")
        // Every EndTask is in the daemon's sockets; now every deadline must pass while it is
        // stopped. That is the precondition, not a wait for an event (a stopped daemon makes
        // none): one wait until an instant 200 ms past the last app's deadline.
        let deadline = start + 1_000_000_000 + 200_000_000
        waitForInstant(deadline)
        #expect(Clock.monotonicNanoseconds() >= deadline)
        try daemon.process.signal(SIGCONT)
        // Each is suspended (its task ended), none terminated.
        var history: [JSON] = []
        try waitUntil("every app suspended or terminated", timeout: 10) {
            history = try daemon.history()
            return history.count >= count
        }
        let terminated = history.filter { $0["action"] == "terminated" }.count
        #expect(terminated == 0, "\(terminated) of \(count) apps terminated")
        #expect(history.filter { $0["action"] == "suspended" && $0["reason"] == "tasksEnded" }.count == count)
        // The stops are sent before the history that reports them; the kernel stops each
        // process when it next runs (CI: some of the 100 not yet `T` at a first look, on two
        // busy CPUs).
        try waitUntil("every app stopped") { pids.allSatisfy { processState($0) == "T" } }
        try apps.send("exit")
    }
}
