// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// An app (a python) whose `SIGTERM` handler prints `got-term`, works `handler` seconds and
/// prints `handled`, with a child of its own that the test moved into a cgroup it froze: a
/// stop of that child waits for the thaw, a `SIGKILL` does not. A termination's wait for its
/// processes' stops cannot end before its bound so — deterministically, with no race. Also
/// as uid 65534's app (`setpriv`), whose child the test moves all the same.
final class UnstoppableApp {
    let cgroup: Cgroup
    let app: Spawned
    /// The frozen child, held by a pidfd from before it was moved.
    let child: Pidfd

    init(_ name: String, handler: Double, asNobody: Bool) throws {
        let cgroup = Cgroup(directory: Cgroup.mountPoint! + "/bgtaskd-test-\(getpid())-\(name)")
        try systemCall("mkdir") { mkdir(cgroup.directory, 0o755) }
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let command = (asNobody ? nobody : []) + ["/usr/bin/python3", "-c", """
            import signal, subprocess, sys, time
            def handler(*_):
                print('got-term', flush=True)
                time.sleep(float(sys.argv[1]))
                print('handled', flush=True)
            signal.signal(signal.SIGTERM, handler)
            print('child', subprocess.Popen(['/bin/sleep', '1000']).pid, flush=True)
            while True: signal.pause()
            """, String(handler)]
        do {
            let app = try Spawned(command[0], Array(command.dropFirst()))
            let line = try #require(try app.readLine(timeout: 5))
            let childPID = try #require(Int32(line.split(separator: " ").last ?? ""), "not a pid: \(line)")
            #expect(try ProcStatus.uids(pid: app.pid).effective == (asNobody ? 65534 : 0))
            // Its own child, held by a pidfd while it is moved (the test's to freeze).
            let child = try Pidfd.open(pid: childPID)
            try #require(processTree(of: app.pidfd).map(\.pid).contains(childPID))
            let procs = FileDescriptor(try systemCall("open(cgroup.procs)") { open(cgroup.directory + "/cgroup.procs", O_WRONLY | O_CLOEXEC) })
            defer { procs.close() }
            try procs.writeAll(Array(String(child.pid).utf8))
            try waitUntil("the child in its cgroup") { try cgroup.processes() == [child.pid] }
            try cgroup.setFrozen(true)
            try waitUntil("frozen 1") { try cgroup.isFrozen() }
            (self.cgroup, self.app, self.child) = (cgroup, app, child)
        } catch {
            rmdir(cgroup.directory)  // empty once the child, killed with its app, has left it
            throw error
        }
    }

    /// The child is killed (frozen, if the test failed before its app's `SIGKILL`) and its
    /// cgroup removed.
    deinit {
        try? child.send(signal: SIGKILL)
        _ = try? waitUntil("the frozen child gone") { child.hasExited }
        rmdir(cgroup.directory)
    }
}
