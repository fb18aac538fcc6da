// SPDX-License-Identifier: Apache-2.0
// bgtaskd-bench: measures bgtaskd against baselines taken in the same run.
//
//   bgtaskd-bench [--quick] [--apps N] [--tasks-per-app N] [--json PATH] [--only SECTION,...]
//   bgtaskd-bench --soak SECONDS [--apps N]     (make soak; see Soak.swift)
//   bgtaskd-bench --pairs SOCKET N [--samples FILE]   (N Begin+End pairs: a load to profile)
//
// Sections (--only picks some): startup (exec to READY=1); roundtrip (BeginTask+EndTask
// against a NUL-framed echo server, pinned to one CPU — also with a client that polls
// before it reads, as the libraries do — then unpinned; throughput with
// 1/16/64/256 clients); idle CPU; scale (memory per task, ListTasks against echoing the
// same bytes, `bgtaskctl tasks`, with 10,000 apps holding 100,000 tasks; deadline lateness
// and enforcement latency with those 100,000 deadlines pending); bursts (Bursts.swift);
// freezer (unit apps frozen in a burst, FreezerBursts.swift); fairness (warnings' lateness
// under a flood of calls, Fairness.swift); logind (Logind.swift); instructions (callgrind, Instructions.swift). Every figure with a
// target says PASS or MISS.
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--echo-server" { EchoServer.run(path: arguments[1]) }
if arguments.first == "--pairs", arguments.count >= 3, let count = Int(arguments[2]) {
    // N Begin+End pairs on one connection to SOCKET: what the instruction count runs under
    // callgrind, a load to profile with perf, and bgtaskd's side of the logind comparison
    // (--samples FILE: each pair's time in µs, after a tenth as many to warm up).
    let client = try RawClient(path: arguments[1])
    if arguments.count == 5, arguments[3] == "--samples" {
        for _ in 0..<(count / 10) { try pair(client) }
        // The samples kept as numbers and written after the last pair: formatting each
        // between pairs (Foundation's `String(format:)`) evicted the daemon's working set from
        // the one CPU's caches, and was ~3 µs of every bgtaskd pair (1.5 of the echo's).
        var samples: [Int64] = []
        samples.reserveCapacity(count)
        for _ in 0..<count {
            let start = now()
            try pair(client)
            samples.append(now() - start)
        }
        try samples.map { format(Double($0) / 1000) + "\n" }.joined().write(toFile: arguments[4], atomically: false, encoding: .utf8)
    } else {
        for _ in 0..<count { try pair(client) }
    }
    exit(0)
}
if arguments.first == "--throughput", arguments.count == 4, let clients = Int(arguments[2]), let seconds = Double(arguments[3]) {
    // CLIENTS connections to SOCKET making Begin+End pairs for SECONDS, as the roundtrip
    // section's throughput rows do: prints pairs/s and the clients' own CPU seconds (to
    // profile one server at a time, or to weigh the clients' share of the machine).
    let rate = try throughput(arguments[1], clients: clients, seconds: seconds)
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let cpu = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    print("\(format(rate, 0)) pairs/s, clients' CPU \(format(cpu, 3)) s")
    exit(0)
}
if arguments.first == "--soak" {
    let apps = arguments.count > 3 && arguments[2] == "--apps" ? Int(arguments[3]) ?? 2000 : 2000
    try Soak.run(seconds: Double(arguments.count > 1 ? arguments[1] : "600") ?? 600, apps: apps)
}
var quick = false, apps = 10_000, tasksPerApp = 10, jsonPath: String? = nil
let allSections = ["startup", "roundtrip", "idle", "requests", "scale", "bursts", "freezer", "fairness", "logind", "instructions"]
var sections = Set(allSections)
while let argument = arguments.first {
    arguments.removeFirst()
    switch argument {
    case "--quick": quick = true; apps = 1000
    case "--apps": apps = Int(arguments.removeFirst()) ?? apps
    case "--tasks-per-app": tasksPerApp = Int(arguments.removeFirst()) ?? tasksPerApp
    case "--json": jsonPath = arguments.removeFirst()
    case "--only": sections = Set(arguments.removeFirst().split(separator: ",").map(String.init))
    default:
        say("usage: bgtaskd-bench [--quick] [--apps N] [--tasks-per-app N] [--json PATH] [--only \(allSections.joined(separator: ","))]")
        exit(2)
    }
}
// 10,000 apps each holding a stream, and their pidfds, are 20,000 descriptors in the daemon:
// where the hard limit is lower (20,000 on these machines), root raises it for its children.
var descriptors = rlimit()
let nofile = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
if getrlimit(nofile, &descriptors) == 0, descriptors.rlim_max < 65536, getuid() == 0 {
    descriptors.rlim_max = 65536
    _ = setrlimit(nofile, &descriptors)
}
_ = MachineNoise.threads  // found before any app is started
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

if sections.contains("startup") {
    var startups: [Double] = []
    for _ in 0..<(quick ? 5 : 20) {
        let daemon = try BenchDaemon([])
        startups.append(Double(daemon.startup) / 1e6)
        daemon.stop()
    }
    let startup = Summary(startups)
    results["startupMilliseconds"] = startup.json
    row("start-up: exec to READY=1 (ms)", "\(startup)", "", check(startup.p50, "<", 50, key: "startupP50", ratio: false))
}

// MARK: Round trip and throughput

let echoDirectory = try makeTemporaryDirectory(NSTemporaryDirectory() + "bgtaskd-bench-echo")
defer { try? FileManager.default.removeItem(atPath: echoDirectory) }
let echoPath = echoDirectory + "/echo"
let (echoOut, echoOutWrite) = try Subprocess.pipe()
let echo = try Child([binaryDirectory + "/bgtaskd-bench", "--echo-server", echoPath], stdout: .descriptor(echoOutWrite.rawValue))
echoOutWrite.close()
_ = try echoOut.waitReadable(timeoutMilliseconds: 10_000)

/// `count` round trips of bgtaskd (`path`) and of the echo (`basePath`), taken in turns, 20
/// blocks each: a slow spell of this shared machine (they last seconds) falls on both alike
/// instead of deciding the ratio by which of the two it fell on.
@MainActor func roundTrips(_ path: String, against basePath: String, count: Int,
                           pollsFirst: Bool = false) throws -> (ours: Summary, base: Summary) {
    let clients = [try RawClient(path: path, pollsFirst: pollsFirst), try RawClient(path: basePath, pollsFirst: pollsFirst)]
    for client in clients { for _ in 0..<(count / 10) { try pair(client) } }  // warm up
    var samples: [[Double]] = [[], []]
    let block = max(1, count / 20)
    while samples[1].count < count {
        for (index, client) in clients.enumerated() {
            for _ in 0..<min(block, count - samples[index].count) {
                let start = now()
                try pair(client)
                samples[index].append(Double(now() - start) / 1000)
            }
        }
    }
    return (Summary(samples[0]), Summary(samples[1]))
}

/// Begin+End pairs per second of bgtaskd and of the echo, measured in turns, four slices
/// each (the reason `roundTrips` takes turns).
@MainActor func throughput(_ path: String, against basePath: String, clients: Int,
                           seconds: Double) throws -> (ours: Double, base: Double) {
    let slices = 4
    var ours = 0.0, base = 0.0
    for _ in 0..<slices {
        ours += try throughput(path, clients: clients, seconds: seconds / Double(slices))
        base += try throughput(basePath, clients: clients, seconds: seconds / Double(slices))
    }
    return (ours / Double(slices), base / Double(slices))
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

let fast = ["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "MaxConnectionsPerUser=4096", "MaxTasksPerApp=100000"]
/// Round trips of bgtaskd and of the echo, as `bench-results.json` keeps them.
func roundTripJSON(_ ours: Summary, _ base: Summary) -> JSON {
    .object(["bgtaskd": ours.json, "echo": base.json, "ratioP50": .double(ours.p50 / base.p50), "ratioP99": .double(ours.p99 / base.p99)])
}
/// Their ratios, for a row with no target.
func roundTripRatios(_ ours: Summary, _ base: Summary) -> String {
    "×\(format(ours.p50 / base.p50, 2)) p50, ×\(format(ours.p99 / base.p99, 2)) p99"
}
if sections.contains("roundtrip") {
    let daemon = try BenchDaemon(fast)
    for pinned in [true, false] {
        let cpus = pinned ? [0] : onlineCPUs
        for pid in [daemon.child.pid, echo.pid, 0] { try setCPUAffinity(pid: pid, cpus: cpus) }
        let (ours, base) = try roundTrips(daemon.socketPath, against: echoPath, count: pairs)
        let key = pinned ? "roundTripPinned" : "roundTripUnpinned"
        results[key] = roundTripJSON(ours, base)
        row("round trip Begin+End, \(pinned ? "pinned to 1 CPU" : "unpinned") (µs)", "\(ours)", "echo \(base)",
            pinned ? "p50 " + check(ours.p50 / base.p50, "≤", 1.5, key: "roundTripPinnedP50")
                + ", p99 " + check(ours.p99 / base.p99, "≤", 1.5, key: "roundTripPinnedP99")
                   : roundTripRatios(ours, base))
        if pinned {
            // The target's client sleeps in read(2), and on one CPU the server's take of each
            // answered call wakes it for nothing (README, tenth round); the libraries' clients
            // poll first. For the record, not a target.
            let (polling, pollingBase) = try roundTrips(daemon.socketPath, against: echoPath, count: pairs, pollsFirst: true)
            results["roundTripPinnedPollingClient"] = roundTripJSON(polling, pollingBase)
            row("the same, a client polling before it reads, as the libraries do (µs)", "\(polling)", "echo \(pollingBase)",
                roundTripRatios(polling, pollingBase))
        }
    }
    var throughputs: [String: JSON] = [:]
    for clients in [1, 16, 64, 256] {
        let (ours, base) = try throughput(daemon.socketPath, against: echoPath, clients: clients, seconds: throughputSeconds)
        throughputs["\(clients)"] = .object(["bgtaskd": .double(ours), "echo": .double(base), "ratio": .double(ours / base)])
        row("throughput, \(clients) client\(clients == 1 ? "" : "s") (Begin+End pairs/s)", format(ours, 0), "echo \(format(base, 0))",
            clients == 64 ? check(ours / base, "≥", 0.9, key: "throughput64") : "×\(format(ours / base, 2))")
    }
    results["throughput"] = .object(throughputs)
    daemon.stop()
}

// MARK: Idle

if sections.contains("idle") {
    let idleDaemon = try BenchDaemon([])
    let ticksBefore = idleDaemon.child.cpuTicks
    Thread.sleep(forTimeInterval: idleSeconds)  // the measurement itself: time with nothing to do
    let idleTicks = idleDaemon.child.cpuTicks - ticksBefore
    row("idle CPU over \(format(idleSeconds, 0))s (clock ticks)", "\(idleTicks)", "", check(Double(idleTicks), "≤", 0, key: "idleTicks", ratio: false))
    // Processes started elsewhere on the machine, one after the other, while the daemon
    // follows no app: the kernel's events for them reach it only while it follows a
    // process app (until the twenty-third round each one's fork, exec and exit woke it).
    let elsewhere = quick ? 100 : 500
    func startedElsewhere() throws -> (wakeups: Int, cpuMicroseconds: Double) {
        let switchesBefore = idleDaemon.child.contextSwitches, cpuBefore = idleDaemon.child.cpuNanoseconds
        for _ in 0..<elsewhere { _ = try Subprocess.wait(pid: try Child(["/bin/true"]).pid) }
        return (idleDaemon.child.contextSwitches - switchesBefore, Double(idleDaemon.child.cpuNanoseconds - cpuBefore) / 1e3)
    }
    let (elsewhereWakeups, elsewhereCPU) = try startedElsewhere()
    // The same while one process app is followed: the kernel's events for every process
    // started reach it then (until the thirtieth round each one's fork and exit woke it, ~40
    // µs of its CPU; now a read leaves the connector unwatched for 50 ms).
    let followed = try BenchApps(socket: idleDaemon.socketPath)
    defer { followed.end() }
    _ = try followed.spawn(1, tasks: 1, mode: "hold")
    let (followingWakeups, followingCPU) = try startedElsewhere()
    results["idle"] = .object(["seconds": .double(idleSeconds), "cpuTicks": .int(Int64(idleTicks)),
                               "processesElsewhere": .int(Int64(elsewhere)), "processesElsewhereWakeups": .int(Int64(elsewhereWakeups)),
                               "processesElsewhereCPUMicroseconds": .double(elsewhereCPU),
                               "processesElsewhereFollowingWakeups": .int(Int64(followingWakeups)),
                               "processesElsewhereFollowingCPUMicroseconds": .double(followingCPU)])
    row("idle, \(elsewhere) processes started elsewhere: wake-ups", "\(elsewhereWakeups) (\(format(elsewhereCPU, 0)) µs CPU)", "", "")
    row("the same, one process app followed: wake-ups", "\(followingWakeups) (\(format(followingCPU, 0)) µs CPU)", "", "")
    idleDaemon.stop()
}

// MARK: Scheduled requests: 1,000 pending from 100 apps cost memory, and no wake-up
if sections.contains("requests") {
    // Its apps walked, not followed: with a followed app, every process started elsewhere on
    // the machine reaches the daemon (the idle section's last row), and a shared machine's
    // own starts came into this window (3 wake-ups in 1 of 8 runs, each a read of the
    // process-events connector; strace).
    let daemon = try BenchDaemon([], followingForks: false)
    let fleet = try BenchApps(socket: daemon.socketPath)
    _ = try fleet.spawn(100, tasks: 0)  // registered first: the requests' memory alone below
    let before = daemon.child.residentBytes
    // 100 apps: copies of the bench app (a small C binary), each its own app key (its
    // executable's path).
    let links = (0..<100).map { daemon.directory + "/bench-app-\($0)" }
    for link in links { try FileManager.default.copyItem(atPath: binaryDirectory + "/bgtask-bench-app", toPath: link) }
    let requesters = try BenchApps(socket: daemon.socketPath)
    _ = try requesters.spawn(100, tasks: 0, mode: "requests", executables: links)
    let after = daemon.child.residentBytes
    let pending = try VarlinkConnection(path: daemon.socketPath).call(.manager(.listTaskRequests))["requests"]?.arrayValue?.count ?? 0
    let perRequest = Double(after - before) / Double(max(1, pending))  // 100 apps' records too: an upper bound
    Thread.sleep(forTimeInterval: 0.5)  // the submissions' last state writes settle
    let ticksBefore = daemon.child.cpuTicks, switchesBefore = daemon.child.contextSwitches
    Thread.sleep(forTimeInterval: idleSeconds)  // the measurement itself: time with nothing due
    let ticks = daemon.child.cpuTicks - ticksBefore, wakeups = daemon.child.contextSwitches - switchesBefore
    results["requests"] = .object(["pending": .int(Int64(pending)), "bytesPerRequest": .double(perRequest),
                                   "idleSeconds": .double(idleSeconds), "cpuTicks": .int(Int64(ticks)),
                                   "wakeups": .int(Int64(wakeups))])
    row("\(pending) pending requests of 100 apps: memory each", "\(Int(perRequest)) bytes", "with the apps' own records", "")
    row("idle wake-ups with them over \(format(idleSeconds, 0))s", "\(wakeups) (\(ticks) clock ticks)", "",
        check(Double(wakeups), "≤", 0, key: "requestsIdleWakeups", ratio: false))
    requesters.end()
    fleet.end()
    daemon.stop()
}

if sections.contains("scale") { try scaleSection(apps: apps, tasksPerApp: tasksPerApp, quick: quick, echoPath: echoPath) }
echo.stop()
if sections.contains("bursts") { try bursts(count: apps) }
if sections.contains("freezer") { try freezerBursts(count: apps) }
if sections.contains("fairness") { try fairness() }
if sections.contains("logind") { try logindComparison(pairs: pairs) }
if sections.contains("instructions") { try instructionCounts() }

// MARK: Report

var machine = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
    .split(separator: "\n").first { $0.hasPrefix("model name") }.map { String($0.split(separator: ":")[1]).trimmingCharacters(in: .whitespaces) } ?? "?"
let kernel = (try? String(contentsOfFile: "/proc/sys/kernel/osrelease", encoding: .utf8))?
    .trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
machine += ", \(onlineCPUs.count) CPUs, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB, Linux \(kernel)"
results["machine"] = .string(machine)
results["targets"] = .array(targets)
results["table"] = .array(table.map { .array([.string($0.0), .string($0.1), .string($0.2), .string($0.3)]) })
let missed = targets.filter { $0["pass"]?.boolValue == false }.compactMap { $0["measure"]?.stringValue }
say("targets: \(targets.count - missed.count) of \(targets.count) met" + (missed.isEmpty ? "" : "; missed: " + missed.joined(separator: ", ")))
say("\nmachine: \(machine)")
print("| measure | bgtaskd | baseline | ratio / target |")
print("| --- | --- | --- | --- |")
for (name, value, baseline, ratio) in table { print("| \(name) | \(value) | \(baseline) | \(ratio) |") }
if let jsonPath {
    try Data(JSON.object(results).serialized.utf8).write(to: URL(fileURLWithPath: jsonPath))
}
