// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Finding 5 of the second review: `IsolateApps=auto` made the root daemon connect to
/// `/run/user/UID/systemd/private`, a path in a directory the user owns: it followed a
/// symbolic link there (to a root-only socket), and believed whatever answered (a fake
/// manager saw `StartTransientUnit` with the pids). Now no link is followed, and the listener
/// must be the user's own manager (its uid, in `user@UID.service/init.scope`) before a word
/// is sent.
extension UnprivilegedUserTests {
    /// `/run/user/65534` for the test, owned by the user (made and removed here if absent),
    /// with a `systemd/` directory the user made.
    final class RuntimeDirectory {
        let path = "/run/user/\(Intruder.uid)"
        private var made: [String] = []

        init() throws {
            for (directory, mode) in [("/run/user", 0o755), (path, 0o700)] where !FileSystem.exists(directory) {
                try systemCall("mkdir(\(directory))") { mkdir(directory, mode_t(mode)) }
                made.append(directory)
            }
            try systemCall("chown(\(path))") { chown(path, Intruder.uid, Intruder.uid) }
            let (code, output) = try SystemdTests.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                       "/bin/sh", "-c", "rm -rf \(path)/systemd && mkdir \(path)/systemd"])
            guard code == 0 else { throw TestFailure("as uid 65534: \(output)") }
        }

        deinit {
            _ = try? SystemdTests.run(["/bin/rm", "-rf", path + "/systemd"])
            for directory in made.reversed() { rmdir(directory) }
        }
    }

    /// A process app of uid 65534 in its user manager's subtree (so `IsolateApps=auto` asks its
    /// manager to move it), registered by the user.
    static func appInUserManager(_ subtree: DelegatedSubtree, daemon: TestDaemon) throws -> Spawned {
        let slice = subtree.root.directory + "/app.slice"
        try systemCall("mkdir(\(slice))") { mkdir(slice, 0o755) }
        for path in [slice, slice + "/cgroup.procs"] { try systemCall("chown(\(path))") { chown(path, Intruder.uid, Intruder.uid) } }
        let app = try Spawned("/bin/sh", ["-c", "echo $$ > \(slice)/cgroup.procs; exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sleep 600"])
        try waitUntil("the sleep in the user's manager's subtree") {
            (try? ProcStatus.uids(pid: app.pid))?.real == 65534 && Cgroup.of(pid: app.pid)?.directory == slice
        }
        let (code, output) = try daemon.ctl(["foreground", String(app.pid)], asUser: Intruder.uid)
        guard code == 0 else { throw TestFailure("foreground: \(output)") }
        return app
    }

    @Test func aUsersManagerSocketIsNeitherFollowedNorBelievedUnproven() throws {
        let runtime = try RuntimeDirectory()
        let socket = runtime.path + "/systemd/private"
        // 1. A symbolic link to a socket only root may reach.
        let secret = try TestDaemon()  // a root-only listener: a daemon's socket in a 0700 directory
        chmod(secret.directory, 0o700)
        let (linked, linkOutput) = try SystemdTests.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                         "/bin/ln", "-s", secret.socketPath, socket])
        try #require(linked == 0, "\(linkOutput)")
        do {
            let subtree = try DelegatedSubtree(uid: Intruder.uid, cgroups: 0)
            let daemon = try TestDaemon()
            let app = try Self.appInUserManager(subtree, daemon: daemon)
            defer { app.killTree() }
            try waitUntil("the refusal logged") {
                daemon.log().contains { $0.contains("not moved into scopes through \(socket)") && $0.contains("no symbolic links followed") }
            }
            #expect(try secret.manager("GetStatus")["connections"] == 1)  // only this call: the daemon never connected
            #expect(try daemon.app(app.pid)?["containment"] != "scope")
        }
        unlink(socket)
        // 2. A listener of the user's own, pretending to be its manager.
        let fake = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", """
            import json, socket, sys
            s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); s.settimeout(20)
            print("listening", flush=True)
            c, _ = s.accept(); c.settimeout(5); received = b""
            try:
                while True:
                    chunk = c.recv(65536)
                    if not chunk: break
                    received += chunk
            except socket.timeout:
                pass
            print(json.dumps({"bytes": len(received)}), flush=True)
            """, socket])
        defer { fake.killTree() }
        try fake.expectLine("listening")
        let subtree = try DelegatedSubtree(uid: Intruder.uid, cgroups: 0)
        let daemon = try TestDaemon()
        let app = try Self.appInUserManager(subtree, daemon: daemon)
        defer { app.killTree() }
        let heard = try JSON.parse(try #require(try fake.readLine(timeout: 20)))
        #expect(heard["bytes"] == 0, "the fake manager heard \(heard.serialized)")
        #expect(daemon.logged { $0.contains("not user@65534.service's manager") })
        #expect(try daemon.app(app.pid)?["containment"] != "scope")
    }
}
