// SPDX-License-Identifier: Apache-2.0
// Bursts: 10,000 apps sent to the background at once, and 10,000 deadlines falling together,
// each against a C loop signalling the same processes through pidfds, in the same run (the
// background burst and the loop in three rounds in turns, medians reported).
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

/// The moments children stop or continue, from `waitid(P_PID, WSTOPPED | WCONTINUED)`:
/// when the kernel has stopped an app, without reading /proc. The benchmark is every app's
/// parent. (Not `P_ALL`: the kernel walks every child for each call, which for 10,000
/// children cost more than the stopping measured.)
enum ChildEvents {
    /// Waits until every one of `pids` has stopped (`continued`: continued); returns when
    /// each was seen to. Sweeps the ones still running (each look is O(1) in the kernel),
    /// resting after a sweep that found nothing as long as the sweep took (100 µs at least,
    /// 1 ms at most): 10,000 looks take milliseconds, and sweeping without a rest would take
    /// one of the machine's two CPUs from the daemon and the apps measured. The time of the
    /// last stop is known to within the last sweeps' rest, when few are left. `notBefore`:
    /// nothing measured happens before that instant, so the
    /// sweeps start then (a stop before it is stamped at the first sweep: only the last stop
    /// is measured).
    static func await(_ pids: [Int32], continued: Bool = false, notBefore: Int64 = 0, seconds: Double = 60) -> [Int32: Int64] {
        var seen: [Int32: Int64] = [:]
        var pending = pids
        let code = continued ? Int32(CLD_CONTINUED) : Int32(CLD_STOPPED)
        sleepUntil(notBefore)
        let giveUp = now() + Int64(seconds * 1e9)
        while !pending.isEmpty {
            let sweep = now()
            var still: [Int32] = []
            still.reserveCapacity(pending.count)
            for pid in pending {
                var info = siginfo_t()
                if waitid(P_PID, id_t(pid), &info, (continued ? WCONTINUED : WSTOPPED) | WNOHANG) == 0,
                   info._sifields._sigchld.si_pid == pid, info.si_code == code {
                    seen[pid] = now()
                } else {
                    still.append(pid)
                }
            }
            if still.count == pending.count {
                if now() > giveUp {
                    say("bench: \(pending.count) of \(pids.count) apps not \(continued ? "continued" : "stopped") within \(seconds)s")
                    for pid in pids where pid > 1 {  // the apps are ours, unreaped: their pids are theirs
                        if let pidfd = try? Pidfd.open(pid: pid) { try? pidfd.send(signal: SIGKILL) }
                    }
                    exit(1)
                }
                sleepUntil(now() + min(max(now() - sweep, 100_000), 1_000_000))  // nothing new: let the daemon and the apps run
            }
            pending = still
        }
        return seen
    }
}

/// Calls sent down one connection without waiting for replies, which another thread reads
/// (and timestamps) as they come: what a manager does when a session locks.
struct Pipeline {
    /// When the first byte was written.
    var start: Int64 = 0
    /// When each reply arrived, in call order.
    var replies: [Int64] = []
    var errors = 0

    init(_ path: String, _ frames: [[UInt8]]) throws {
        let socket = try UnixSocket.connect(path: path)
        let arrivals = Locked<(times: [Int64], errors: Int)>(([], 0))
        let finished = DispatchSemaphore(value: 0)
        let expected = frames.count
        let reader = Thread {
            var framer = VarlinkFramer(maximumMessageBytes: 1 << 20)
            var times: [Int64] = []
            var errors = 0
            times.reserveCapacity(expected)
            while times.count < expected, let bytes = try? socket.read(upTo: 1 << 16), !bytes.isEmpty {
                let received = now()
                framer.append(bytes)
                while let message = try? framer.next() {
                    times.append(received)
                    if message.starts(with: Array("{\"error\"".utf8)) { errors += 1 }
                }
            }
            arrivals.withLock { $0 = (times, errors) }
            finished.signal()
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(frames.reduce(0) { $0 + $1.count })
        for frame in frames { bytes += frame }
        reader.start()
        start = now()
        try socket.writeAll(bytes)
        finished.wait()
        (replies, errors) = arrivals.withLock { $0 }
        if replies.count < expected { throw ClientError(.protocolError, "pipeline: \(replies.count) of \(expected) replies") }
    }
}

/// A baseline: `bgtask-bench-app MODE… FILE` opens what each line of FILE names
/// beforehand, says it is ready, then (timed from the go byte) acts on each in a plain C loop.
@MainActor func baselineLoop(_ mode: [String], _ lines: [String]) throws -> (start: Int64, process: Child) {
    let directory = try makeTemporaryDirectory(NSTemporaryDirectory() + "bgtaskd-bench-baseline")
    let file = directory + "/targets"
    try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let (goRead, goWrite) = try Subprocess.pipe()
    let (readyRead, readyWrite) = try Subprocess.pipe()
    let child = try Child([binaryDirectory + "/bgtask-bench-app"] + mode + [file],
                          stdin: .descriptor(goRead.rawValue), stdout: .descriptor(readyWrite.rawValue))
    goRead.close()
    readyWrite.close()
    guard try readyRead.waitReadable(timeoutMilliseconds: 30_000), !(try readyRead.read(upTo: 16)).isEmpty else {
        throw ClientError(.timedOut, "the baseline loop (\(mode.joined(separator: " "))) did not get ready")
    }
    let start = now()
    try goWrite.writeAll([1])
    return (start, child)
}

/// The signal baseline: a pidfd per pid, `signal` sent through each.
@MainActor func signalLoop(_ pids: [Int32], signal: Int32) throws -> (start: Int64, process: Child) {
    try baselineLoop(["--signal", String(signal)], pids.map(String.init))
}

func frames(_ method: String, _ pids: [Int32], _ parameters: [String: JSON]) -> [[UInt8]] {
    pids.map { pid in
        var all = parameters
        all["pid"] = .int(Int64(pid))
        return VarlinkCall(method: "io.bgtaskd.Manager.\(method)", parameters: all).json.varlinkFrame
    }
}

/// The deadline burst's floor: `count` "hold" apps held by `bgtask-bench-app
/// --deadline-floor`, a daemon that costs only its system calls (an "expiring" write to each
/// stream and, a slice of 16 at a time, their events to a monitor; then for each app that
/// ends its task a close and a SIGSTOP through its pidfd): milliseconds from its go to the
/// last app stopped, and the first 100 warnings' arrival at the monitor from the go. What a
/// daemon with no work of its own between those system calls would take, on this machine,
/// in this run.
@MainActor func deadlineFloor(_ count: Int) throws -> (milliseconds: Double, firstWarnings: Summary) {
    let directory = try makeTemporaryDirectory(NSTemporaryDirectory() + "bgtaskd-bench-floor")
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = directory + "/floor"
    let (goRead, goWrite) = try Subprocess.pipe()
    let (readyRead, readyWrite) = try Subprocess.pipe()
    let server = try Child([binaryDirectory + "/bgtask-bench-app", "--deadline-floor", path, String(count)],
                           stdin: .descriptor(goRead.rawValue), stdout: .descriptor(readyWrite.rawValue))
    defer { server.stop() }
    goRead.close()
    readyWrite.close()
    let listening = now() + 10_000_000_000
    while !FileManager.default.fileExists(atPath: path) {
        guard now() < listening else { throw ClientError(.timedOut, "the deadline floor did not listen") }
        sleepUntil(now() + 1_000_000)  // until the floor's socket exists
    }
    let apps = try BenchApps(socket: path)
    defer { apps.end() }
    let pids = try apps.spawn(count, tasks: 0, mode: "hold")
    let monitor = try MonitorRecorder(path)
    defer { monitor.stop() }
    guard try readyRead.waitReadable(timeoutMilliseconds: 30_000), !(try readyRead.read(upTo: 16)).isEmpty else {
        throw ClientError(.timedOut, "the deadline floor did not get ready")
    }
    let start = now()
    try goWrite.writeAll([1])
    let stops = ChildEvents.await(pids)
    let warned = monitor.events().filter { $0.0 == "task:expiring" }.map { Double($0.2 - start) / 1e6 }.sorted()
    return (Double(stops.values.max()! - start) / 1e6, Summary(Array(warned.prefix(100))))
}

/// The two bursts, on one population of apps that each hold a task on a stream and end it
/// when it expires (the C app's "hold" mode).
@MainActor func bursts(count requested: Int) throws {
    // Each app keeps a connection, and the daemon a pidfd for it: two descriptors per app,
    // under the hard RLIMIT_NOFILE that only CAP_SYS_RESOURCE can raise (20,000 on these
    // machines, so 9,872 apps at most here).
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    let count = min(requested, (Int(clamping: limit.rlim_max) - 256) / 2)
    if count < requested { say("bursts: \(count) apps, not \(requested): the descriptor limit is \(limit.rlim_max)") }
    let (floorMs, floorFirstLateness) = try deadlineFloor(count)
    // Warned 4 s after the burst, with 6 s left to end their tasks: every app ends its task
    // before its deadline even when the daemon takes seconds for 10,000 of them.
    let budget: Int64 = 10_000_000_000, warning: Int64 = 6_000_000_000
    let daemon = try BenchDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "BackgroundTimeSec=10s", "ExpirationWarningSec=6s",
                                  "TransitionTimeoutSec=1h", "TaskAgeWarningSec=1h", "MaxApps=100000", "SuspendMode=signal",
                                  "MaxConnectionsPerUser=16384"])
    let apps = try BenchApps(socket: daemon.socketPath)
    // The daemon goes first (stopping, it resumes every app it suspended), then the apps.
    defer {
        daemon.stop()
        apps.end()
    }
    let pids = try apps.spawn(count, tasks: 0, mode: "hold")
    let monitor = try MonitorRecorder(daemon.socketPath)
    // Registering 10,000 apps leaves the daemon work (grants, process events) for a moment
    // after the last app reported in: the bursts start from an idle daemon.
    _ = try daemon.manager("GetStatus")
    Thread.sleep(forTimeInterval: 0.5)

    // 1. Deadlines falling together: every app backgrounded in one burst, so their
    // warnings come due within the burst's span; each app ends its task when warned and is
    // suspended at once.
    let background = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "background"]))
    // The first warnings are measured in the first milliseconds after they fall due, the last
    // stop hundreds later: the sweeps (a CPU's worth while thousands are left) start after
    // the first warnings went out, not beside them.
    sleepUntil(background.start + budget - warning - 10_000_000)
    let deadlineCPUBefore = daemon.child.cpuNanoseconds, deadlineFaultsBefore = daemon.child.minorFaults
    let deadlineNoiseBefore = MachineNoise.nanoseconds
    let stops = ChildEvents.await(pids, notBefore: background.start + budget - warning + 20_000_000)
    let deadlineNoise = MachineNoise.milliseconds(since: deadlineNoiseBefore)
    let deadlineCPUPerApp = Double(daemon.child.cpuNanoseconds - deadlineCPUBefore) / 1e3 / Double(count)
    // The daemon handles a pipelined burst a batch per pass, every call of a batch at the
    // pass's instant; the first batch (a few hundred calls) at the instant it read the first
    // call, which is no earlier than when it was sent. So the first 100 warnings are due at
    // that instant + budget − warning, and measuring from the send over-states their lateness
    // by the daemon's wake-up, never under-states it. The last warning is due no later than
    // the last reply's arrival + budget − warning.
    let firstDue = background.start + budget - warning
    let lastDue = background.replies.max()! + budget - warning
    let warned = monitor.events().filter { $0.0 == "task:expiring" }
    var warnedAt: [Int32: Int64] = [:]
    for (_, pid, received) in warned where warnedAt[Int32(pid)] == nil { warnedAt[Int32(pid)] = received }
    let firstLateness = Summary(pids.prefix(100).compactMap { pid in warnedAt[pid].map { Double($0 - firstDue) / 1e6 } })
    // Every app's warning, from its reply's arrival + budget − warning: its call was handled
    // no later than that, so this under-states each lateness by at most its batch's time.
    let allLateness = Summary(pids.indices.compactMap { index in
        warnedAt[pids[index]].map { Double($0 - background.replies[index] - (budget - warning)) / 1e6 }
    })
    let lastStop = stops.values.max()!
    if ProcessInfo.processInfo.environment["BENCH_DEBUG"] != nil {
        let times = warned.map { Double($0.2 - firstDue) / 1e6 }.sorted()
        say("debug: window \(firstDue) \(lastStop) ns (monotonic), \(daemon.child.minorFaults - deadlineFaultsBefore) minor faults")
        say("debug: first reply +\(Double(background.replies.min()! - background.start) / 1e6) ms; warnings \(times.count), first +\(times.first ?? -1), 100th +\(times.count > 99 ? times[99] : -1), last +\(times.last ?? -1)")
        let events = monitor.events()
        say("debug: events \(events.count): " + Dictionary(grouping: events, by: { $0.0 }).map { "\($0.key)=\($0.value.count)" }.joined(separator: " "))
    }
    monitor.stop()

    // 2. Back to the foreground in one burst.
    let foreground = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
    let continues = ChildEvents.await(pids, continued: true)

    // 3. Rounds in turns, as the freezer bursts take them (a burst lasts a few hundred ms,
    // and a spell of other work on this machine falls on one side of a single pair as often
    // as not): the C loop stops and continues every app, then the daemon, idle now, sends
    // them all to the background in one burst (each suspended at once) and back.
    var rounds: [BurstRound] = []
    for _ in 0..<signalRounds {
        var round = BurstRound(baselines: ("Stop", "Continue"))
        MachineNoise.awaitQuiet()
        let baselineNoiseBefore = MachineNoise.nanoseconds
        let stopLoop = try signalLoop(pids, signal: SIGSTOP)
        let baselineStops = ChildEvents.await(pids)
        round.baselineNoise = MachineNoise.milliseconds(since: baselineNoiseBefore)
        stopLoop.process.stop()
        MachineNoise.awaitQuiet()
        let continueLoop = try signalLoop(pids, signal: SIGCONT)
        let baselineContinues = ChildEvents.await(pids, continued: true)
        continueLoop.process.stop()
        round.baseline = Double(baselineStops.values.max()! - stopLoop.start) / 1e6
        round.baselineBack = Double(baselineContinues.values.max()! - continueLoop.start) / 1e6

        MachineNoise.awaitQuiet()
        let cpuBefore = daemon.child.cpuNanoseconds, faultsBefore = daemon.child.minorFaults, noiseBefore = MachineNoise.nanoseconds
        let second = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "background"]))
        let burstStops = ChildEvents.await(pids)
        round.noise = MachineNoise.milliseconds(since: noiseBefore)
        round.cpuPerApp = Double(daemon.child.cpuNanoseconds - cpuBefore) / 1e3 / Double(count)
        if ProcessInfo.processInfo.environment["BENCH_DEBUG"] != nil {
            say("debug: background window \(second.start) \(burstStops.values.max()!) ns (monotonic), \(daemon.child.minorFaults - faultsBefore) minor faults")
        }
        MachineNoise.awaitQuiet()
        let resumed = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
        let burstContinues = ChildEvents.await(pids, continued: true)
        round.background = Double(burstStops.values.max()! - second.start) / 1e6
        round.foreground = Double(burstContinues.values.max()! - resumed.start) / 1e6
        round.errors = second.errors + resumed.errors
        rounds.append(round)
    }
    let backgroundMs = median(rounds.map(\.background)), foregroundMs = median(rounds.map(\.foreground))
    let baselineStop = median(rounds.map(\.baseline)), baselineContinue = median(rounds.map(\.baselineBack))
    let ratio = median(rounds.map(\.ratio)), continueRatio = median(rounds.map { $0.foreground / $0.baselineBack })
    let cpuPerApp = median(rounds.map(\.cpuPerApp))

    let deadlineMs = Double(lastStop - firstDue) / 1e6
    let spreadMs = Double(lastDue - firstDue) / 1e6
    let resumeMs = Double(continues.values.max()! - foreground.start) / 1e6
    let errors = background.errors + foreground.errors + rounds.map(\.errors).reduce(0, +)
    if errors > 0 { say("bench: \(errors) SetAppState calls of the bursts failed") }
    results["bursts"] = .object([
        "apps": .int(Int64(count)), "baselineStopMilliseconds": .double(baselineStop),
        "baselineContinueMilliseconds": .double(baselineContinue),
        "backgroundMilliseconds": .double(backgroundMs), "foregroundMilliseconds": .double(foregroundMs),
        "deadlinesMilliseconds": .double(deadlineMs), "deadlineSpreadMilliseconds": .double(spreadMs),
        "resumeAfterDeadlinesMilliseconds": .double(resumeMs), "deadlineFloorMilliseconds": .double(floorMs),
        "deadlineDaemonCPUMicrosecondsPerApp": .double(deadlineCPUPerApp), "deadlineKdamondMilliseconds": .double(deadlineNoise),
        "firstWarningsLatenessMilliseconds": firstLateness.json, "floorFirstWarningsLatenessMilliseconds": floorFirstLateness.json,
        "warningsLatenessMilliseconds": allLateness.json,
        "daemonCPUMicrosecondsPerApp": .double(cpuPerApp), "ratio": .double(ratio),
        "rounds": .array(rounds.map(\.json)),
        "errors": .int(Int64(errors)),
    ])
    let each = rounds.map { "×" + format($0.ratio, 2) }.joined(separator: ", ")
    row("burst: \(count) apps backgrounded, last stopped (ms, median of \(rounds.count) rounds in turns)", format(backgroundMs, 1),
        "C SIGSTOP loop \(format(baselineStop, 1))",
        check(ratio, "≤", 3, key: "burstBackground") + " (median of the rounds' ratios: \(each); \(BurstRound.noiseSummary(rounds)))")
    row("daemon CPU per app backgrounded, until the last stopped (µs, median)", format(cpuPerApp, 1), "", "")
    row("burst: \(count) apps foregrounded, last continued (ms, median)", format(foregroundMs, 1), "C SIGCONT loop \(format(baselineContinue, 1))",
        "×\(format(continueRatio, 2))")
    row("burst: \(count) deadlines, first due to last stopped (ms)", format(deadlineMs, 1),
        "C SIGSTOP loop \(format(baselineStop, 1)) (median)", check(deadlineMs / baselineStop, "≤", 3, key: "burstDeadlines")
            + " (due over \(format(spreadMs, 1)) ms; kdamond ran \(format(deadlineNoise, 0)) ms meanwhile)")
    row("daemon CPU per app warned, ended and stopped (µs)", format(deadlineCPUPerApp, 1), "", "")
    row("burst: the same deadlines, a zero-cost daemon (ms)", format(floorMs, 1), "C SIGSTOP loop \(format(baselineStop, 1))",
        "×\(format(floorMs / baselineStop, 2)); bgtaskd ×\(format(deadlineMs / floorMs, 2)) of it")
    row("burst: lateness of the first 100 warnings, from the send (ms)", "\(firstLateness)", "n=\(firstLateness.count)",
        check(firstLateness.p99, "<", 2, key: "burstWarningLateness", ratio: false))
    row("the same first 100 warnings, a zero-cost daemon, from its go (ms)", "\(floorFirstLateness)", "n=\(floorFirstLateness.count)",
        "p99: bgtaskd ×\(format(firstLateness.p99 / floorFirstLateness.p99, 2)) of it")
    row("burst: every warning's lateness, from its reply + due (ms)", "\(allLateness)", "n=\(allLateness.count)", "")
}

let signalRounds = 3
