// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// What a pass queued goes out with monitors last (`Daemon.commit`): an app is sent its
/// warning before anyone watching hears of it. The daemon fires 16 warnings fallen due
/// together in one slice; a monitor flushed among the apps (second, once touched by the
/// first warning) was told of all 16 when one app had been.
extension ClientsEndToEndTests {
    /// 16 apps whose tasks' streams this test reads (each app connects a socket the test
    /// made, so the test holds the stream's other end too), backgrounded together: whenever
    /// the monitor has an app's warning, that app's stream already has it. Three rounds; the
    /// daemon and the apps on one CPU, this thread on the other, so it reads the monitor
    /// while the daemon may still be sending (with the monitor flushed among the apps, 32–35
    /// of the 48 looks failed, in each of six runs).
    @Test(.enabled(if: Self.allowedCPUs().count >= 2, "needs two CPUs: the daemon sends on one while this thread reads on the other"))
    func aMonitorHearsOfAWarningOnlyOnceItsAppWasSentIt() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=600ms", "ExpirationWarningSec=300ms",
                                     "GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"])
        let cpus = Self.allowedCPUs()
        try setCPUAffinity(pid: 0, cpus: [cpus[0]])
        defer { try? setCPUAffinity(pid: 0, cpus: cpus) }
        try setCPUAffinity(pid: daemon.process.pid, cpus: [cpus[1]])
        let monitor = try UnixSocket.connect(path: daemon.socketPath)
        try monitor.writeAll(Array("{\"method\":\"io.bgtaskd.Manager.Monitor\",\"more\":true}\0".utf8))
        #expect(try Self.frames(from: monitor).first?["parameters"]?["event"] == "monitoring")
        let manager = try UnixSocket.connect(path: daemon.socketPath)
        for round in 1...3 {
            let apps = try (0..<16).map { _ in try StreamApp(daemon.socketPath) }
            defer { for app in apps { app.kill() } }
            // On the daemon's CPU: each warning sent wakes its app there, so the daemon's sends
            // take a while, and this thread, on the other, reads the monitor meanwhile.
            for app in apps { try setCPUAffinity(pid: app.pid, cpus: [cpus[1]]) }
            for app in apps {
                try waitUntil("app \(app.pid) connected") { app.isConnected }
                _ = try Self.frames(from: app.stream)  // granted
            }
            let calls = apps.map { "{\"method\":\"io.bgtaskd.Manager.SetAppState\",\"parameters\":{\"pid\":\($0.pid),\"state\":\"background\"}}\0" }
            try manager.writeAll(Array(calls.joined().utf8))
            var replies = 0
            while replies < apps.count { replies += try Self.frames(from: manager).count }
            var warned: Set<Int32> = []
            var told = VarlinkFramer(maximumMessageBytes: 1 << 20)
            while warned.count < apps.count {
                // What the monitor was told, then at once which streams have their warning
                // (before any parsing: the daemon may still be sending): each app the monitor
                // named must have had it already.
                guard try monitor.waitReadable(timeoutMilliseconds: 5000) else { throw TestFailure("no warning within 5 s") }
                let bytes = try monitor.read(upTo: 1 << 20)
                let sent = try apps.map { try $0.stream.waitReadable(timeoutMilliseconds: 0) }
                if bytes.isEmpty { throw TestFailure("the monitor was closed") }
                told.append(bytes)
                while let frame = try told.next() {
                    let parameters = try JSON.parse(frame)["parameters"]
                    guard parameters?["event"] == "taskChanged", parameters?["task"]?["state"] == "expiring",
                          let pid = parameters?["task"]?["appPid"]?.intValue.map(Int32.init) else { continue }
                    let index = try #require(apps.firstIndex { $0.pid == pid })
                    #expect(sent[index], "round \(round): the monitor heard of app \(pid)'s warning before its stream had it")
                    warned.insert(pid)
                }
            }
            for app in apps {
                let warning = try Self.frames(from: app.stream)
                #expect(warning.first?["parameters"]?["state"] == "expiring")
            }
        }
    }

    /// The frames a socket has, waiting up to 5 s for the first of them.
    static func frames(from socket: FileDescriptor) throws -> [JSON] {
        var framer = VarlinkFramer(maximumMessageBytes: 1 << 20)
        var frames: [JSON] = []
        repeat {
            guard try socket.waitReadable(timeoutMilliseconds: 5000) else { throw TestFailure("no reply within 5 s") }
            let chunk = try socket.read(upTo: 65536)
            if chunk.isEmpty { throw TestFailure("closed") }
            framer.append(chunk)
            while let frame = try framer.next() { frames.append(try JSON.parse(frame)) }
        } while framer.bufferedByteCount > 0 || frames.isEmpty
        return frames
    }
}

/// An app (python) that connects a socket this test made and holds a task on it, streamed
/// (`more`): the test reads the task's stream from its own end of the socket, while the app
/// waits on it (so each event the daemon sends it wakes it, as it would a real app).
final class StreamApp {
    let stream: FileDescriptor
    let process: Pidfd
    var pid: Int32 { process.pid }

    init(_ socketPath: String) throws {
        stream = FileDescriptor(try systemCall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) })
        let program = """
            import select, socket, sys
            s = socket.socket(fileno=0)
            s.connect(sys.argv[1])
            s.sendall(b'{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"warned","expirationHandler":true},"more":true}\\0')
            # Asleep on the socket, woken by each arrival (edge-triggered: what the test has
            # not read yet does not wake it again), as an app is; it reads nothing.
            waiting = select.epoll()
            waiting.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
            while True:
                waiting.poll()
            """
        process = try Subprocess.spawn(["/usr/bin/python3", "-c", program, socketPath], stdin: .descriptor(stream.rawValue),
                                       stdout: .file("/dev/null"))
    }

    /// Whether the app has connected the socket (reading it before fails, `EINVAL`).
    var isConnected: Bool {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        return withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(stream.rawValue, $0, &length) == 0 }
        }
    }

    /// Kills and reaps it (its own process, through its pidfd).
    func kill() {
        try? process.send(signal: SIGKILL)
        _ = try? process.descriptor.waitReadable(timeoutMilliseconds: 5000)
        _ = try? Subprocess.wait(pid: process.pid)
    }
}
