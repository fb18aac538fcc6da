// SPDX-License-Identifier: Apache-2.0
// Freezer bursts: the same number of apps, each a unit app of its own (a `.scope` cgroup
// under a slice the benchmark makes), `SuspendMode=freezer`; backgrounded in one burst
// against a C loop writing their `cgroup.freeze` files, in the same run: three rounds in
// turns (a daemon of its own, then the loop), the median of their ratios. Needs root and
// cgroup v2 (else skipped, saying why).
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

/// When cgroups report `frozen 1` (or 0) in `cgroup.events`: each held open and in one epoll
/// set (`EPOLLPRI`: kernfs reports every change of the file after its last read), read from
/// the start when it reports, the time of each `frozen` seen stamped then. The same watcher
/// for bgtaskd and for the baseline. (It swept every file not yet there, resting only after
/// a sweep that found nothing: a CPU of the machine's two in the daemon's burst, whose
/// freezes come over half a second, taken from the daemon and the apps measured; and each
/// freeze seen within a sweep of the files, milliseconds when thousands are left.)
final class FreezerEvents {
    let events: [FileDescriptor]
    private let loop: EventLoop
    private var sources: [EventSource] = []
    /// The current wait's: the text looked for, which files have not shown it, how many, and
    /// when the last did.
    private var wanted: [UInt8] = []
    private var pending: [Bool] = []
    private var left = 0
    private var last: Int64 = 0
    private var buffer = [UInt8](repeating: 0, count: 256)

    init(_ directories: [String]) throws {
        events = try directories.map { directory in
            let fd = open(directory + "/cgroup.events", O_RDONLY | O_CLOEXEC)
            if fd < 0 { throw Errno.current("open \(directory)/cgroup.events") }
            return FileDescriptor(fd)
        }
        loop = try EventLoop()
        for index in events.indices {
            sources.append(try loop.addIO(events[index].rawValue, events: IOEvents.priority) { [unowned self] _ in look(index) })
        }
    }

    deinit {
        sources.removeAll()  // out of the loop before the files close
    }

    /// Reads the file from the start (which also acknowledges its report); stamps the
    /// first time it shows what is waited for.
    private func look(_ index: Int) {
        let n = buffer.withUnsafeMutableBytes { pread(events[index].rawValue, $0.baseAddress, $0.count, 0) }
        guard !pending.isEmpty, pending[index], n > 0, buffer[..<n].firstRange(of: wanted) != nil else { return }
        pending[index] = false
        left -= 1
        last = now()
    }

    /// Waits until every cgroup is frozen (or thawed); returns when the last was seen to.
    /// Each file is read once first (what changed before the wait, or reported to nobody
    /// since the last, is there), then whenever it reports.
    func await(frozen: Bool, seconds: Double = 60) throws -> Int64 {
        wanted = Array((frozen ? "frozen 1" : "frozen 0").utf8)
        pending = [Bool](repeating: true, count: events.count)
        left = events.count
        last = 0
        defer { pending = [] }
        for index in events.indices { look(index) }
        let giveUp = now() + Int64(seconds * 1e9)
        while left > 0 {
            let remaining = (giveUp - now()) / 1_000_000
            if remaining <= 0 {
                throw ClientError(.timedOut, "\(left) of \(events.count) cgroups not \(frozen ? "frozen" : "thawed") within \(seconds)s")
            }
            try loop.runOnce(timeoutMilliseconds: Int(remaining))
        }
        return last
    }
}

/// The freezer baseline: every `cgroup.freeze` opened, then written `1` (or `0`).
/// `opening`: each file opened, written and closed in the timed loop (the floor for a daemon
/// that cannot keep a descriptor per app open).
@MainActor func freezeLoop(_ directories: [String], frozen: Bool, opening: Bool = false) throws -> (start: Int64, process: Child) {
    try baselineLoop([opening ? "--freeze-opening" : "--freeze", frozen ? "1" : "0"], directories)
}

/// One round of the freezer bursts, its own daemon's and the C loop's, one after the other.
/// One round of a burst bench in turns: the daemon's burst to the background and back, and
/// the C loop's over the same apps (`baseline`, `baselineBack`), in milliseconds; `names`
/// are the baselines' JSON keys (what the loop did: stop/continue, freeze/thaw).
struct BurstRound {
    let names: (String, String)
    var background = 0.0, foreground = 0.0, baseline = 0.0, baselineBack = 0.0
    var cpuPerApp = 0.0
    /// Milliseconds the kernel's DAMON threads ran during the daemon's burst and during the
    /// C loop's (`MachineNoise`).
    var noise = 0.0, baselineNoise = 0.0
    var errors = 0
    init(baselines names: (String, String)) { self.names = names }
    var ratio: Double { background / baseline }
    var json: JSON {
        .object(["backgroundMilliseconds": .double(background), "foregroundMilliseconds": .double(foreground),
                 "baseline\(names.0)Milliseconds": .double(baseline), "baseline\(names.1)Milliseconds": .double(baselineBack),
                 "daemonCPUMicrosecondsPerApp": .double(cpuPerApp), "ratio": .double(ratio),
                 "kdamondMilliseconds": .double(noise), "baselineKdamondMilliseconds": .double(baselineNoise)])
    }

    /// What the kernel's DAMON threads took in each round, for the burst's row: "kdamond ran
    /// 180/2, 0/0, 95/11 ms (bgtaskd's burst/the C loop's)".
    static func noiseSummary(_ rounds: [BurstRound]) -> String {
        "kdamond ran " + rounds.map { format($0.noise, 0) + "/" + format($0.baselineNoise, 0) }.joined(separator: ", ")
            + " ms (bgtaskd's burst/the C loop's)"
    }
}

/// The middle value of an odd count (`Summary`'s p50).
func median(_ values: [Double]) -> Double { Summary(values).p50 }

/// The daemon's settings for the freezer bursts.
let freezerSettings = ["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "BackgroundTimeSec=1h", "TransitionTimeoutSec=1h",
                       "TaskAgeWarningSec=1h", "MaxApps=100000", "SuspendMode=freezer", "MaxConnectionsPerUser=16384"]

/// A round: `daemon` (fresh, knowing none of the apps) registers every app (its manager's
/// first SetAppState), then backgrounds them in one burst and foregrounds them in another;
/// stopped, it leaves the same cgroups to the C loop, which freezes and thaws them.
@MainActor func freezerRound(_ daemon: BenchDaemon, pids: [Int32], directories: [String],
                             watched: FreezerEvents) throws -> BurstRound {
    defer { daemon.stop() }  // thaws what it froze
    let count = pids.count
    var round = BurstRound(baselines: ("Freeze", "Thaw"))
    _ = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
    _ = try daemon.manager("GetStatus")
    Thread.sleep(forTimeInterval: 0.5)

    MachineNoise.awaitQuiet()
    let cpuBefore = daemon.child.cpuNanoseconds, faultsBefore = daemon.child.minorFaults, noiseBefore = MachineNoise.nanoseconds
    let background = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "background"]))
    let frozenAt = try watched.await(frozen: true)
    round.noise = MachineNoise.milliseconds(since: noiseBefore)
    round.cpuPerApp = Double(daemon.child.cpuNanoseconds - cpuBefore) / 1e3 / Double(count)
    if ProcessInfo.processInfo.environment["BENCH_DEBUG"] != nil {
        say("debug: freeze window \(background.start) \(frozenAt) ns (monotonic), \(daemon.child.minorFaults - faultsBefore) minor faults")
    }
    MachineNoise.awaitQuiet()
    let foreground = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
    let thawedAt = try watched.await(frozen: false)
    // Stopped before the baselines: the daemon watches its unit apps' cgroup.events, and
    // would wake for every freeze the C loop makes (a read each), taking CPU from the loop.
    daemon.stop()
    MachineNoise.awaitQuiet()
    let baselineNoiseBefore = MachineNoise.nanoseconds
    let freeze = try freezeLoop(directories, frozen: true)
    let baselineFrozenAt = try watched.await(frozen: true)
    round.baselineNoise = MachineNoise.milliseconds(since: baselineNoiseBefore)
    freeze.process.stop()
    MachineNoise.awaitQuiet()
    let thaw = try freezeLoop(directories, frozen: false)
    let baselineThawedAt = try watched.await(frozen: false)
    thaw.process.stop()

    round.background = Double(frozenAt - background.start) / 1e6
    round.foreground = Double(thawedAt - foreground.start) / 1e6
    round.baseline = Double(baselineFrozenAt - freeze.start) / 1e6
    round.baselineBack = Double(baselineThawedAt - thaw.start) / 1e6
    round.errors = background.errors + foreground.errors
    return round
}

@MainActor func freezerBursts(count requested: Int) throws {
    guard getuid() == 0, let root = Cgroup.mountPoint else {
        say("freezer bursts skipped: they need root and cgroup v2")
        results["freezerBursts"] = .object(["skipped": .string("needs root and cgroup v2")])
        return
    }
    // The daemon holds three descriptors per unit app (its pidfd, its cgroup.events and its
    // cgroup.freeze), and leaves the last 1,024 below its limit free of held files (the
    // daemon's `Enforcer.spareDescriptors`): under a hard limit of 20,000 that only
    // CAP_SYS_RESOURCE raises, 6,240 apps, each frozen through its held file.
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    let hard = Int(clamping: limit.rlim_max)
    let count = min(requested, (hard - min(1024, max(64, hard / 16)) - 256) / 3)
    if count < requested { say("freezer bursts: \(count) apps, not \(requested): the descriptor limit is \(hard)") }
    let slice = root + "/bgtaskd-bench-\(getpid()).slice"
    guard mkdir(slice, 0o755) == 0 else { throw Errno.current("mkdir \(slice)") }
    let directories = (0..<count).map { slice + "/app-bench-\($0).scope" }
    var made: [String] = []
    defer {
        for directory in made.reversed() { rmdir(directory) }
        rmdir(slice)
    }
    for directory in directories {
        guard mkdir(directory, 0o755) == 0 else { throw Errno.current("mkdir \(directory)") }
        made.append(directory)
    }
    // The apps report in to a daemon of their own (a connection each, closed at once), so
    // that every round's daemon starts knowing nothing of them.
    let spawning = try BenchDaemon(freezerSettings)
    let apps = try BenchApps(socket: spawning.socketPath)
    defer { apps.end() }
    let pids: [Int32]
    do {
        defer { spawning.stop() }
        pids = try apps.spawn(count, tasks: 0, cgroups: directories)
    }
    let watched = try FreezerEvents(directories)
    // Rounds in turns, each a daemon of its own and then the C loop: a burst lasts half a
    // second, and this machine's spells of other work (a kernel thread taking a quarter of
    // its CPU time for a while, `perf`) fall on one side of a single pair as often as not.
    var rounds: [BurstRound] = []
    for _ in 0..<freezerRounds {
        let daemon = try BenchDaemon(freezerSettings)
        rounds.append(try freezerRound(daemon, pids: pids, directories: directories, watched: watched))
    }
    MachineNoise.awaitQuiet()
    let opening = try freezeLoop(directories, frozen: true, opening: true)
    let openingFrozenAt = try watched.await(frozen: true)
    opening.process.stop()
    let unfreeze = try freezeLoop(directories, frozen: false)
    _ = try watched.await(frozen: false)
    unfreeze.process.stop()

    let backgroundMs = median(rounds.map(\.background)), foregroundMs = median(rounds.map(\.foreground))
    let baselineFreeze = median(rounds.map(\.baseline)), baselineThaw = median(rounds.map(\.baselineBack))
    let ratio = median(rounds.map(\.ratio)), thawRatio = median(rounds.map { $0.foreground / $0.baselineBack })
    let cpuPerApp = median(rounds.map(\.cpuPerApp))
    let openingFreeze = Double(openingFrozenAt - opening.start) / 1e6
    let errors = rounds.map(\.errors).reduce(0, +)
    if errors > 0 { say("bench: \(errors) SetAppState calls of the freezer bursts failed") }
    results["freezerBursts"] = .object([
        "apps": .int(Int64(count)), "backgroundMilliseconds": .double(backgroundMs),
        "foregroundMilliseconds": .double(foregroundMs), "baselineFreezeMilliseconds": .double(baselineFreeze),
        "baselineThawMilliseconds": .double(baselineThaw), "openingLoopFreezeMilliseconds": .double(openingFreeze),
        "ratio": .double(ratio), "daemonCPUMicrosecondsPerApp": .double(cpuPerApp),
        "rounds": .array(rounds.map(\.json)),
        "errors": .int(Int64(errors)),
    ])
    let each = rounds.map { "×" + format($0.ratio, 2) }.joined(separator: ", ")
    row("burst, freezer: \(count) unit apps backgrounded, last frozen (ms, median of \(rounds.count) rounds in turns)",
        format(backgroundMs, 1), "C cgroup.freeze loop \(format(baselineFreeze, 1))",
        check(ratio, "≤", 3, key: "burstBackgroundFreezer") + " (median of the rounds' ratios: \(each); \(BurstRound.noiseSummary(rounds)))")
    row("daemon CPU per app frozen, until the last frozen (µs, median)", format(cpuPerApp, 1), "", "")
    row("the same frozen by a C loop opening, writing, closing each cgroup.freeze (ms)", format(openingFreeze, 1),
        "C cgroup.freeze loop \(format(baselineFreeze, 1))", "×\(format(openingFreeze / baselineFreeze, 2)): the floor of opening")
    row("burst, freezer: \(count) unit apps foregrounded, last thawed (ms, median)", format(foregroundMs, 1),
        "C cgroup.freeze loop \(format(baselineThaw, 1))", "×\(format(thawRatio, 2))")
}

/// Rounds of the freezer bursts (odd: the median is one of them).
let freezerRounds = 3
