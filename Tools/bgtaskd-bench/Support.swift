// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import BGTaskSystem
import Foundation
import Varlink

/// Percentiles of a sample, in the sample's unit.
struct Summary: CustomStringConvertible {
    let p50: Double, p99: Double, max: Double, count: Int

    init(_ values: [Double]) {
        let sorted = values.sorted()
        func at(_ q: Double) -> Double { sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))] }
        p50 = at(0.50)
        p99 = at(0.99)
        max = sorted.last ?? .nan
        count = sorted.count
    }

    var json: JSON { .object(["p50": .double(p50), "p99": .double(p99), "max": .double(max), "count": .int(Int64(count))]) }
    var description: String { "p50 \(format(p50)) p99 \(format(p99)) max \(format(max))" }
}

func format(_ value: Double, _ digits: Int = 3) -> String {
    guard value.isFinite else { return "n/a" }
    var text = String(format: "%.\(digits)f", value)
    while text.contains("."), text.hasSuffix("0") { text.removeLast() }
    if text.hasSuffix(".") { text.removeLast() }
    return text
}

func now() -> Int64 { Clock.monotonicNanoseconds() }

func say(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }

/// A new directory `prefix-XXXXXX` of this user's alone (`mkdtemp(3)`): never one another
/// user made in a shared /tmp or /dev/shm.
func makeTemporaryDirectory(_ prefix: String) throws -> String {
    var template = Array((prefix + "-XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp(\(prefix))") }
    return String(cString: made)
}

/// The binaries next to this one.
let binaryDirectory: String = {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return (exe as NSString).deletingLastPathComponent
}()

/// The CPU time of the kernel's DAMON threads (`kdamond.N`): these machines monitor physical
/// memory with DAMON (`paddr`, a sample every 500 ms), and each sample checks pages through
/// every mapping of them, so with 10,000 processes sharing their libraries' pages a sample
/// took 100–215 ms of one of the two CPUs every ~0.6 s (1 ms with the apps gone; schedstat
/// read every 10 ms). A perf profile of the whole machine found it taking 16.6 % of both
/// CPUs over the scale section's deadlines (an 18 ms stall of the daemon's CPU at one of
/// them, the bare loop's relay late alike) and 29–31 % during two of three signal bursts
/// (×3.29, ×3.31) against none in the third (×1.86). Read before and after a measured
/// window, it tells a figure the machine took from one the daemon's work decided; waited
/// out before one (`awaitQuiet`), it is kept out of both sides of a ratio. The threads are
/// found once, before the apps are started (a scan of /proc among 10,000 apps would itself
/// be a load); none found: 0, and nothing is waited for.
enum MachineNoise {
    static let threads: [Int32] = {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(Int32.init).filter { pid in
            ((try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) ?? "").hasPrefix("kdamond")
        }
    }()

    /// Nanoseconds the threads have run on a CPU (`/proc/PID/schedstat`'s first field).
    static var nanoseconds: Int64 {
        threads.reduce(0) { total, pid in
            let text = (try? String(contentsOfFile: "/proc/\(pid)/schedstat", encoding: .utf8)) ?? ""
            return total + (text.split(separator: " ").first.flatMap { Int64($0) } ?? 0)
        }
    }

    /// Milliseconds they ran since `before` (a `nanoseconds` reading).
    static func milliseconds(since before: Int64) -> Double { Double(nanoseconds - before) / 1e6 }

    /// Returns just after a sample of theirs: once they have run and then not run for 10 ms
    /// (looked at every 2 ms), or after 1.5 s (a sample that costs next to nothing may pass
    /// between two looks). A window of a few hundred milliseconds started then is most often
    /// over before the next sample. For both sides of a ratio alike.
    static func awaitQuiet() {
        guard !threads.isEmpty else { return }
        let giveUp = now() + 1_500_000_000
        var last = nanoseconds, ran = false, still = now()
        while now() < giveUp {
            sleepUntil(now() + 2_000_000)  // a look every 2 ms: their runs last tens of ms
            let current = nanoseconds
            if current != last {
                ran = true
                last = current
                still = now()
            } else if ran, now() - still >= 10_000_000 {
                return
            }
        }
    }
}

/// A NUL-framed blocking client that keeps its bytes raw: the same work against the daemon
/// and the echo server.
final class RawClient {
    let socket: FileDescriptor
    var framer = VarlinkFramer(maximumMessageBytes: 1 << 30)
    /// Waits with `poll(2)` for `POLLIN` before each read, as `libbgtask` and `BGTaskClient`
    /// do, instead of sleeping in `read(2)`: a wake-up for write space (the server taking
    /// what was sent) does not end that wait.
    let pollsFirst: Bool

    init(path: String, pollsFirst: Bool = false) throws {
        socket = try UnixSocket.connect(path: path)
        self.pollsFirst = pollsFirst
    }

    /// Sends one frame and returns the parsed reply.
    @discardableResult
    func roundTrip(_ frame: [UInt8]) throws -> JSON {
        try socket.writeAll(frame)
        while true {
            if let message = try framer.next() { return try JSON.parse(message) }
            if pollsFirst { _ = try socket.waitReadable(timeoutMilliseconds: -1) }
            let bytes = try socket.read(upTo: 1 << 20)
            if bytes.isEmpty { throw ClientError(.protocolError, "connection closed") }
            framer.append(bytes)
        }
    }
}

let beginFrame = VarlinkCall(.beginTask,
                             parameters: ["name": "bench", "expirationHandler": true]).json.varlinkFrame

func endFrame(_ id: Int64) -> [UInt8] {
    VarlinkCall(.endTask, parameters: ["taskId": .int(id)]).json.varlinkFrame
}

/// One BeginTask+EndTask pair; against the echo server the same frames come back.
func pair(_ client: RawClient) throws {
    let reply = try client.roundTrip(beginFrame)
    let id = reply["parameters"]?["taskId"]?.intValue ?? 1
    if reply["error"] != nil { throw ClientError(.callFailed, reply.serialized) }
    let ended = try client.roundTrip(endFrame(id))
    if ended["error"] != nil { throw ClientError(.callFailed, ended.serialized) }
}

/// A process the benchmark runs: a daemon, the echo server, or an app.
final class Child {
    let pidfd: Pidfd
    var pid: Int32 { pidfd.pid }

    init(_ arguments: [String], environment: [String]? = nil, stdin: Subprocess.Stream = .inherit,
         stdout: Subprocess.Stream = .inherit, stderr: Subprocess.Stream = .inherit) throws {
        pidfd = try Subprocess.spawn(arguments, environment: environment, stdin: stdin, stdout: stdout, stderr: stderr)
    }

    /// Stops it with SIGTERM (through its pidfd) and reaps it.
    func stop() {
        try? pidfd.send(signal: SIGTERM)
        if (try? pidfd.descriptor.waitReadable(timeoutMilliseconds: 5000)) != true { try? pidfd.send(signal: SIGKILL) }
        _ = try? Subprocess.wait(pid: pid)
    }

    /// Resident memory in bytes (`VmRSS`).
    var residentBytes: Int { status("VmRSS:") * 1024 }

    /// Resident shared memory in bytes (`RssShmem`): the daemon's mapped state log.
    var sharedMemoryBytes: Int { status("RssShmem:") * 1024 }

    private func status(_ field: String) -> Int {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = text.split(separator: "\n").first { $0.hasPrefix(field) } ?? ""
        return Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? 0
    }

    /// Times the daemon was scheduled (voluntary and involuntary context switches): its
    /// wake-ups. (The fields are tab-separated: split on spaces alone, as this was until the
    /// twenty-third round, it read 0 whatever the count.)
    var contextSwitches: Int { status("voluntary_ctxt_switches:") + status("nonvoluntary_ctxt_switches:") }

    /// Nanoseconds its threads have run on a CPU (`/proc/PID/task/*/schedstat`, exact where
    /// `cpuTicks` counts 10 ms ticks): what a burst cost the daemon, whatever else ran.
    var cpuNanoseconds: Int64 {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.reduce(0) { total, task in
            let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8)) ?? ""
            return total + (text.split(separator: " ").first.flatMap { Int64($0) } ?? 0)
        }
    }

    /// User plus system CPU time in clock ticks (`/proc/PID/stat` fields 14 and 15).
    var cpuTicks: Int { (statField(14) ?? 0) + (statField(15) ?? 0) }

    /// Page faults that needed no I/O (`/proc/PID/stat` field 10): a page of a mapping
    /// touched for the first time is one.
    var minorFaults: Int { statField(10) ?? 0 }

    /// Field `number` (from 1, as proc(5) counts) of `/proc/PID/stat`.
    private func statField(_ number: Int) -> Int? {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        return number - 3 < fields.count ? Int(fields[number - 3]) : nil
    }
}

/// A bgtaskd on a fresh socket, started with `NOTIFY_SOCKET` so start-up can be timed.
final class BenchDaemon {
    let directory: String
    let socketPath: String
    let child: Child
    /// Nanoseconds from spawning to `READY=1`.
    let startup: Int64

    /// Without `followingForks`, the daemon runs without `CAP_NET_ADMIN` (`setpriv`): its
    /// process apps are walked, not followed, and no process started elsewhere on the
    /// machine wakes it (the idle rows measure that wake-up on their own).
    init(_ settings: [String], followingForks: Bool = true) throws {
        // On a tmpfs, as /run/bgtaskd (the socket and the state file) is under systemd; the
        // state file is written on every change. BGTASKD_BENCH_DIR overrides it.
        let base = ProcessInfo.processInfo.environment["BGTASKD_BENCH_DIR"]
            ?? (FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm/" : NSTemporaryDirectory())
        directory = try makeTemporaryDirectory(base + "bgtaskd-bench")
        socketPath = directory + "/io.bgtaskd"
        let notify = try UnixSocket.bindDatagram(path: directory + "/notify")
        let arguments = (followingForks ? [] : ["/usr/bin/setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin"])
            + [binaryDirectory + "/bgtaskd", "--socket", socketPath] + settings.flatMap { ["--set", $0] }
        let started = now()
        // The log stays in the directory while the daemon runs; BGTASKD_BENCH_LOG keeps a copy.
        child = try Child(arguments, environment: ["NOTIFY_SOCKET=\(directory)/notify", "PATH=/usr/bin:/bin"],
                          stderr: .file(ProcessInfo.processInfo.environment["BGTASKD_BENCH_LOG"] ?? "/dev/null"))
        var ready = false
        while !ready {
            guard try notify.waitReadable(timeoutMilliseconds: 10_000) else { throw ClientError(.timedOut, "no READY=1") }
            ready = String(decoding: try notify.read(upTo: 4096), as: UTF8.self).split(separator: "\n").contains("READY=1")
        }
        startup = now() - started
    }

    func stop() {
        child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func manager(_ member: String, _ parameters: [String: JSON] = [:]) throws -> [String: JSON] {
        try VarlinkConnection(path: socketPath).call("io.bgtaskd.Manager.\(member)", parameters, timeoutMilliseconds: 60_000)
    }
}

/// The baseline: a bare NUL-framed echo server on the same sd-event loop and socket kind.
enum EchoServer {
    static func run(path: String) -> Never {
        do {
            let loop = try EventLoop()
            let listener = try UnixSocket.listen(path: path)
            var connections: [Int32: (FileDescriptor, EventSource)] = [:]
            let accept = try loop.addIO(listener.rawValue, events: IOEvents.readable) { _ in
                while let socket = try? UnixSocket.accept(listener) {
                    let fd = socket.rawValue
                    var framer = VarlinkFramer(maximumMessageBytes: 1 << 30)
                    guard let source = try? loop.addIO(fd, events: IOEvents.readable, { _ in
                        guard let bytes = try? socket.readAvailable(upTo: 65536) else { return }
                        if bytes.isEmpty { connections[fd] = nil; return }
                        framer.append(bytes)
                        var out: [UInt8] = []
                        while let message = try? framer.next() { out += message; out.append(0) }
                        // Echoed whole, waiting for room when a large message fills the socket.
                        var rest = out[...]
                        while !rest.isEmpty {
                            do {
                                if let written = try socket.writeAvailable(rest) {
                                    rest = rest.dropFirst(written)
                                } else {
                                    _ = try socket.waitWritable(timeoutMilliseconds: 10_000)
                                }
                            } catch {
                                break
                            }
                        }
                    }) else { continue }
                    connections[fd] = (socket, source)
                }
            }
            _ = accept
            print("ready")
            exit(try loop.run())
        } catch {
            say("echo server: \(error)")
            exit(1)
        }
    }
}

/// Hands a value to one other thread that alone uses it from then on.
final class Handoff<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// Sleeps until the monotonic instant `deadline` (nanoseconds).
func sleepUntil(_ deadline: Int64) {
    let left = deadline - now()
    guard left > 0 else { return }
    var pause = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
    nanosleep(&pause, nil)
}

/// The benchmark's tiny C apps against one daemon: spawned in bulk, each reporting in with
/// "ok PID"; closing their shared stdin ends them all.
final class BenchApps {
    let socket: String
    private let stdinRead: FileDescriptor, stdinWrite: FileDescriptor
    private let stdoutRead: FileDescriptor, stdoutWrite: FileDescriptor
    private var buffered: [UInt8] = []
    private(set) var pids: [Int32] = []

    init(socket: String) throws {
        self.socket = socket
        (stdinRead, stdinWrite) = try Subprocess.pipe()
        (stdoutRead, stdoutWrite) = try Subprocess.pipe()
        try stdoutRead.setNonBlocking()
    }

    /// Spawns `count` apps, each beginning `tasks` tasks (and `mode`: subscribe or hold), and
    /// waits until each reported in; returns their pids.
    /// `executables`: the binary of each (hard links of the app: apps of their own, by key);
    /// `cgroups`: the cgroup directory each moves itself into first (unit apps).
    func spawn(_ count: Int, tasks: Int, mode: String? = nil, executables: [String]? = nil,
               cgroups: [String]? = nil) throws -> [Int32] {
        var spawned: [Int32] = []
        var ready = 0
        func drain() throws {
            while let chunk = try stdoutRead.readAvailable(upTo: 65536), !chunk.isEmpty {
                buffered += chunk
                while let newline = buffered.firstIndex(of: 10) {
                    if buffered[..<newline].starts(with: Array("ok ".utf8)) { ready += 1 }
                    buffered.removeSubrange(...newline)
                }
            }
        }
        for index in 0..<count {
            let binary = executables.map { $0[index % $0.count] } ?? binaryDirectory + "/bgtask-bench-app"
            let arguments = [binary] + (cgroups.map { ["--cgroup", $0[index]] } ?? []) + [socket, String(tasks)]
                + (mode.map { [$0] } ?? [])
            spawned.append(try Subprocess.spawn(arguments, stdin: .descriptor(stdinRead.rawValue),
                                                stdout: .descriptor(stdoutWrite.rawValue), stderr: .file("/dev/null")).pid)
            if spawned.count % 200 == 0 { try drain() }
        }
        let deadline = now() + 300_000_000_000
        pids += spawned
        while ready < count, now() < deadline {
            if try !stdoutRead.waitReadable(timeoutMilliseconds: 1000) {
                // Quiet for a second: an app that exited will never report in.
                let exited = spawned.filter { pid in
                    var info = siginfo_t()
                    return waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info._sifields._sigchld.si_pid == pid
                }
                if !exited.isEmpty { throw ClientError(.callFailed, "\(exited.count) of \(count) apps exited before reporting in") }
            }
            try drain()
        }
        if ready < count { throw ClientError(.timedOut, "only \(ready) of \(count) apps reported in") }
        return spawned
    }

    /// Every app sees EOF and exits (stopped ones are continued first: they cannot read it).
    func end() {
        for pid in pids where pid > 1 {
            if let pidfd = try? Pidfd.open(pid: pid) { try? pidfd.send(signal: SIGCONT) }
        }
        stdinWrite.close()
        for pid in pids { _ = try? Subprocess.wait(pid: pid, block: true) }
        pids = []
    }
}

/// A `Monitor` stream read on its own thread: (event, pid, when received) per event; task
/// changes are named "task:" + the task's new state. An event's time is when the read that
/// brought it returned: the thread only reads and stamps, and the events are parsed when
/// asked for (`events()`), so parsing one event never delays the next one's stamp.
final class MonitorRecorder {
    private let arrivals = Locked<[(bytes: [UInt8], received: Int64)]>([])
    private let connection: VarlinkConnection
    private var framer = VarlinkFramer(maximumMessageBytes: 1 << 20)
    private var parsed: [(String, Int64, Int64)] = []

    init(_ path: String) throws {
        connection = try VarlinkConnection(path: path)
        try connection.send(VarlinkCall(.monitor, more: true))
        let fd = connection.fileDescriptor
        let arrivals = self.arrivals
        Thread {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 1)
            defer { buffer.deallocate() }
            while true {
                let count: Int = read(fd, buffer.baseAddress, buffer.count)
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { return }
                let received = now()
                let bytes = [UInt8](buffer[..<count])
                arrivals.withLock { $0.append((bytes, received)) }
            }
        }.start()
    }

    /// Every event read so far, in order.
    func events() -> [(String, Int64, Int64)] {
        var chunks: [(bytes: [UInt8], received: Int64)] = []
        arrivals.withLock { swap(&chunks, &$0) }
        for (bytes, received) in chunks {
            framer.append(bytes)
            while let message = try? framer.next() {
                guard let reply = try? VarlinkReply(message: JSON.parse(message)) else { continue }
                let parameters = reply.parameters
                let name = parameters["event"]?.stringValue ?? ""
                let pid = parameters["task"]?["appPid"]?.intValue ?? parameters["entry"]?["pid"]?.intValue
                    ?? parameters["pid"]?.intValue ?? 0
                let state = parameters["task"]?["state"]?.stringValue
                parsed.append((state.map { "task:" + $0 } ?? name, pid, received))
            }
        }
        return parsed
    }

    /// Ends the stream (the reading thread sees the connection shut down).
    func stop() { shutdown(connection.fileDescriptor, Int32(SHUT_RDWR)) }
}

/// Targets: each figure with its target, PASS or MISS, kept for bench-results.json.
@MainActor var targets: [JSON] = []

/// "×1.23 (target ≤ 1.5) PASS" for a ratio, or "0.8 (target < 1) PASS" for a value.
@MainActor func check(_ value: Double, _ relation: String, _ target: Double, key: String, ratio: Bool = true) -> String {
    let pass = relation == "≤" ? value <= target : relation == "<" ? value < target : relation == "≥" ? value >= target : value > target
    targets.append(.object(["measure": .string(key), "value": .double(value), "relation": .string(relation),
                            "target": .double(target), "pass": .bool(pass)]))
    let shown = ratio ? "×\(format(value, 2))" : format(value, 3)
    return "\(shown) (target \(relation) \(format(target, 2))) \(pass ? "PASS" : "MISS")"
}
