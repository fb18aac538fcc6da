// bgtaskd-bench: measures bgtaskd against baselines taken in the same run.
//
//   bgtaskd-bench [--quick] [--apps N] [--tasks-per-app N] [--json PATH]
//   bgtaskd-bench --soak SECONDS [--apps N]     (make soak; see Soak.swift)
//
// Start-up (exec to READY=1); BeginTask+EndTask round trip against a NUL-framed echo server
// (both pinned to one CPU, then unpinned); throughput with 1/16/64/256 clients against the
// echo server; idle CPU; memory per task and ListTasks time with 10,000 apps holding 100,000
// tasks; deadline lateness and enforcement latency with those 100,000 deadlines pending.
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--echo-server" { EchoServer.run(path: arguments[1]) }
if arguments.first == "--soak" {
    let apps = arguments.count > 3 && arguments[2] == "--apps" ? Int(arguments[3]) ?? 2000 : 2000
    try Soak.run(seconds: Double(arguments.count > 1 ? arguments[1] : "600") ?? 600, apps: apps)
}
var quick = false, apps = 10_000, tasksPerApp = 10, jsonPath: String? = nil
while let argument = arguments.first {
    arguments.removeFirst()
    switch argument {
    case "--quick": quick = true; apps = 1000
    case "--apps": apps = Int(arguments.removeFirst()) ?? apps
    case "--tasks-per-app": tasksPerApp = Int(arguments.removeFirst()) ?? tasksPerApp
    case "--json": jsonPath = arguments.removeFirst()
    default: say("usage: bgtaskd-bench [--quick] [--apps N] [--tasks-per-app N] [--json PATH]"); exit(2)
    }
}
let pairs = quick ? 2_000 : 20_000
let throughputSeconds = quick ? 0.5 : 2.0
let idleSeconds = quick ? 2.0 : 10.0
var results: [String: JSON] = ["date": .string(ISO8601DateFormatter().string(from: Date())), "cpus": .int(Int64(onlineCPUs.count))]
var table: [(String, String, String, String)] = []  // measure, bgtaskd, baseline, ratio / target

@MainActor func row(_ name: String, _ value: String, _ baseline: String = "", _ ratio: String = "") {
    table.append((name, value, baseline, ratio))
    say(String(format: "%-44@ %-28@ %-22@ %@", name as NSString, value as NSString, baseline as NSString, ratio as NSString))
}

// MARK: Start-up

var startups: [Double] = []
for _ in 0..<(quick ? 5 : 20) {
    let daemon = try BenchDaemon([])
    startups.append(Double(daemon.startup) / 1e6)
    daemon.stop()
}
let startup = Summary(startups)
results["startupMilliseconds"] = startup.json
row("start-up: exec to READY=1 (ms)", "\(startup)", "", "target < 50")

// MARK: Round trip and throughput

let fast = ["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "MaxConnectionsPerUser=4096", "MaxTasksPerApp=100000"]
let daemon = try BenchDaemon(fast)
let echoPath = daemon.directory + "/echo"
let (echoOut, echoOutWrite) = try Subprocess.pipe()
let echo = try Child([binaryDirectory + "/bgtaskd-bench", "--echo-server", echoPath], stdout: .descriptor(echoOutWrite.rawValue))
echoOutWrite.close()
_ = try echoOut.waitReadable(timeoutMilliseconds: 10_000)

@MainActor func roundTrips(_ path: String, count: Int) throws -> [Double] {
    let client = try RawClient(path: path)
    for _ in 0..<(count / 10) { try pair(client) }  // warm up
    var samples: [Double] = []
    samples.reserveCapacity(count)
    for _ in 0..<count {
        let start = now()
        try pair(client)
        samples.append(Double(now() - start) / 1000)
    }
    return samples
}

for pinned in [true, false] {
    let cpus = pinned ? [0] : onlineCPUs
    for pid in [daemon.child.pid, echo.pid, 0] { try setCPUAffinity(pid: pid, cpus: cpus) }
    let ours = Summary(try roundTrips(daemon.socketPath, count: pairs))
    let base = Summary(try roundTrips(echoPath, count: pairs))
    let key = pinned ? "roundTripPinned" : "roundTripUnpinned"
    results[key] = .object(["bgtaskd": ours.json, "echo": base.json, "ratioP50": .double(ours.p50 / base.p50),
                            "ratioP99": .double(ours.p99 / base.p99)])
    row("round trip Begin+End, \(pinned ? "pinned to 1 CPU" : "unpinned") (µs)", "\(ours)", "echo \(base)",
        "×\(format(ours.p50 / base.p50, 2)) p50, ×\(format(ours.p99 / base.p99, 2)) p99" + (pinned ? " (target ≤ 2)" : ""))
}

@MainActor func throughput(_ path: String, clients: Int, seconds: Double) throws -> Double {
    let done = DispatchSemaphore(value: 0)
    let total = Locked(0)
    let failure = Locked<String?>(nil)
    let stopAt = now() + Int64(seconds * 1e9)
    for _ in 0..<clients {
        let thread = Thread {
            do {
                let client = try RawClient(path: path)
                var count = 0
                while now() < stopAt {
                    try pair(client)
                    count += 1
                }
                total.withLock { $0 += count }
            } catch {
                failure.withLock { $0 = "\(error)" }
            }
            done.signal()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    for _ in 0..<clients { done.wait() }
    if let failure = failure.withLock({ $0 }) { throw ClientError(.callFailed, failure) }
    return Double(total.withLock { $0 }) / seconds
}

var throughputs: [String: JSON] = [:]
for clients in [1, 16, 64, 256] {
    let ours = try throughput(daemon.socketPath, clients: clients, seconds: throughputSeconds)
    let base = try throughput(echoPath, clients: clients, seconds: throughputSeconds)
    throughputs["\(clients)"] = .object(["bgtaskd": .double(ours), "echo": .double(base), "ratio": .double(ours / base)])
    row("throughput, \(clients) client\(clients == 1 ? "" : "s") (Begin+End pairs/s)", format(ours, 0), "echo \(format(base, 0))",
        "×\(format(ours / base, 2))" + (clients == 64 ? " (target ≥ 0.5)" : ""))
}
results["throughput"] = .object(throughputs)
echo.stop()

// MARK: Idle

let idleDaemon = try BenchDaemon([])
let ticksBefore = idleDaemon.child.cpuTicks
Thread.sleep(forTimeInterval: idleSeconds)  // the measurement itself: time with nothing to do
let idleTicks = idleDaemon.child.cpuTicks - ticksBefore
results["idle"] = .object(["seconds": .double(idleSeconds), "cpuTicks": .int(Int64(idleTicks))])
row("idle CPU over \(format(idleSeconds, 0))s (clock ticks)", "\(idleTicks)", "", "target 0")
idleDaemon.stop()
daemon.stop()

// MARK: Scale: apps, tasks, memory, ListTasks

let scale = try BenchDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "BackgroundTimeSec=1s", "ExpirationWarningSec=500ms",
                             "TransitionTimeoutSec=1h", "TaskAgeWarningSec=1h", "MaxApps=100000", "SuspendMode=signal",
                             // 10,000 apps start at once: admission under a connection storm is
                             // not what this measures (the hostile-client tests cover the limit).
                             "MaxConnectionsPerUser=16384"])
let (appsIn, appsInWrite) = try Subprocess.pipe()         // closing this ends every app
let (appsOut, appsOutWrite) = try Subprocess.pipe()       // each app writes "ok PID"
try appsOut.setNonBlocking()
let appBinary = binaryDirectory + "/bgtask-bench-app"
var appPIDs: [Int32] = []
var buffered: [UInt8] = []

/// Spawns `count` apps and waits until each reported in; returns their pids.
@MainActor func spawnApps(_ count: Int, tasks: Int, subscribe: Bool) throws -> [Int32] {
    var pids: [Int32] = []
    var ready = 0
    func drain() throws {
        while let chunk = try appsOut.readAvailable(upTo: 65536), !chunk.isEmpty {
            buffered += chunk
            while let newline = buffered.firstIndex(of: 10) {
                if buffered[..<newline].starts(with: Array("ok ".utf8)) { ready += 1 }
                buffered.removeSubrange(...newline)
            }
        }
    }
    for _ in 0..<count {
        let arguments = [appBinary, scale.socketPath, String(tasks)] + (subscribe ? ["subscribe"] : [])
        pids.append(try Subprocess.spawn(arguments, stdin: .descriptor(appsIn.rawValue), stdout: .descriptor(appsOutWrite.rawValue),
                                         stderr: .file("/dev/null")).pid)
        if pids.count % 200 == 0 { try drain() }
    }
    let deadline = now() + 300_000_000_000
    while ready < count, now() < deadline {
        _ = try appsOut.waitReadable(timeoutMilliseconds: 1000)
        try drain()
    }
    if ready < count { throw ClientError(.timedOut, "only \(ready) of \(count) apps reported in") }
    return pids
}

let rssBefore = scale.child.residentBytes
let spawnStart = now()
appPIDs += try spawnApps(apps, tasks: tasksPerApp, subscribe: false)
let spawnSeconds = Double(now() - spawnStart) / 1e9
let status = try scale.manager("GetStatus")
let taskCount = Int(status["tasks"]?.intValue ?? 0)
let rssAfter = scale.child.residentBytes
let perTask = Double(rssAfter - rssBefore) / Double(max(1, taskCount))
var listTimes: [Double] = []
for _ in 0..<5 {
    let start = now()
    let listed = try scale.manager("ListTasks")["tasks"]?.arrayValue?.count ?? 0
    listTimes.append(Double(now() - start) / 1e6)
    if listed != taskCount { say("ListTasks returned \(listed) of \(taskCount) tasks") }
}
let listTasks = Summary(listTimes)
results["scale"] = .object(["apps": .int(status["apps"]?.intValue ?? 0), "tasks": .int(Int64(taskCount)),
                            "residentBytesBefore": .int(Int64(rssBefore)), "residentBytesAfter": .int(Int64(rssAfter)),
                            "bytesPerTask": .double(perTask), "listTasksMilliseconds": listTasks.json,
                            "setupSeconds": .double(spawnSeconds)])
row("\(status["apps"]?.intValue ?? 0) apps, \(taskCount) tasks: daemon memory per task", "\(format(perTask, 0)) bytes",
    "RSS \(rssBefore / 1024) → \(rssAfter / 1024) KiB", "target ≤ 1024")
row("ListTasks with \(taskCount) tasks (ms)", "\(listTasks)")

// MARK: Deadlines with every task's timer pending

let monitorEvents = Locked<[(String, Int64, Int64)]>([])  // (event, pid, received)
let monitor = try VarlinkConnection(path: scale.socketPath)
try monitor.send(VarlinkCall(method: "io.bgtaskd.Manager.Monitor", more: true))
let monitorHandoff = Handoff(monitor)
let monitorThread = Thread {
    while let reply = try? monitorHandoff.value.receive() {
        let received = now()
        let parameters = reply.parameters
        let name = parameters["event"]?.stringValue ?? ""
        let pid = parameters["task"]?["appPid"]?.intValue ?? parameters["entry"]?["pid"]?.intValue ?? parameters["pid"]?.intValue ?? 0
        let state = parameters["task"]?["state"]?.stringValue
        monitorEvents.withLock { $0.append((state.map { "task:" + $0 } ?? name, pid, received)) }
    }
}
monitorThread.start()

let probes = quick ? 50 : 200
// Every app is backgrounded within 0.8 s, before the first deadline (1 s), so the /proc
// poller below is watching before any deadline passes.
let spacing: Int64 = min(5_000_000, 800_000_000 / Int64(2 * probes))
let warned = try spawnApps(probes, tasks: 1, subscribe: false)     // warned at +500ms, killed at +1s
let idleApps = try spawnApps(probes, tasks: 0, subscribe: true)    // never finish: suspended at +1s
let manager = try VarlinkConnection(path: scale.socketPath)
var backgroundedAt: [Int32: Int64] = [:]
let order = zip(warned, idleApps).flatMap { [$0, $1] }
let firstDeadline = now() + 1_000_000_000
for (index, pid) in order.enumerated() {
    sleepUntil(firstDeadline - 1_000_000_000 + Int64(index) * spacing)  // pace: one app every `spacing`
    backgroundedAt[pid] = now()
    _ = try manager.call("io.bgtaskd.Manager.SetAppState", ["pid": .int(Int64(pid)), "state": "background"])
}
// Enforcement: from each deadline to the process observed stopped in /proc.
var enforcement: [Double] = []
for pid in idleApps {
    let deadline = backgroundedAt[pid]! + 1_000_000_000
    let giveUp = deadline + 2_000_000_000
    sleepUntil(deadline - 1_000_000)
    while now() < giveUp {
        if (try? ProcStat.read(pid: pid))?.state == "T" {
            enforcement.append(Double(now() - deadline) / 1e6)
            break
        }
        sleepUntil(now() + 100_000)  // 100 µs between looks: a spinning bench would steal the daemon's CPU
    }
}
let monitorDeadline = now() + 3_000_000_000
while now() < monitorDeadline, monitorEvents.withLock({ $0.filter { $0.0 == "terminated" }.count }) < probes {
    Thread.sleep(forTimeInterval: 0.01)  // poll interval while the last terminations arrive
}
let events = monitorEvents.withLock { $0 }
@MainActor func lateness(_ event: String, _ pids: [Int32], offset: Int64) -> [Double] {
    pids.compactMap { pid in
        events.first { $0.0 == event && $0.1 == Int64(pid) }.map { Double($0.2 - backgroundedAt[pid]! - offset) / 1e6 }
    }
}
let warnings = Summary(lateness("task:expiring", warned, offset: 500_000_000))
let suspensions = Summary(lateness("suspended", idleApps, offset: 1_000_000_000))
let terminations = Summary(lateness("terminated", warned, offset: 1_000_000_000))
let enforced = Summary(enforcement)
results["deadlines"] = .object(["pendingDeadlines": .int(Int64(taskCount)), "warningLatenessMilliseconds": warnings.json,
                                "suspensionLatenessMilliseconds": suspensions.json,
                                "terminationLatenessMilliseconds": terminations.json,
                                "enforcementMilliseconds": enforced.json])
row("warning lateness, \(taskCount) deadlines pending (ms)", "\(warnings)", "n=\(warnings.count)", "target p99 < 2")
row("suspension lateness (ms)", "\(suspensions)", "n=\(suspensions.count)", "target p99 < 2")
row("termination lateness (ms)", "\(terminations)", "n=\(terminations.count)")
row("enforcement: deadline to stopped in /proc (ms)", "\(enforced)", "n=\(enforced.count)", "target p99 < 5")

for pid in idleApps {  // suspended apps cannot read their EOF: bring them back first
    _ = try? manager.call("io.bgtaskd.Manager.SetAppState", ["pid": .int(Int64(pid)), "state": "foreground"])
}
appsInWrite.close()  // every app sees EOF and exits
for pid in appPIDs + warned + idleApps { _ = try? Subprocess.wait(pid: pid, block: true) }
scale.stop()

// MARK: Report

var machine = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
    .split(separator: "\n").first { $0.hasPrefix("model name") }.map { String($0.split(separator: ":")[1]).trimmingCharacters(in: .whitespaces) } ?? "?"
let kernel = (try? String(contentsOfFile: "/proc/sys/kernel/osrelease", encoding: .utf8))?
    .trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
machine += ", \(onlineCPUs.count) CPUs, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB, Linux \(kernel)"
results["machine"] = .string(machine)
say("\nmachine: \(machine)")
print("| measure | bgtaskd | baseline | ratio / target |")
print("| --- | --- | --- | --- |")
for (name, value, baseline, ratio) in table { print("| \(name) | \(value) | \(baseline) | \(ratio) |") }
if let jsonPath {
    try Data(JSON.object(results).serialized.utf8).write(to: URL(fileURLWithPath: jsonPath))
}
