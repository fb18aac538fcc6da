// SPDX-License-Identifier: Apache-2.0
// Fairness under overload: the lateness of 200 apps' expiration warnings while other
// clients keep the daemon busy with as many Begin+End pairs as it takes, against the same
// warnings on an idle daemon, in the same run.
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

/// Clients sending Begin+End pairs back to back, each on its own thread and connection,
/// until `stop()`.
final class Flood: @unchecked Sendable {
    private let running = Locked(true)
    private let done = DispatchSemaphore(value: 0)
    private let clients: Int
    let pairs = Locked(0)

    init(_ path: String, clients: Int) throws {
        self.clients = clients
        for _ in 0..<clients {
            let client = Handoff(try RawClient(path: path))
            Thread { [self] in
                var sent = 0
                while running.withLock({ $0 }), (try? pair(client.value)) != nil { sent += 1 }
                pairs.withLock { $0 += sent }
                done.signal()
            }.start()
        }
    }

    /// Stops every client; returns the pairs they made.
    func stop() -> Int {
        running.withLock { $0 = false }
        for _ in 0..<clients { done.wait() }
        return pairs.withLock { $0 }
    }
}

@MainActor func fairness() throws {
    let apps = 200
    // Warned 1 s after going to the background: due at the burst's send + 1 s at the
    // earliest, so the lateness measured from there over-states, never under-states.
    let budget: Int64 = 3_000_000_000, warning: Int64 = 2_000_000_000
    func lateness(flooding clients: Int) throws -> (Summary, pairsPerSecond: Double) {
        let daemon = try BenchDaemon(["GrantLatencyMinSec=0", "GrantLatencyMaxSec=0", "BackgroundTimeSec=3s", "ExpirationWarningSec=2s",
                                      "TransitionTimeoutSec=1h", "TaskAgeWarningSec=1h", "SuspendMode=signal", "MaxConnectionsPerUser=16384"])
        let population = try BenchApps(socket: daemon.socketPath)
        defer {
            daemon.stop()
            population.end()
        }
        let pids = try population.spawn(apps, tasks: 0, mode: "hold")
        let monitor = try MonitorRecorder(daemon.socketPath)
        defer { monitor.stop() }
        _ = try daemon.manager("GetStatus")
        let flood = clients > 0 ? try Flood(daemon.socketPath, clients: clients) : nil
        Thread.sleep(forTimeInterval: 0.5)  // the flood at full speed before the burst
        let floodStart = now()
        let background = try Pipeline(daemon.socketPath, frames("SetAppState", pids, ["state": "background"]))
        _ = ChildEvents.await(pids)  // each ends its task when warned and is suspended
        let pairs = flood?.stop() ?? 0
        let seconds = Double(now() - floodStart) / 1e9
        let due = background.start + budget - warning
        var warnedAt: [Int64: Int64] = [:]
        for (name, pid, received) in monitor.events() where name == "task:expiring" && warnedAt[pid] == nil {
            warnedAt[pid] = received
        }
        let late = pids.compactMap { warnedAt[Int64($0)].map { Double($0 - due) / 1e6 } }
        if late.count < apps { say("fairness: \(apps - late.count) of \(apps) warnings not seen") }
        return (Summary(late), Double(pairs) / seconds)
    }
    let (idle, _) = try lateness(flooding: 0)
    let (flooded, rate) = try lateness(flooding: 8)
    results["fairness"] = .object(["apps": .int(Int64(apps)), "idleLatenessMilliseconds": idle.json,
                                   "floodedLatenessMilliseconds": flooded.json, "floodPairsPerSecond": .double(rate)])
    row("\(apps) warnings' lateness, idle daemon, from the send (ms)", "\(idle)", "n=\(idle.count)", "")
    row("the same under a flood of 8 clients' Begin+End (\(Int(rate)) pairs/s) (ms)", "\(flooded)", "idle p99 \(format(idle.p99, 3))",
        "p99 ×\(format(flooded.p99 / idle.p99, 2)) of idle")
}
