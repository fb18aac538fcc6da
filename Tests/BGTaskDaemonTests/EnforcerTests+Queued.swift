// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
@testable import BGTaskDaemon
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// A pass's suspensions of tracked apps are signalled together at its end (`queueStops`,
/// `sendQueuedStops`): what each suspension would have done, in the order decided.
extension EnforcerTests {
    /// Whether `pid` was sent `SIGSTOP`: stopped, or the signal still pending (so the answer
    /// does not wait on the process being scheduled to stop itself).
    static func stopSent(_ pid: Int32) -> Bool {
        let text = String(decoding: (try? readFile("/proc/\(pid)/status")) ?? [], as: UTF8.self)
        var pending: UInt64 = 0, stopped = false
        for line in text.split(separator: "\n") {
            if line.hasPrefix("State:") { stopped = line.contains("(stopped)") }
            if line.hasPrefix("ShdPnd:") || line.hasPrefix("SigPnd:") {
                pending |= UInt64(line.split(separator: "\t").last ?? "", radix: 16) ?? 0
            }
        }
        return stopped || pending & (1 << UInt64(SIGSTOP - 1)) != 0
    }

    static let tracking = getuid() == 0 && Host.inInitialNamespaces

    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func aPassesSuspensionsOfTrackedAppsAreSignalledTogetherAtItsEnd() throws {
        let rig = try Rig(tracking: true)
        let sleepers = try (0..<3).map { _ in try Spawned("/bin/sleep", ["1000"]) }
        defer { for sleeper in sleepers { sleeper.killTree() } }
        let apps = try sleepers.map { try rig.app($0) }
        for app in apps { rig.enforcer.suspend(app, uid: 0, command: "sleep", mode: .signal, at: 0) }
        // Suspended in the records (what the pass reports), not yet signalled.
        #expect(apps.allSatisfy { rig.enforcer.suspended[$0]?.method == .signals })
        #expect(rig.enforcer.queuedStops.map(\.app) == apps)
        #expect(!sleepers.contains { Self.stopSent($0.pid) })
        rig.enforcer.finishStops()  // the pass's end
        #expect(rig.enforcer.queuedStops.isEmpty)
        try waitUntil("every app stopped") { sleepers.allSatisfy { processState($0.pid) == "T" } }
        for app in apps { rig.enforcer.resume(app, uid: 0, at: 1) }
        try waitUntil("every app running") { sleepers.allSatisfy { processState($0.pid) != "T" } }
    }

    /// What a pass does to one app happens in the order decided: an app resumed (or acted on
    /// otherwise) after its suspension in the same pass gets its stop first, then the rest.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func anAppResumedInThePassItWasSuspendedInIsLeftRunning() throws {
        let rig = try Rig(tracking: true)
        let sleeper = try Spawned("/bin/sleep", ["1000"])
        defer { sleeper.killTree() }
        let app = try rig.app(sleeper)
        rig.enforcer.suspend(app, uid: 0, command: "sleep", mode: .signal, at: 0)
        rig.enforcer.resume(app, uid: 0, at: 0)
        rig.enforcer.finishStops()
        // A stop sent after the resume's SIGCONT would be pending now, or have stopped it.
        #expect(!Self.stopSent(sleeper.pid))
        #expect(rig.enforcer.suspended[app] == nil)
    }

    /// The owner's check is made just before each signal, as a walk makes it: uid 65534's
    /// app whose own process is root's is not suspended after all, and nothing is stopped.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func anUnprivilegedOwnersQueuedSuspensionLeavesOthersProcessesAlone() throws {
        let rig = try Rig(tracking: true)
        let sleeper = try Spawned("/bin/sleep", ["1000"])  // root's
        defer { sleeper.killTree() }
        let app = try rig.app(sleeper)
        rig.enforcer.suspend(app, uid: 65534, command: "sleep", mode: .signal, at: 0)
        rig.enforcer.finishStops()
        #expect(!Self.stopSent(sleeper.pid))
        #expect(rig.enforcer.suspended[app] == nil)
        #expect(rig.scheduled.last?.0 == .stopCheck && rig.scheduled.last?.1 == nil)  // disarmed again
        #expect(rig.logged.contains { $0.contains("not suspended: the app's owner could not signal it") }, "\(rig.logged)")
    }

    /// 40 (`count`) single-process tracked apps suspended with signals, stopped, and checked
    /// three times a second apart: a sweep of two checks opens their files (each app read by
    /// path: 32 of them fill a check's budget), the third reads those held. Returns the sleepers, the
    /// apps and the instant of the last check; the caller resumes the apps.
    /// With `uid`, the sleepers run as that user (`setpriv`), which suspends them.
    private func sweptTrackedSleepers(_ rig: Rig, uid: UInt32 = 0, count: Int = 40) throws -> (sleepers: [Spawned], apps: [ProcessIdentity], at: Int64) {
        var sleepers: [Spawned] = []
        do {
            let command = (uid == 0 ? [] : ["/usr/bin/setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"])
                + ["/bin/sleep", "1000"]
            for _ in 0..<count { sleepers.append(try Spawned(command[0], Array(command.dropFirst()))) }
            // Each runs as `uid` only once `setpriv` has changed it: until then it is root's,
            // and `uid`'s suspension rightly leaves it alone. Its exec of `sleep` comes after.
            try waitUntil("setpriv to exec sleep") {
                sleepers.allSatisfy { (try? ProcStat.read(pid: $0.pid))?.command == "sleep" }
            }
            let apps = try sleepers.map { try rig.app($0) }
            for app in apps { rig.enforcer.suspend(app, uid: uid, command: "sleep", mode: .signal, at: 0) }
            rig.enforcer.finishStops()
            try waitUntil("every app stopped") { sleepers.allSatisfy { processState($0.pid) == "T" } }
            for second in 1...3 { rig.enforcer.checkStops(at: Int64(second) * 1_000_000_000) }
            return (sleepers, apps, 3_000_000_000)
        } catch {
            for sleeper in sleepers { sleeper.killTree() }
            throw error
        }
    }

    /// The stray check of tracked apps costs what reading their processes' states costs, not
    /// a walk's: once their `/proc/PID/stat` are held, one wake-up a second reads all 40 (a
    /// walk's cost had a locked session's 200 tracked apps wake the daemon 50 times a
    /// second). A process continued by someone else is still found, read from its held file,
    /// and stopped again.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func theStrayCheckOfTrackedAppsReadsHeldFiles() throws {
        let rig = try Rig(tracking: true)
        let (sleepers, apps, now) = try sweptTrackedSleepers(rig)
        defer { for sleeper in sleepers { sleeper.killTree() } }
        let armed = rig.scheduled.last
        #expect(armed?.0 == .stopCheck && armed?.1 == now + Enforcer.stopCheckInterval, "\(String(describing: armed))")
        #expect(sleepers.allSatisfy { processState($0.pid) == "T" })  // none found running, none stopped again
        try sleepers[0].signal(SIGCONT)
        try waitUntil("the first app continued") { processState(sleepers[0].pid) != "T" }
        rig.enforcer.checkStops(at: now + Enforcer.stopCheckInterval)
        try waitUntil("the first app stopped again") { processState(sleepers[0].pid) == "T" }
        #expect(rig.logged.contains { $0.contains("was resumed while suspended (pid \(sleepers[0].pid)") }, "\(rig.logged)")
        #expect(rig.enforcer.trackedStatBudget.total == 40)
        for app in apps { rig.enforcer.resume(app, uid: 0, at: now) }
        #expect(rig.scheduled.last?.0 == .stopCheck && rig.scheduled.last?.1 == nil)  // disarmed: none suspended
        #expect(rig.enforcer.trackedStatBudget.total == 0)  // closed with the suspensions
        try waitUntil("every app running") { sleepers.allSatisfy { processState($0.pid) != "T" } }
    }

    /// The held files are bounded as what a suspension keeps is (`heldStopLimits`, here 5 for
    /// the owner): past that, processes are read by path, and the check is paced by that.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func theTrackedAppsHeldFilesAreBoundedPerOwner() throws {
        let rig = try Rig(tracking: true)
        rig.enforcer.heldStopLimits = (all: 100, perUser: 5)
        let (sleepers, apps, now) = try sweptTrackedSleepers(rig)
        defer { for sleeper in sleepers { sleeper.killTree() } }
        #expect(rig.enforcer.trackedStatBudget.total == 5)
        let spacing = Enforcer.stopCheckSpacing(cost: Enforcer.readCost(processes: 40, held: 5))
        #expect(spacing == Enforcer.stopCheckInterval / 2)
        // A sweep of two checks, back to back: the second in the next pass, then two spacings on.
        #expect(rig.scheduled.last?.1 == now + 1, "\(String(describing: rig.scheduled.last))")
        rig.enforcer.checkStops(at: now + 1)
        #expect(rig.scheduled.last?.1 == now + 1 + 2 * spacing, "\(String(describing: rig.scheduled.last))")
        for app in apps { rig.enforcer.resume(app, uid: 0, at: now) }
        #expect(rig.enforcer.trackedStatBudget.total == 0)
        try waitUntil("every app running") { sleepers.allSatisfy { processState($0.pid) != "T" } }
    }

    /// A sweep's checks run one a pass, back to back, up to four (`stopChecksBackToBack`),
    /// then wait as long as those would have been spaced: the CPU woken once for them (a
    /// locked session's 400 processes were four wake-ups a second), each pass still bounded,
    /// the sweep as long as before. 160 tracked apps read by path (no files held here) are
    /// five checks; the helper made three of them.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func theStrayChecksRunFourBackToBackThenWait() throws {
        let rig = try Rig(tracking: true)
        rig.enforcer.heldStopLimits = (all: 0, perUser: 0)
        let (sleepers, apps, now) = try sweptTrackedSleepers(rig, count: 160)
        defer { for sleeper in sleepers { sleeper.killTree() } }
        let spacing = Enforcer.stopCheckSpacing(cost: Enforcer.readCost(processes: 160, held: 0))
        #expect(spacing == Enforcer.stopCheckInterval / 5)
        func armed() -> Int64? { rig.scheduled.last.flatMap { $0.0 == .stopCheck ? $0.1 : nil } }
        #expect(armed() == now + 1)  // the fourth, in the next pass
        rig.enforcer.checkStops(at: now + 1)
        let fifth = now + 1 + 4 * spacing
        #expect(armed() == fifth)  // four made: the fifth after four spacings
        rig.enforcer.checkStops(at: fifth)
        #expect(armed() == fifth + spacing)  // the sweep's last, alone in its row
        rig.enforcer.checkStops(at: fifth + spacing)
        #expect(armed() == fifth + spacing + 1)  // the next sweep's first row
        #expect(sleepers.allSatisfy { processState($0.pid) == "T" })  // none found running, none stopped again
        for app in apps { rig.enforcer.resume(app, uid: 0, at: fifth + spacing) }
        try waitUntil("every app running") { sleepers.allSatisfy { processState($0.pid) != "T" } }
    }

    /// One user's held files take no other user's share: uid 65534 suspending 40 of its own
    /// tracked apps holds 5 (its share here), and root's app suspended after is still held.
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector (and setpriv to uid 65534)"))
    func oneUsersTrackedAppsHoldNoMoreThanTheirShare() throws {
        let rig = try Rig(tracking: true)
        rig.enforcer.heldStopLimits = (all: 100, perUser: 5)
        let (sleepers, apps, now) = try sweptTrackedSleepers(rig, uid: 65534)
        defer { for sleeper in sleepers { sleeper.killTree() } }
        #expect(rig.enforcer.trackedStatBudget.byUser[65534] == 5)
        let rootSleeper = try Spawned("/bin/sleep", ["1000"])
        defer { rootSleeper.killTree() }
        let rootApp = try rig.app(rootSleeper)
        rig.enforcer.suspend(rootApp, uid: 0, command: "sleep", mode: .signal, at: now)
        rig.enforcer.finishStops()
        try waitUntil("root's app stopped") { processState(rootSleeper.pid) == "T" }
        // Sweeps until root's app has been looked at (a sweep of 41 apps, most read by path,
        // takes two wake-ups).
        for second in 1...4 { rig.enforcer.checkStops(at: now + Int64(second) * 1_000_000_000) }
        #expect(rig.enforcer.trackedStatBudget.byUser[0] == 1)
        #expect(rig.enforcer.trackedStatBudget.byUser[65534] == 5)
        rig.enforcer.resume(rootApp, uid: 0, at: now)
        for app in apps { rig.enforcer.resume(app, uid: 65534, at: now) }
        #expect(rig.enforcer.trackedStatBudget.total == 0)
        try waitUntil("every app running") { (sleepers + [rootSleeper]).allSatisfy { processState($0.pid) != "T" } }
    }

    /// An app whose own process is gone by the pass's end is not suspended after all (its
    /// pidfd reports the exit; nothing stays armed for it).
    @Test(.enabled(if: tracking, "needs root in the initial namespaces for the process-events connector"))
    func anAppGoneBeforeItsStopIsNotSuspended() throws {
        let rig = try Rig(tracking: true)
        let sleeper = try Spawned("/bin/sleep", ["1000"])
        let app = try rig.app(sleeper)
        rig.enforcer.suspend(app, uid: 0, command: "sleep", mode: .signal, at: 0)
        try sleeper.signal(SIGKILL)
        _ = try sleeper.wait(timeout: 5)  // reaped: its pid is no process's
        rig.enforcer.finishStops()
        #expect(rig.enforcer.suspended[app] == nil)
        #expect(rig.scheduled.last?.0 == .stopCheck && rig.scheduled.last?.1 == nil)
    }
}
