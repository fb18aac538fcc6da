import BGTaskCore
import BGTaskSystem
import Glibc

/// Suspends, resumes and terminates whole apps — the app's process and every descendant —
/// through the cgroup v2 freezer when the app has a cgroup of its own, else with signals
/// sent through pidfds. Nothing here waits: freezer confirmation, stray-`SIGCONT` checks and
/// fallbacks are driven by one timer on the loop.
final class Enforcer {
    enum Method: Equatable {
        case freezer(Cgroup)
        case signals
    }

    struct PendingFreeze {
        var cgroup: Cgroup
        var command: String
        var deadline: Int64
        var events: FileDescriptor
        var source: EventSource
    }

    /// How long the kernel gets to report `frozen 1` before falling back to signals.
    static let freezeBound: Int64 = 200_000_000
    /// How often signal-suspended apps are checked for a stray `SIGCONT`.
    static let stopCheckInterval: Int64 = 250_000_000
    /// Passes over a tree while stopping it; each pass catches children forked meanwhile.
    static let maximumStopPasses = 16

    let loop: EventLoop
    let log: (LogEntry.Priority, String) -> Void
    /// The pidfd the daemon has held for the app's own process since it registered:
    /// every tree walk starts from it, never from a bare pid.
    let root: (ProcessIdentity) -> Pidfd?
    let ownPID = getpid()
    var suspended: [ProcessIdentity: (method: Method, command: String)] = [:]
    var pendingFreezes: [ProcessIdentity: PendingFreeze] = [:]
    /// Apps sent a catchable signal: what to `SIGKILL` when the grace runs out.
    var terminating: [ProcessIdentity: (pidfds: [Pidfd], cgroup: Cgroup?)] = [:]
    var timer: EventSource!
    var nextStopCheck: Int64?

    init(loop: EventLoop, root: @escaping (ProcessIdentity) -> Pidfd?,
         log: @escaping (LogEntry.Priority, String) -> Void) throws(Errno) {
        self.loop = loop
        self.root = root
        self.log = log
        timer = try loop.addTimer { [unowned self] in self.check() }
    }

    // MARK: Actions

    func suspend(_ app: ProcessIdentity, command: String, mode: SuspendMode) {
        let tree = members(of: app)
        guard !tree.isEmpty else { return }  // gone: its pidfd reports the exit
        if mode != .signal {
            switch ownCgroup(of: app, tree: tree) {
            case let .success(cgroup):
                return freeze(app, command: command, cgroup: cgroup)
            case let .failure(reason):
                if mode == .freezer {
                    log(.notice, "App \(app) (\(command)) cannot be frozen: \(reason.text); suspending with SIGSTOP")
                }
            }
        }
        stopTree(app)
        suspended[app] = (.signals, command)
        armTimer()
    }

    func resume(_ app: ProcessIdentity) {
        let record = suspended.removeValue(forKey: app)
        if let pending = pendingFreezes.removeValue(forKey: app) {
            try? pending.cgroup.setFrozen(false)
        }
        if case let .freezer(cgroup)? = record?.method {
            do { try cgroup.setFrozen(false) } catch { log(.warning, "App \(app): cannot thaw \(cgroup.directory): \(error)") }
        }
        // Always continue the tree too: harmless if frozen, needed after a signal fallback.
        signalTree(app, SIGCONT)
        armTimer()
    }

    /// Thaws, then sends `signal` to every process of the app. For a catchable signal the
    /// processes are remembered (by pidfd) so `kill` can finish the job.
    func terminate(_ app: ProcessIdentity, command: String, signal: Int32) {
        let cgroup = suspended[app].flatMap { if case let .freezer(c) = $0.method { c } else { nil } }
            ?? (try? ownCgroup(of: app, tree: members(of: app)).get())
        suspended[app] = nil
        pendingFreezes[app] = nil
        if let cgroup {
            try? cgroup.setFrozen(false)
            if signal == SIGKILL, (try? cgroup.kill()) != nil {
                armTimer()
                return
            }
        }
        // Stop the whole tree first so nothing forks its way out, then thaw and signal.
        let pidfds = stopTree(app) + (cgroup.map(pidfds(in:)) ?? [])
        for pidfd in pidfds {
            if signal != SIGKILL { try? pidfd.send(signal: SIGCONT) }
            try? pidfd.send(signal: signal)
        }
        if signal != SIGKILL { terminating[app] = (pidfds, cgroup) }
        armTimer()
    }

    /// The grace after a catchable terminate signal ran out: `SIGKILL` whatever is left.
    /// (A termination begun by a previous daemon has no record here: its tree gets it.)
    func kill(_ app: ProcessIdentity) {
        let record = terminating.removeValue(forKey: app) ?? ([], nil)
        try? record.cgroup?.kill()
        var survivors = record.pidfds.filter { !$0.hasExited }
        survivors += stopTree(app)  // and anything the main process forked meanwhile
        for pidfd in survivors { try? pidfd.send(signal: SIGKILL) }
        if !survivors.isEmpty {
            log(.warning, "App \(app) still had \(survivors.count) process(es) after the terminate grace; sent SIGKILL")
        }
    }

    /// The app is gone: nothing is left to resume.
    func forget(_ app: ProcessIdentity) {
        suspended[app] = nil
        pendingFreezes[app] = nil
        armTimer()
    }

    /// Whether the app looks suspended: its own process stopped, or its own cgroup frozen.
    func isStopped(_ app: ProcessIdentity) -> Bool {
        guard let root = root(app), let stat = try? ProcStat.read(pid: root.pid), stat.startTime == app.startTime else {
            return false
        }
        if stat.state == "T" { return true }
        guard let cgroup = try? ownCgroup(of: app, tree: members(of: app)).get() else { return false }
        return (try? cgroup.isFrozen()) == true
    }

    /// Resumes every app this daemon suspended (it is stopping).
    func resumeAll() -> [ProcessIdentity] {
        let apps = Array(suspended.keys) + pendingFreezes.keys.filter { suspended[$0] == nil }
        for app in apps { resume(app) }
        return apps
    }

    // MARK: Freezer

    enum NotOwn: Error {
        case reason(String)
        var text: String { if case let .reason(text) = self { text } else { "" } }
    }

    /// The app's cgroup if every process in it (and below it) belongs to the app, and every
    /// process of the app is in it.
    func ownCgroup(of app: ProcessIdentity, tree: [Pidfd]) -> Result<Cgroup, NotOwn> {
        guard Cgroup.mountPoint != nil, let cgroup = Cgroup.of(pid: app.pid) else {
            return .failure(.reason("no cgroup v2 hierarchy"))
        }
        guard !cgroup.isRoot else { return .failure(.reason("it is in the root cgroup")) }
        guard let members = try? cgroup.processes() else {
            return .failure(.reason("cannot read \(cgroup.directory)/cgroup.procs"))
        }
        let tree = Set(tree.map(\.pid))
        if members.contains(ownPID) { return .failure(.reason("it shares \(cgroup.directory) with bgtaskd")) }
        if let stranger = members.first(where: { !tree.contains($0) }) {
            return .failure(.reason("it shares \(cgroup.directory) with pid \(stranger), which is not part of the app"))
        }
        if let outside = tree.first(where: { !members.contains($0) }) {
            return .failure(.reason("its pid \(outside) is outside \(cgroup.directory)"))
        }
        return .success(cgroup)
    }

    func freeze(_ app: ProcessIdentity, command: String, cgroup: Cgroup) {
        do {
            try cgroup.setFrozen(true)
            suspended[app] = (.freezer(cgroup), command)
            if try cgroup.isFrozen() { return }
            // The kernel freezes asynchronously: watch cgroup.events until frozen or the bound.
            let events = try cgroup.openEvents()
            let source = try loop.addIO(events.rawValue, events: IOEvents.priority) { [unowned self] _ in
                self.confirmFreeze(app)
            }
            pendingFreezes[app] = PendingFreeze(cgroup: cgroup, command: command,
                                                deadline: loop.now + Self.freezeBound, events: events, source: source)
            armTimer()
        } catch {
            log(.notice, "App \(app) (\(command)) cannot be frozen: \(error); suspending with SIGSTOP")
            try? cgroup.setFrozen(false)
            stopTree(app)
            suspended[app] = (.signals, command)
            armTimer()
        }
    }

    func confirmFreeze(_ app: ProcessIdentity) {
        guard let pending = pendingFreezes[app] else { return }
        // Reading the watched descriptor acknowledges the change, or kernfs keeps polling ready.
        lseek(pending.events.rawValue, 0, SEEK_SET)
        _ = try? pending.events.read(upTo: 4096)
        if (try? pending.cgroup.isFrozen()) == true {
            pendingFreezes[app] = nil
            armTimer()
        }
    }

    // MARK: Signals

    /// The app's processes, each held by a pidfd; empty once its own process is gone.
    func members(of app: ProcessIdentity) -> [Pidfd] {
        guard let root = root(app) else { return [] }
        return ProcessTree.members(of: root).filter { $0.pid != ownPID }
    }

    /// Stops every process of the app, pass after pass until no new one appears (a stopped
    /// process cannot fork); returns the pidfds of the processes stopped.
    @discardableResult
    func stopTree(_ app: ProcessIdentity) -> [Pidfd] {
        var stopped: [Int32: Pidfd] = [:]
        for _ in 0..<Self.maximumStopPasses {
            var found = false
            for pidfd in members(of: app) where stopped[pidfd.pid] == nil {
                try? pidfd.send(signal: SIGSTOP)
                stopped[pidfd.pid] = pidfd
                found = true
            }
            if !found { break }
        }
        return Array(stopped.values)
    }

    func signalTree(_ app: ProcessIdentity, _ signal: Int32) {
        for pidfd in members(of: app) { try? pidfd.send(signal: signal) }
    }

    func pidfds(in cgroup: Cgroup) -> [Pidfd] {
        ((try? cgroup.processes()) ?? []).compactMap { pid in pid == ownPID ? nil : try? Pidfd.open(pid: pid) }
    }

    // MARK: Timer

    /// Fallbacks for freezes not confirmed in time, and re-stopping of signal-suspended apps
    /// that someone else continued.
    func check() {
        let now = loop.now
        for (app, pending) in pendingFreezes where now >= pending.deadline {
            pendingFreezes[app] = nil
            if (try? pending.cgroup.isFrozen()) == true { continue }
            log(.notice, "App \(app) (\(pending.command)): \(pending.cgroup.directory) not frozen within \(Self.freezeBound / 1_000_000)ms; suspending with SIGSTOP")
            try? pending.cgroup.setFrozen(false)
            stopTree(app)
            suspended[app] = (.signals, pending.command)
        }
        if let due = nextStopCheck, now >= due {
            for (app, record) in suspended where record.method == .signals {
                let running = members(of: app).compactMap { try? ProcStat.read(pid: $0.pid) }
                    .filter { !["T", "t", "Z", "X"].contains($0.state) }
                guard let first = running.first else { continue }
                log(.warning, "App \(app) (\(record.command)) was resumed while suspended (pid \(first.pid) is '\(first.state)', a stray SIGCONT?); stopping it again")
                stopTree(app)
            }
            nextStopCheck = nil
        }
        armTimer()
    }

    /// Arms the timer for the earliest pending freeze deadline or the next stop check; off
    /// when there is nothing to watch, so an idle daemon does not wake.
    func armTimer() {
        let now = loop.now
        if suspended.values.contains(where: { $0.method == .signals }) {
            if nextStopCheck == nil { nextStopCheck = now + Self.stopCheckInterval }
        } else {
            nextStopCheck = nil
        }
        let deadlines = pendingFreezes.values.map(\.deadline) + (nextStopCheck.map { [$0] } ?? [])
        timer.arm(at: deadlines.min())
    }
}
