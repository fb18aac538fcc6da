// SPDX-License-Identifier: Apache-2.0
// Freezer bursts: the same number of apps, each a unit app of its own (a `.scope` cgroup
// under a slice the benchmark makes), `SuspendMode=freezer`; backgrounded in one burst
// against a C loop writing their `cgroup.freeze` files, in the same run. Needs root and
// cgroup v2 (else skipped, saying why).
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

/// When cgroups report `frozen 1` (or 0) in `cgroup.events`: each open, read from the start
/// in sweeps over those not there yet, resting 100 µs after a sweep that found nothing (as
/// `ChildEvents` does for signals). The same poller for bgtaskd and for the baseline.
struct FreezerEvents {
    let events: [FileDescriptor]

    init(_ directories: [String]) throws {
        events = try directories.map { directory in
            let fd = open(directory + "/cgroup.events", O_RDONLY | O_CLOEXEC)
            if fd < 0 { throw Errno.current("open \(directory)/cgroup.events") }
            return FileDescriptor(fd)
        }
    }

    /// Waits until every cgroup is frozen (or thawed); returns when the last was seen to.
    func await(frozen: Bool, seconds: Double = 60) throws -> Int64 {
        var pending = Array(events.indices)
        var last: Int64 = 0
        let wanted = Array((frozen ? "frozen 1" : "frozen 0").utf8)
        let giveUp = now() + Int64(seconds * 1e9)
        var buffer = [UInt8](repeating: 0, count: 256)
        while !pending.isEmpty {
            var still: [Int] = []
            still.reserveCapacity(pending.count)
            for index in pending {
                let n = buffer.withUnsafeMutableBytes { pread(events[index].rawValue, $0.baseAddress, $0.count, 0) }
                if n > 0, buffer[..<n].firstRange(of: wanted) != nil { last = now() } else { still.append(index) }
            }
            if still.count == pending.count {
                if now() > giveUp {
                    throw ClientError(.timedOut, "\(pending.count) of \(events.count) cgroups not \(frozen ? "frozen" : "thawed") within \(seconds)s")
                }
                sleepUntil(now() + 100_000)
            }
            pending = still
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

@MainActor func freezerBursts(count requested: Int) throws {
    guard getuid() == 0, let root = Cgroup.mountPoint else {
        say("freezer bursts skipped: they need root and cgroup v2")
        results["freezerBursts"] = .object(["skipped": .string("needs root and cgroup v2")])
        return
    }
    // The daemon holds a pidfd and, while it is frozen, the cgroup.events of every app: two
    // descriptors per app, as the signal bursts' connection and pidfd.
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    let count = min(requested, (Int(clamping: limit.rlim_max) - 256) / 2)
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
    let daemon = try BenchDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "BackgroundTimeSec=1h",
                                  "TransitionTimeoutSec=1h", "TaskAgeWarningSec=1h", "MaxApps=100000", "SuspendMode=freezer",
                                  "MaxConnectionsPerUser=16384"])
    let apps = try BenchApps(socket: daemon.socketPath)
    defer {
        daemon.stop()  // thaws what it froze
        apps.end()
    }
    let pids = try apps.spawn(count, tasks: 0, cgroups: directories)
    let watched = try FreezerEvents(directories)
    // Each app registered (by its manager's first SetAppState) before the bursts: as the
    // signal bursts' apps registered themselves.
    _ = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
    _ = try daemon.manager("GetStatus")
    Thread.sleep(forTimeInterval: 0.5)

    let cpuBefore = daemon.child.cpuNanoseconds
    let background = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "background"]))
    let frozenAt = try watched.await(frozen: true)
    let cpuPerApp = Double(daemon.child.cpuNanoseconds - cpuBefore) / 1e3 / Double(count)
    if ProcessInfo.processInfo.environment["BENCH_DEBUG"] != nil {
        say("debug: freeze window \(background.start) \(frozenAt) ns (monotonic)")
    }
    let foreground = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "foreground"]))
    let thawedAt = try watched.await(frozen: false)
    // Stopped before the baselines: the daemon watches its unit apps' cgroup.events, and
    // would wake for every freeze the C loop makes (a read each), taking CPU from the loop.
    daemon.stop()
    let freeze = try freezeLoop(directories, frozen: true)
    let baselineFrozenAt = try watched.await(frozen: true)
    freeze.process.stop()
    let thaw = try freezeLoop(directories, frozen: false)
    let baselineThawedAt = try watched.await(frozen: false)
    thaw.process.stop()
    let opening = try freezeLoop(directories, frozen: true, opening: true)
    let openingFrozenAt = try watched.await(frozen: true)
    opening.process.stop()
    let unfreeze = try freezeLoop(directories, frozen: false)
    _ = try watched.await(frozen: false)
    unfreeze.process.stop()

    let backgroundMs = Double(frozenAt - background.start) / 1e6
    let foregroundMs = Double(thawedAt - foreground.start) / 1e6
    let baselineFreeze = Double(baselineFrozenAt - freeze.start) / 1e6
    let baselineThaw = Double(baselineThawedAt - thaw.start) / 1e6
    let openingFreeze = Double(openingFrozenAt - opening.start) / 1e6
    let errors = background.errors + foreground.errors
    if errors > 0 { say("bench: \(errors) SetAppState calls of the freezer bursts failed") }
    results["freezerBursts"] = .object([
        "apps": .int(Int64(count)), "backgroundMilliseconds": .double(backgroundMs),
        "foregroundMilliseconds": .double(foregroundMs), "baselineFreezeMilliseconds": .double(baselineFreeze),
        "baselineThawMilliseconds": .double(baselineThaw), "openingLoopFreezeMilliseconds": .double(openingFreeze),
        "daemonCPUMicrosecondsPerApp": .double(cpuPerApp),
        "errors": .int(Int64(errors)),
    ])
    row("burst, freezer: \(count) unit apps backgrounded, last frozen (ms)", format(backgroundMs, 1),
        "C cgroup.freeze loop \(format(baselineFreeze, 1))", check(backgroundMs / baselineFreeze, "≤", 3, key: "burstBackgroundFreezer"))
    row("daemon CPU per app frozen, until the last frozen (µs)", format(cpuPerApp, 1), "", "")
    row("the same frozen by a C loop opening, writing, closing each cgroup.freeze (ms)", format(openingFreeze, 1),
        "C cgroup.freeze loop \(format(baselineFreeze, 1))", "×\(format(openingFreeze / baselineFreeze, 2)): the floor of opening")
    row("burst, freezer: \(count) unit apps foregrounded, last thawed (ms)", format(foregroundMs, 1),
        "C cgroup.freeze loop \(format(baselineThaw, 1))", "×\(format(foregroundMs / baselineThaw, 2))")
}
