// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import BGTaskSystem
import Foundation
import Varlink

/// `bgtaskd-bench --soak SECONDS [--apps N]` (`make soak`): N apps going back and forth for
/// SECONDS against one daemon. Half are idlers (no task): backgrounded they are suspended
/// at once, foregrounded they resume. Half are holders (one task they never end):
/// backgrounded they are warned and, at their 300 ms deadline, killed; each is replaced by
/// a new one. Every suspension, resumption and termination must happen, and be seen both
/// in /proc and on a Monitor stream; the daemon's memory, descriptors and state file must
/// stay flat. Prints one sample line per round and a verdict; exits 1 if anything is off.
enum Soak {
    struct Counts { var suspended = 0, resumed = 0, terminated = 0 }

    @MainActor static func run(seconds: Double, apps: Int) throws -> Never {
        let daemon = try BenchDaemon(["BackgroundTimeSec=300ms", "ExpirationWarningSec=150ms", "TransitionTimeoutSec=1h",
                                      "GrantLatencyMinSec=0", "GrantLatencyMaxSec=5ms", "TaskAgeWarningSec=1h",
                                      "MaxApps=100000", "MaxConnectionsPerUser=100000", "SuspendMode=signal"])
        let socketPath = daemon.socketPath, daemonPID = daemon.child.pid, directory = daemon.directory
        let (appsIn, appsInWrite) = try Subprocess.pipe()  // closing it ends every app
        let (appsOut, appsOutWrite) = try Subprocess.pipe()
        try appsOut.setNonBlocking()
        var pending: [UInt8] = []
        func spawn(_ count: Int, tasks: Int) throws -> [Int32] {
            let pids = try (0..<count).map { _ in
                try Subprocess.spawn([binaryDirectory + "/bgtask-bench-app", socketPath, String(tasks)],
                                     stdin: .descriptor(appsIn.rawValue), stdout: .descriptor(appsOutWrite.rawValue),
                                     stderr: .file("/dev/null")).pid
            }
            var ready = 0
            let giveUp = now() + 60_000_000_000
            while ready < count, now() < giveUp {
                _ = try appsOut.waitReadable(timeoutMilliseconds: 1000)
                while let chunk = try appsOut.readAvailable(upTo: 65536), !chunk.isEmpty { pending += chunk }
                while let newline = pending.firstIndex(of: 10) {
                    ready += 1
                    pending.removeSubrange(...newline)
                }
            }
            guard ready == count else { throw ClientError(.timedOut, "only \(ready) of \(count) apps reported in") }
            return pids
        }

        let observed = Locked(Counts())
        let monitor = try VarlinkConnection(path: daemon.socketPath)
        try monitor.send(VarlinkCall(.monitor, more: true))
        let handoff = Handoff(monitor)
        Thread {
            while let reply = try? handoff.value.receive() {
                switch reply.parameters["event"]?.stringValue {
                case "suspended"?: observed.withLock { $0.suspended += 1 }
                case "resumed"?: observed.withLock { $0.resumed += 1 }
                case "terminated"?: observed.withLock { $0.terminated += 1 }
                default: break
                }
            }
        }.start()

        let manager = try VarlinkConnection(path: daemon.socketPath)
        func set(_ pids: [Int32], _ state: String) throws {
            for pid in pids {
                _ = try manager.call(.manager(.setAppState), ["pid": .int(Int64(pid)), "state": .string(state)],
                                     timeoutMilliseconds: 10_000)
            }
        }
        func waitFor(_ what: String, _ condition: () -> Bool) throws {
            let giveUp = now() + 10_000_000_000
            while !condition() {
                if now() > giveUp { throw ClientError(.timedOut, "soak: \(what) did not happen within 10s") }
                sleepUntil(now() + 5_000_000)  // poll interval while the daemon works
            }
        }
        func descriptors() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemonPID)/fd").count) ?? -1 }
        func stateBytes() -> Int {
            ((try? FileManager.default.attributesOfItem(atPath: directory + "/state/bgtaskd.state"))?[.size] as? Int) ?? -1
        }

        let idlers = try spawn(apps / 2, tasks: 0)
        var holders = try spawn(apps - apps / 2, tasks: 1)
        var expected = Counts()
        var samples: [(round: Int, seconds: Double, rss: Int, fds: Int, state: Int)] = []
        let start = now()
        let stopAt = start + Int64(seconds * 1e9)
        say("soak: \(apps) apps (\(idlers.count) idlers, \(holders.count) holders), \(Int(seconds))s, daemon pid \(daemon.child.pid)")
        say("round     time    RSS KiB   fds  state bytes  suspended    resumed  terminated")
        var round = 0
        while now() < stopAt {
            round += 1
            // Everyone in the foreground: the sample point, the same set of apps every round.
            let counts = observed.withLock { $0 }
            samples.append((round, Double(now() - start) / 1e9, daemon.child.residentBytes, descriptors(), stateBytes()))
            let sample = samples.last!
            say(String(format: "%5d %7.0fs %10d %5d %12d %10d %10d %11d", sample.round, sample.seconds, sample.rss / 1024,
                       sample.fds, sample.state, counts.suspended, counts.resumed, counts.terminated))

            try set(idlers + holders, "background")
            expected.suspended += idlers.count
            expected.terminated += holders.count
            try waitFor("\(idlers.count) idlers stopped") { idlers.allSatisfy { (try? ProcStat.read(pid: $0))?.state == "T" } }
            try waitFor("\(holders.count) holders killed at their deadline") {
                for pid in holders { _ = try? Subprocess.wait(pid: pid, block: false) }  // reap the killed
                holders.removeAll { (try? ProcStat.read(pid: $0)) == nil }
                return holders.isEmpty
            }
            try set(idlers, "foreground")
            expected.resumed += idlers.count
            try waitFor("\(idlers.count) idlers resumed") { idlers.allSatisfy { (try? ProcStat.read(pid: $0))?.state != "T" } }
            holders = try spawn(apps - apps / 2, tasks: 1)
            try waitFor("the monitor to catch up") {
                let seen = observed.withLock { $0 }
                return seen.suspended == expected.suspended && seen.resumed == expected.resumed && seen.terminated == expected.terminated
            }
        }

        // Verdict: after the first rounds (allocator and state-file warm-up), flat.
        let counts = observed.withLock { $0 }
        let settled = samples[min(samples.count - 1, max(1, samples.count / 10))]
        let last = samples.last!
        let rssGrowth = Double(last.rss - settled.rss) / Double(settled.rss)
        var failures: [String] = []
        if rssGrowth > 0.10 { failures.append("RSS grew \(format(rssGrowth * 100, 1))% after round \(settled.round)") }
        // One more or less is a manager connection being accepted or closed at the sample.
        if abs(last.fds - settled.fds) > 2 { failures.append("descriptors went from \(settled.fds) to \(last.fds)") }
        if last.state > 4 * max(settled.state, 1 << 20) { failures.append("state file grew from \(settled.state) to \(last.state) bytes") }
        say("""
        soak: \(round) rounds in \(format(Double(now() - start) / 1e9, 0))s: \(counts.suspended) suspensions, \
        \(counts.resumed) resumptions, \(counts.terminated) terminations (expected \(expected.suspended), \
        \(expected.resumed), \(expected.terminated))
        soak: daemon RSS \(settled.rss / 1024) KiB at round \(settled.round) → \(last.rss / 1024) KiB at round \(last.round) \
        (\(format(rssGrowth * 100, 1))%); descriptors \(settled.fds) → \(last.fds); state file \(settled.state) → \(last.state) bytes
        soak: \(failures.isEmpty ? "PASS" : "FAIL: " + failures.joined(separator: "; "))
        """)
        appsInWrite.close()
        for pid in idlers + holders { _ = try? Subprocess.wait(pid: pid, block: true) }
        daemon.stop()
        exit(failures.isEmpty ? 0 : 1)
    }
}
