// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// A daemon started by socket activation — by systemd's own `systemd-socket-activate`, as a
/// unit's socket starts it — whose unit sets no `RuntimeDirectory=`: its state goes beside
/// the socket it was passed (the path that socket is bound at), as beside one it binds
/// itself, and its log names that socket. Before, it went to the system daemon's
/// `/run/bgtaskd/state`: the shipped per-user unit's daemon failed to start ("mkdir
/// (/run/bgtaskd/state): Permission denied"), and two activated daemons would have shared
/// one file. As root and as uid 65534 (the per-user daemon's case).
@Suite struct SocketActivationTests {
    @Test(.enabled(if: access("/usr/bin/systemd-socket-activate", X_OK) == 0, "systemd-socket-activate is not installed (systemd)"),
          .enabled(if: getuid() == 0, "needs root to run the daemon as uid 65534 (setpriv)"),
          arguments: [false, true])
    func anActivatedDaemonKeepsItsStateBesideItsSocket(asNobody: Bool) throws {
        var template = Array("/tmp/bgtaskd-test-XXXXXX".utf8CString)
        let directory = try #require(mkdtemp(&template).map { String(cString: $0) })
        defer { removeTree(directory) }
        if asNobody { try systemCall("chown") { chown(directory, 65534, 65534) } }
        let socket = directory + "/io.bgtaskd", log = directory + "/bgtaskd.log"
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        let command = (asNobody ? nobody : []) + [
            "/usr/bin/systemd-socket-activate", "--listen=\(socket)", "--fdname=varlink",
            "-E", "PATH", "-E", "DBUS_SYSTEM_BUS_ADDRESS", Binaries.path("bgtaskd"),
        ]
        let daemon = try Spawned(command[0], Array(command.dropFirst()),
                                 environment: ["PATH=/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS=unix:path=\(TestDaemon.noSystemBus)"],
                                 standardError: .file(log))
        defer {
            try? daemon.signal(SIGTERM)
            _ = try? daemon.wait(timeout: 5)
        }
        // The activator binds, then listens (a connection in between is refused); the first
        // connection accepted starts the daemon, which answers on the same socket.
        var connection: VarlinkConnection?
        try waitUntil("the socket listening") {
            connection = try? VarlinkConnection(path: socket)
            return connection != nil
        }
        let status = try #require(connection).call("io.bgtaskd.Manager.GetStatus", timeoutMilliseconds: 10_000)
        #expect(status["apps"]?.intValue == 0)
        let state = directory + "/state/bgtaskd.state"
        try waitUntil("the state file beside the socket") { access(state, F_OK) == 0 }
        var info = stat()
        try systemCall("stat") { stat(state, &info) }
        #expect(info.st_uid == (asNobody ? 65534 : 0))
        let text = String(decoding: try readFile(log), as: UTF8.self)
        #expect(text.contains("serving on \(socket), the socket passed by systemd"), "\(text)")
        #expect(!text.contains("/run/bgtaskd"), "\(text)")
    }
}
