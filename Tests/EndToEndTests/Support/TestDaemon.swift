// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskSystem
import TestSupport
import Glibc
import Varlink

/// The built binaries, next to the test bundle in `.build/<config>/`.
enum Binaries {
    static let directory: String = {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        let exe = String(decoding: buffer[..<max(0, n)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return String(exe[..<exe.lastIndex(of: "/")!])
    }()

    static func path(_ name: String) -> String { "\(directory)/\(name)" }
}

/// A `bgtaskd` on a socket in a fresh temporary directory, with millisecond budgets.
final class TestDaemon {
    let directory: String
    let socketPath: String
    let process: Spawned
    /// The daemon's stderr: one `<priority>message` line per log record.
    let logPath: String

    /// Where test daemons look for the system bus: nowhere.
    static let noSystemBus = "/nonexistent/bgtaskd-test/system_bus_socket"

    /// Starts the daemon with `--set` assignments and waits until it answers; in `directory`
    /// (to restart on the same socket) or a fresh temporary one.
    /// It is ready once its log says "serving on"; with `connecting: false` no connection is
    /// made: a test can then see what the daemon does before any client comes.
    /// With `cgroup`, the daemon starts in that cgroup (as under systemd, in a unit of its own);
    /// with `wrapper`, under that command (`unshare -n --`: a network namespace of its own).
    init(_ settings: [String] = [], extraArguments: [String] = [], directory reused: String? = nil,
         connecting: Bool = true, cgroup: Cgroup? = nil, environment extra: [String] = [], wrapper: [String] = []) throws {
        if let reused {
            directory = reused
        } else {
            var template = Array("/tmp/bgtaskd-test-XXXXXX".utf8CString)
            guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
            directory = String(cString: made)
        }
        chmod(directory, 0o755)  // so a test can connect as another user
        socketPath = directory + "/io.bgtaskd"
        let arguments = ["--socket", socketPath] + settings.flatMap { ["--set", $0] } + extraArguments
        logPath = directory + "/bgtaskd.log"
        // No test daemon asks the machine's own logind for anything (`KeepAwake=`): where the
        // system bus is, this one is not.
        let base = ["PATH=/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS=unix:path=\(Self.noSystemBus)"]
        // Under `make sanitize` the daemon reports where the sanitizer options say.
        let names: [String] = ["ASAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"]
        let sanitizers = names.compactMap { name -> String? in
            getenv(name).map { name + "=" + String(cString: $0) }
        }
        // The log is appended to across restarts: this daemon's line is one more than before.
        let serving = { [logPath] in
            String(decoding: (try? readFile(logPath)) ?? [], as: UTF8.self).split(separator: "\n")
                .filter { $0.contains("serving on") }.count
        }
        let servedBefore = serving()
        if let cgroup {
            let enter = "echo $$ > \(cgroup.directory)/cgroup.procs && exec \"$0\" \"$@\""
            process = try Spawned("/bin/sh", ["-c", enter, Binaries.path("bgtaskd")] + arguments,
                                  environment: base + sanitizers + extra, standardError: .file(logPath))
        } else if let command = wrapper.first {
            process = try Spawned(command, Array(wrapper.dropFirst()) + [Binaries.path("bgtaskd")] + arguments,
                                  environment: base + sanitizers + extra, standardError: .file(logPath))
        } else {
            process = try Spawned(Binaries.path("bgtaskd"), arguments, environment: base + sanitizers + extra,
                                  standardError: .file(logPath))
        }
        try waitUntil("bgtaskd to answer at \(socketPath)", timeout: 10) {
            if process.hasExited { throw TestFailure("bgtaskd exited during start-up") }
            // The socket takes connections as soon as it is bound, before the state directory
            // exists: ready is "serving on" in the log (and, when asked, a connection).
            return serving() > servedBefore && (!connecting || UnixSocket.isAnswering(path: socketPath))
        }
    }

    /// Set once another daemon took over the directory: this one leaves it alone.
    private var handedOver = false

    deinit {
        guard !handedOver else { return }
        try? process.signal(SIGTERM)
        _ = try? process.wait(timeout: 5)
        // With what the test wrote there (its scripts, its workers' pids); kept, log and
        // state, where `BGTASKD_TEST_KEEP` is set (a failure to look at afterwards).
        if getenv("BGTASKD_TEST_KEEP") == nil { removeTree(directory) }
    }

    /// Where the daemon keeps its state: `state/` in the socket's directory.
    var stateDirectory: String { directory + "/state" }
    var statePath: String { stateDirectory + "/bgtaskd.state" }

    /// Kills the daemon with `SIGKILL`: it cleans nothing up.
    func crash() throws {
        try process.signal(SIGKILL)
        _ = try process.wait(timeout: 5)
    }

    /// Stops the daemon with `SIGTERM`, as systemd does, and waits for it to exit.
    func stop() throws {
        try process.signal(SIGTERM)
        _ = try process.wait(timeout: 5)
    }

    /// Starts another daemon on the same socket and state, which takes over the directory.
    func restart(_ settings: [String] = [], extraArguments: [String] = [], connecting: Bool = true,
                 wrapper: [String] = []) throws -> TestDaemon {
        handedOver = true
        return try TestDaemon(settings, extraArguments: extraArguments, directory: directory, connecting: connecting, wrapper: wrapper)
    }

    /// Whether a line of the log matches, waiting for it (at most `timeout` seconds): the
    /// daemon writes a pass's log records when the pass ends, just after what it did.
    func logged(timeout: Double = 5, _ match: (String) -> Bool) -> Bool {
        (try? waitUntil("a log line", timeout: timeout) { log().contains(where: match) }) != nil
    }

    /// The daemon's log lines so far.
    func log() -> [String] {
        let bytes = (try? readFile(logPath)) ?? []
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    /// A new client connection (the test process is a manager, never an app).
    func connect() throws -> VarlinkConnection { try VarlinkConnection(path: socketPath) }

    /// Calls an `io.bgtaskd.Manager` method on a fresh connection.
    @discardableResult
    func manager(_ member: String, _ parameters: [String: JSON] = [:]) throws -> [String: JSON] {
        try connect().call("io.bgtaskd.Manager.\(member)", parameters, timeoutMilliseconds: 5000)
    }

    func setState(_ pid: Int32, _ state: String) throws {
        try manager("SetAppState", ["pid": .int(Int64(pid)), "state": .string(state)])
    }

    func apps() throws -> [JSON] { try manager("ListApps")["apps"]?.arrayValue ?? [] }

    func app(_ pid: Int32) throws -> JSON? { try apps().first { $0["pid"]?.intValue == Int64(pid) } }

    func tasks(_ pid: Int32? = nil) throws -> [JSON] {
        let parameters: [String: JSON] = pid.map { ["pid": .int(Int64($0))] } ?? [:]
        return try manager("ListTasks", parameters)["tasks"]?.arrayValue ?? []
    }

    func history() throws -> [JSON] { try manager("GetHistory")["entries"]?.arrayValue ?? [] }

    /// Starts the probe app connected to this daemon and waits for its ready line.
    func probe() throws -> Probe { try Probe(daemon: self) }

    /// Runs `bgtaskctl --socket ... ARGS` to completion; returns (exit code, stdout and stderr).
    func ctl(_ arguments: [String], asUser uid: UInt32? = nil) throws -> (Int32, String) {
        var command = [Binaries.path("bgtaskctl"), "--socket", socketPath] + arguments
        if let uid {
            command = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + command
        }
        let process = try Spawned(uid == nil ? command[0] : "/usr/bin/setpriv", Array(command.dropFirst(uid == nil ? 1 : 0)),
                                  standardError: .mergeIntoOutput)
        process.closeInput()
        let output = try process.readAll(timeout: 10)
        let status = try process.wait(timeout: 10)
        return (Spawned.exitCode(status) ?? -1, output)
    }
}

/// The scriptable `bgtask-probe` app.
final class Probe {
    let process: Spawned
    /// Every line seen so far, parsed.
    private(set) var lines: [JSON] = []

    /// The Swift library's probe (`bgtask-libprobe`), run as uid 65534 (`setpriv`) when `asNobody`.
    static func library(_ daemon: TestDaemon, asNobody: Bool = false) throws -> Probe {
        guard asNobody else { return try Probe(daemon: daemon, binary: "bgtask-libprobe") }
        return try Probe(process: try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups",
                                                                   Binaries.path("bgtask-libprobe"), "--socket", daemon.socketPath]))
    }

    convenience init(daemon: TestDaemon, binary: String = "bgtask-probe") throws {
        try self.init(process: try Spawned(Binaries.path(binary), ["--socket", daemon.socketPath]))
    }

    /// A probe started some other way (e.g. by a shell that first moved into a cgroup).
    init(process: Spawned) throws {
        self.process = process
        _ = try next { $0["ready"] != nil }
    }

    var pid: Int32 { process.pid }

    func send(_ command: String) throws { try process.send(command) }

    /// The next line matching `predicate`, within `timeout` seconds.
    func next(timeout: Double = 5, _ predicate: (JSON) -> Bool) throws -> JSON {
        while true {
            guard let line = try process.readLine(timeout: timeout) else { throw TestFailure("probe output ended") }
            let value = try JSON.parse(line)
            lines.append(value)
            if predicate(value) { return value }
        }
    }

    /// Sends a call command and returns its reply parameters (or throws its error).
    @discardableResult
    func call(_ command: String) throws -> [String: JSON] {
        try send(command)
        let name = String(command.split(separator: " ")[0])
        let line = try next { $0["call"]?.stringValue == name }
        if let error = line["error"] { throw TestFailure("\(command) failed: \(error.serialized)") }
        return line["reply"]?.objectValue ?? [:]
    }

    /// Begins a task and returns its id.
    func begin(_ name: String) throws -> Int64 {
        guard let id = try call("begin \(name)")["taskId"]?.intValue else { throw TestFailure("begin gave no taskId") }
        return id
    }

    /// Waits for the subscription event named `name`.
    @discardableResult
    func event(_ name: String, timeout: Double = 5) throws -> JSON {
        try next(timeout: timeout) { $0["event"]?["event"]?.stringValue == name }["event"]!
    }

    /// Subscription event names seen so far, in order.
    var eventNames: [String] { lines.compactMap { $0["event"]?["event"]?.stringValue } }
}
