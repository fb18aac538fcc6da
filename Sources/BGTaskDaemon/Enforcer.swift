// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// Suspends, resumes and terminates whole apps — a unit app's whole cgroup; a process app's
/// process and every descendant — through the cgroup v2 freezer when the app has a cgroup of
/// its own, else with signals sent through pidfds. Nothing here waits or reads a clock: what
/// must happen later (a freeze not confirmed in time, the next stray-`SIGCONT` check) is a
/// `Wait` the model times (`schedule`), carried out here when it falls due (`freezeWaitEnded`,
/// `checkStops`), at the instant the daemon passes in.
///
/// The daemon holds `CAP_KILL`, and no user may borrow it: an app of an unprivileged uid
/// is only the processes that uid could signal itself (`kill(2)`'s rule), and its cgroup is
/// frozen or killed only if it is delegated to that uid. Others are left alone, and logged.
final class Enforcer {
    enum Method: Equatable {
        case freezer(Cgroup)
        case signals
    }

    struct PendingFreeze {
        var cgroup: Cgroup
        var command: String
        var uid: UInt32
    }

    /// A frozen app's `cgroup.events`, watched (`EPOLLPRI`, no periodic wake-up) for as long
    /// as it is suspended: to confirm the freeze, and to notice a thaw nobody asked bgtaskd
    /// for (the owner of a delegated unit writing `0` to its `cgroup.freeze`, systemd thawing
    /// a slice's units), which is undone as a stray `SIGCONT` is. A unit app's is `held`
    /// from its watch to its exit (`watchUnit`), with its `cgroup.freeze` (`freeze`): its
    /// freezes and thaws then open no file.
    struct FreezerWatch {
        var cgroup: Cgroup
        var events: FileDescriptor
        var source: EventSource
        var held = false
        /// A held watch's `cgroup.freeze`, open for writing (`nil` when there was no room for
        /// it: `spareDescriptors`).
        var freeze: FileDescriptor?
        /// Whether a thaw of this suspension was logged already (one line, not one per write).
        var reported = false
    }

    /// How long the kernel gets to report `frozen 1` before falling back to signals. Each
    /// frozen task must run to freeze itself: 200 ms was too little for 1.5 % of 9,872 unit
    /// apps frozen in one burst on 2 CPUs (the benchmark's freezer section), which then
    /// fell back to signals; a second more running is nothing against a background budget.
    static let freezeBound: Int64 = 1_000_000_000
    /// How often signal-suspended apps are checked for a stray `SIGCONT`: a whole sweep every
    /// second, in timer wake-ups whose reads cost about `stopCheckBudget` (an app's processes
    /// are read in one wake-up), at most one every 10 ms; with many processes suspended the
    /// sweep takes longer (10,000 apps walked: 25 s), so a check never costs a timer's
    /// lateness more than a few dozen reads by path or four walks. A locked session's apps
    /// are suspended for hours: its 200 windows (400 processes) checked every 250 ms, 4 apps a
    /// wake-up, each walked, cost the daemon 100 wake-ups and 59–66 ms of CPU a second; their
    /// kept processes read once a second by path, 13 wake-ups and 10 ms; from their state
    /// files held open, 4 wake-ups and 4 ms (`scripts/bench-lock`, README); those four checks
    /// back to back, one wake-up (`stopChecksBackToBack`).
    static let stopCheckInterval: Int64 = 1_000_000_000
    /// What a wake-up's reads cost at most, counted in reads of a kept process's
    /// `/proc/PID/stat` held open (`holdStops`; one `pread`): 128 of those, or 32 reads by
    /// path (`pathReadCost` each: an open, a read and a close, and a look at the pidfd).
    static let stopCheckBudget = 128
    static let pathReadCost = 4
    static let minimumStopCheckSpacing: Int64 = 10_000_000
    /// Checks made one a pass, back to back, before the timer spaces them again: a wake-up
    /// for four of them, the same reads a second. A locked session's 400 processes were read
    /// in 4 wake-ups a second, the CPU woken for each (a phone's screen is off for hours);
    /// now in one. Each pass still reads at most `stopCheckBudget` (what waits between two
    /// passes is served), and the sweep's length is unchanged.
    static let stopChecksBackToBack = 4
    /// What the check of a walked app with nothing kept (past `heldStopLimits`, or
    /// unreached) costs: a walk costs several reads per process, and its processes are not
    /// known until it is made. Four such apps a wake-up, as when every app was walked. A
    /// tracked app's check costs its processes' reads (`trackedCheckCosts`).
    static let unkeptAppCost = stopCheckBudget / 4
    /// Passes over a tree while stopping it; each pass catches children forked meanwhile.
    static let maximumStopPasses = 16
    /// How long a process app found not to have a cgroup of its own (`SuspendMode=auto`) is
    /// suspended with signals without looking again: the look is a walk of its tree and a
    /// read of its cgroup's whole member list, and an app in a desktop session shares the
    /// session's cgroup with every other app in it (200 windows: 60% of a lock's system
    /// calls). Only the failure is remembered: signals are always safe, freezing a cgroup
    /// that has become shared is not.
    static let sharedCgroupRecheck: Int64 = 60_000_000_000
    /// The most cgroups a look goes into, the app's own first; the cgroups below are the
    /// owner's to make, and each costs a read. A look for a process app's own cgroup
    /// (`ownCgroup`): an app with more below it is not frozen whole, but with signals. A walk
    /// of a unit app's processes (signals): a unit with more is frozen instead where it can
    /// be, and otherwise the processes in the others are not reached (logged).
    static let cgroupsPerLook = 64
    /// The descriptors a unit app's held files (`watchUnit`) leave free below the limit: for
    /// what must not fail for want of one (an app's pidfd, a connection, a walk). A held file
    /// saves an open per freeze; one that takes the last descriptors costs a new app its watch.
    static let spareDescriptors = min(1024, max(64, Host.descriptorLimit / 16))
    /// The descriptors below which a unit app's files are held: the limit, raised at start-up
    /// and fixed after, less the spare.
    static let heldDescriptorRoom = Host.descriptorLimit - spareDescriptors

    /// Where frozen apps' `cgroup.events` are watched: the daemon's group, handled a batch
    /// per pass. Each its own sd-event source, 2,000 apps freezing at once were 2,000 loop
    /// iterations, each re-polling every file still ready (kernfs poll was the burst's top
    /// cost, perf).
    let group: IOGroup
    /// The parents of the cgroups frozen and thawed, held: each `cgroup.freeze` is opened
    /// from its parent (`CgroupParents`).
    let parents = CgroupParents()
    /// Writes a log record: the owner's uid (`nil`: no app's) first.
    private let record: (LogEntry.Priority, UInt32?, String) -> Void
    /// Arms (an instant) or disarms (`nil`) one of the enforcement's waits: the model's timers.
    var schedule: (Wait, Int64?) -> Void = { _, _ in }
    /// Arms one of them this many nanoseconds after the daemon's present instant: for what
    /// comes with no instant of its caller's (a `cgroup.events` report).
    var scheduleAfter: (Wait, Int64) -> Void = { _, _ in }
    /// A catchable termination's signal went out (at once, or after its stops were waited
    /// for), to the processes `holds` was just told of and the cgroup that is the app's whole
    /// (with the instance it was): the model's grace runs from then, a restart does not send
    /// it again, and kills those at the grace's end (`BackgroundModel.terminationSignalled`,
    /// `adoptSignalled`).
    var signalled: (ProcessIdentity, Int64, SignalledCgroup?) -> Void = { _, _, _ in }
    /// The processes a termination holds (all of them so far): before its signal, those
    /// whose stops it waits for; after it, those signalled and found since. A restart signals
    /// or kills them, the app's own process gone or not (`BackgroundModel.terminationHolds`).
    var holds: (ProcessIdentity, [ProcessIdentity]) -> Void = { _, _ in }
    /// The pidfd the daemon has held for the app's own process since it registered:
    /// every tree walk starts from it, never from a bare pid.
    let root: (ProcessIdentity) -> Pidfd?
    /// A tracked process app's members (the processes the tracker saw forked by its
    /// members), each held by a pidfd checked to be the process forked, but for the pids
    /// given (held already); `nil` when the tracker does not follow the app. With `true`,
    /// the fork events waiting are read first.
    let tracked: (ProcessIdentity, Set<Int32>, Bool) -> [Pidfd]?
    /// The cgroup of each unit app acted on, as the action said (`adopt`): the model may
    /// have forgotten the app by the time an action is carried out.
    private var units: [ProcessIdentity: Cgroup] = [:]
    let ownPID = Host.pid
    var knownDaemonCgroup: (cgroup: Cgroup?, until: Int64)?
    var suspended: [ProcessIdentity: (method: Method, command: String, uid: UInt32)] = [:]
    var pendingFreezes: [ProcessIdentity: PendingFreeze] = [:]
    var freezerWatches: [ProcessIdentity: FreezerWatch] = [:]
    /// Whether unit apps' `cgroup.freeze` files are held (`watchUnit`): until the daemon first
    /// runs out of descriptors (`yieldHeldFreezes`).
    var holdsFreezes = true
    /// Process apps whose cgroup was found shared, until when that is trusted (`auto` mode).
    private var sharedCgroupUntil: [ProcessIdentity: Int64] = [:]
    /// What the signal suspension of a process app stopped, held by pidfd for its resumption
    /// (`holdStops`): what was stopped is what is continued, with no walk, whatever became of
    /// the tree meanwhile. A member whose parent was killed while it was stopped is below the
    /// app's process no more: the walk a resumption made left it stopped for ever. An app
    /// whose walk left members unreached, or whose stopped processes do not fit within
    /// `heldStopLimits` beside the others', is walked at its resumption, as before.
    /// Beside the kept processes, once the stray check first read them (`keptStats`), each
    /// one's `/proc/PID/stat` held open, where the descriptors allow, else `nil`.
    private(set) var heldStops: [ProcessIdentity: (uid: UInt32, pidfds: [Pidfd], stats: [FileDescriptor?]?)] = [:]
    private var heldStopBudget = OwnerBudget()
    /// How many of the kept processes' `/proc/PID/stat` are held (the check's pace).
    private var heldStatCount = 0
    /// The most pidfds `heldStops` keeps, all apps together: a sixteenth of the descriptors,
    /// as the tracker's members, at most 4,096 (the system unit's limit gives that).
    static let maximumHeldStops = min(4096, max(16, Host.descriptorLimit / 16))
    /// What `heldStops` keeps at most, in all and for one owner's apps: half, so that no user
    /// (uid 65534 suspending its own apps of many processes) keeps another's from being kept.
    /// A 200-window session of two processes a window keeps 400. The stat files held for
    /// tracked apps' checks (`trackedStats`) are bounded alike, apart.
    var heldStopLimits = (all: Enforcer.maximumHeldStops, perUser: Enforcer.maximumHeldStops / 2)
    /// Apps sent a catchable signal: what to `SIGKILL` when the grace runs out, and the
    /// cgroup to kill whole then if it is still the instance signalled. (`bound`: a `SIGKILL`
    /// termination's processes a restarted daemon adopted, killed at the termination's bound.)
    var terminating: [ProcessIdentity: (pidfds: [Pidfd], cgroup: SignalledCgroup?, bound: Bool)] = [:]
    /// A cgroup that was an app's whole when it was sent a catchable signal, and which cgroup
    /// was at its path then (`Cgroup.instance`), read before any signal: read after it, a
    /// unit started again at once (`Restart=`, on a loaded machine) was read as the instance
    /// terminated, and killed at the grace's end.
    struct SignalledCgroup: Equatable {
        let cgroup: Cgroup
        let instance: Cgroup.Instance
    }
    /// A process app's termination whose walk stopped its processes: the signal waits for
    /// the stops to take (`signalStoppedTerminations`).
    struct Stopping {
        var uid: UInt32
        var command: String
        var signal: Int32
        var pidfds: [Pidfd]
        /// A catchable signal's cgroup to kill whole at the grace's end.
        var cgroup: SignalledCgroup?
        /// How many of `pidfds`, from the first, were found stopped (or gone): not read again.
        var stopped = 0
        /// When its processes are looked at next, and how long after that the one after.
        var next: Int64
        /// When its processes are signalled whether or not all have stopped (`signalBound`
        /// after the termination, `started`).
        var signalBy: Int64
        var started: Int64
        var spacing = Enforcer.terminationStopSpacing
    }
    /// Terminations whose signal waits for their processes' stops, within `heldStopLimits`
    /// (in all, and for one owner's apps, apart from what suspensions keep): past them an
    /// app is signalled at once, as before.
    private(set) var stoppingForSignal: [ProcessIdentity: Stopping] = [:]
    private(set) var stoppingBudget = OwnerBudget()
    /// When the look at them is armed (`nil`: it is not).
    private var terminationStopsArmed: Int64?
    /// How often a termination's processes are looked at for their stops: a stop takes
    /// effect when the process next leaves the kernel, within microseconds but for a fork
    /// or a system call under way.
    static let terminationStopSpacing: Int64 = 1_000_000
    static let terminationStopSpacingAtMost: Int64 = 128_000_000
    /// Processes left out of the action in progress because the owner could not signal them.
    var excluded: Set<Int32> = []
    /// Members left out of the action in progress because the daemon was out of descriptors
    /// (`Tracker.unopened`; a walk's or a cgroup's `unreached`): tried again at the next action.
    var unreached: Set<Int32> = []
    /// Whether the action in progress met a unit with more cgroups than a walk goes into
    /// (`cgroupsPerLook`): the processes in the others were not acted on.
    var cgroupsUnread = false
    /// Tracked apps suspended whose last read is still to be made (`finishStops`), with the
    /// pids visited.
    private var unreadStops: [ProcessIdentity: Set<Int32>] = [:]
    /// A tracked app's suspension whose signals are still to be sent (`queueStops`).
    struct QueuedStops {
        var app: ProcessIdentity
        var uid: UInt32
        var command: String
        var members: [Pidfd]
        var at: Int64
    }
    /// The suspensions of this pass whose signals are still to be sent, in order.
    private(set) var queuedStops: [QueuedStops] = []
    /// Whether the next stray-`SIGCONT` check is armed.
    private var stopCheckArmed = false
    /// The checks made back to back so far (`stopChecksBackToBack`), one a pass.
    private var stopChecksInRow = 0
    /// The apps suspended with signals (kept with `suspended`, so arming costs no scan).
    private var signalSuspended: Set<ProcessIdentity> = []
    /// Signal-suspended apps still to be checked in this sweep.
    private var sweep: [ProcessIdentity] = []
    /// What the stray check of each tracked app suspended with signals costs: its processes'
    /// states read, which the tracker knows with no walk (counted at its stops, and again at
    /// each check); and their sum, so that arming the check costs no scan. Counted as a
    /// walked app's (`unkeptAppCost`), a locked session's 200 tracked apps (foot and its
    /// shell) were checked 4 a wake-up, 50 wake-ups a second.
    private var trackedCheckCosts: [ProcessIdentity: Int] = [:]
    private var trackedCheckCost = 0
    /// The `/proc/PID/stat` of a tracked app's processes, held open while it is suspended
    /// with signals (opened at its first check, as `keptStats` opens a kept app's): later
    /// checks read them with no open. Each is its process's by pidfs inode and start time (a
    /// pid the tracker lists again may be another process's by then). At most
    /// `heldStopLimits` of them, in all and for one owner's apps, as what `heldStops` keeps:
    /// past that a process is read by path.
    private var trackedStats: [ProcessIdentity: (uid: UInt32, files: [Int32: TrackedStat])] = [:]
    /// What each walked (`tree`) app's last walk held of its processes (`ProcessTree.Memory`:
    /// pidfds, `/proc/PID/task`, lists of children), kept from one of its walks to the next,
    /// suspended or running, until it is watched no more: a screen lock walks every window's
    /// app, and a walk with its files held costs a process about a third of the system calls'
    /// time of one that opens them (README, Performance). At most `heldStopLimits` processes,
    /// in all and for one owner's apps (apart from what `heldStops` keeps, as
    /// `trackedStats` are), each with its directory and at most four lists, held only below
    /// `heldDescriptorRoom`; an app past them is walked opening its files, as before.
    private var walkMemories: [ProcessIdentity: (uid: UInt32, memory: ProcessTree.Memory, counted: Int)] = [:]
    private(set) var walkMemoryBudget = OwnerBudget()
    private(set) var trackedStatBudget = OwnerBudget()
    private struct TrackedStat {
        var inode: UInt64
        var startTime: UInt64
        var file: FileDescriptor
    }

    init(group: IOGroup, root: @escaping (ProcessIdentity) -> Pidfd?, tracked: @escaping (ProcessIdentity, Set<Int32>, Bool) -> [Pidfd]?,
         log: @escaping (LogEntry.Priority, UInt32?, String) -> Void) throws(Errno) {
        self.group = group
        self.root = root
        self.tracked = tracked
        record = log
    }

    /// A record about no app.
    func log(_ priority: LogEntry.Priority, _ message: String) { record(priority, nil, message) }

    /// A record about an app of `uid`'s, counted against that user's records as the model's
    /// are (`Daemon.logBurst` a window): what a user can make the enforcement say (its own
    /// app continued at every check, or forking as it is stopped) is bounded with the rest.
    func log(_ priority: LogEntry.Priority, about uid: UInt32, _ message: String) { record(priority, uid, message) }

    // MARK: Actions

    /// Notes what `app` is before acting on it: the unit cgroup at `unitPath` for a unit app
    /// (every process in it is the app's), `nil` for a process app (its tree).
    func adopt(_ app: ProcessIdentity, unitPath: String?) {
        units[app] = unitPath.flatMap(Cgroup.at(path:))
    }

    /// The cgroup a unit app is; `nil` for a process app.
    func unit(_ app: ProcessIdentity) -> Cgroup? { units[app] }

    func suspend(_ app: ProcessIdentity, uid: UInt32, command: String, mode: SuspendMode, at now: Int64) {
        defer { reportExcluded(app, uid: uid, command: command, action: "suspended") }
        // A unit app that may be frozen is frozen whole: no walk of its processes, however
        // many (a user's 5,000-process unit cost 1.1 s of loop time per suspension). So is one
        // set to be stopped with signals whose cgroups are more than a walk goes into (the
        // kernel's count, one read): a walk of them all cost uid 65534's unit above 5,000
        // empty cgroups it made ~150 ms per pass, and a bounded one would stop only some.
        // Watched is enough: an app whose process has exited since its last event is frozen,
        // and thawed when that exit is read (`forget`; its pidfd polls readable until then).
        // A poll of the pidfd here was a second one per `SetAppState` (`watchedApp` polls it).
        if let unit = unit(app), mode != .signal || ((try? unit.descendantCount()) ?? 0) >= Self.cgroupsPerLook,
           root(app) != nil, case let .success(cgroup) = ownCgroup(of: app, uid: uid, tree: { [] }, at: now) {
            if mode == .signal {
                log(.notice, about: uid, "App \(app) (\(command)) has more than \(Self.cgroupsPerLook - 1) cgroups below \(cgroup.directory); frozen instead of stopped with SIGSTOP")
            }
            return freeze(app, uid: uid, command: command, cgroup: cgroup, at: now)
        }
        // Why a `freezer` app falls back to signals, told once something is to be stopped (an
        // app gone before its exit was read fails the cgroup's checks too, and had nothing).
        var fallback: String?
        if mode == .freezer || (mode == .auto && (sharedCgroupUntil[app] ?? .min) <= now) {
            var walked: [Pidfd]?
            let own = ownCgroup(of: app, uid: uid, tree: { walked = members(of: app, uid: uid); return walked ?? [] }, at: now)
            if walked?.isEmpty == true { return }  // gone: its pidfd reports the exit
            switch own {
            case let .success(cgroup):
                sharedCgroupUntil[app] = nil
                return freeze(app, uid: uid, command: command, cgroup: cgroup, at: now)
            case let .failure(reason):
                sharedCgroupUntil[app] = now + Self.sharedCgroupRecheck
                if mode == .freezer { fallback = reason.text }
            }
        }
        func noteStopped() {
            if let fallback { log(.notice, about: uid, "App \(app) (\(command)) cannot be frozen: \(fallback); suspending with SIGSTOP") }
            note(app, (.signals, command, uid), at: now)
        }
        if queueStops(of: app, uid: uid, command: command, at: now) { return noteStopped() }
        let stopped = stopTree(app, uid: uid)
        guard !stopped.isEmpty else { return }  // gone: its pidfd reports the exit
        noteStopped()
        holdStops(app, stopped, again: false)
    }

    func resume(_ app: ProcessIdentity, uid: UInt32, at now: Int64) {
        let record = suspended[app]
        let held = takeHeldStops(app)
        note(app, nil, at: now)
        if let pending = takePendingFreeze(of: app) {
            try? setFrozen(false, pending.cgroup, of: app)
        }
        var thawed = false
        if case let .freezer(cgroup)? = record?.method {
            do {
                try setFrozen(false, cgroup, of: app)
                thawed = true
            } catch {
                log(.warning, about: uid, "App \(app): cannot thaw \(cgroup.directory): \(error)")
            }
        }
        // Stopped with signals (a freeze that fell back to them is `.signals`), or not by this
        // daemon, or its cgroup would not thaw: the tree is continued. A thawed app was frozen,
        // not stopped: a walk would find nothing to do (it was most of a thaw's time).
        if !thawed {
            if let held { continueHeld(held, uid: uid) } else { signalTree(app, uid: uid, Signal.continue) }
        }
        if let record { reportUnreached(app, uid: record.uid, command: record.command, action: "resumed") }
        forgetLeftOut()
    }

    /// Thaws, then sends `signal` to every process of the app. For a catchable signal the
    /// processes are remembered (by pidfd) so `kill` can finish the job.
    ///
    /// A frozen app's cgroup and a unit's are the app: killed whole, with no walk. A process
    /// app's tree is walked once, stopping it (it was walked twice: once to look for a cgroup
    /// of its own, once to stop it). That cgroup is looked for only for a catchable signal,
    /// for the grace's `kill` to end with: with `SIGKILL` the stopped tree is all there is.
    ///
    /// `adopting`: processes a previous daemon stopped for this termination (restored), held
    /// again if they are still those processes, and signalled with the rest: the app's own
    /// process may be gone, and they with it from any walk.
    func terminate(_ app: ProcessIdentity, uid: UInt32, command: String, signal: Int32, grace: Int64? = nil,
                   adopting: [ProcessIdentity] = [], at now: Int64) {
        defer { reportExcluded(app, uid: uid, command: command, action: "terminated") }
        let held = takeHeldStops(app)
        // A unit app whose own process is gone (its exit not read yet) is no app any more: its
        // unit's cgroup, a path, may hold the unit started again already (`Restart=`), which
        // nobody terminated — neither killed whole nor walked. One `poll(2)`.
        let gone = unit(app) != nil && root(app)?.hasExited != false
        let frozen = suspended[app].flatMap { if case let .freezer(c) = $0.method { c } else { nil } }
        let whole = gone ? nil : frozen ?? (unit(app) == nil ? nil : try? ownCgroup(of: app, uid: uid, tree: { [] }, at: now).get())
        note(app, nil, at: now)
        _ = takePendingFreeze(of: app)
        // What is left of a gone one is thawed, as its exit's `forget` would have.
        if gone, let frozen { try? setFrozen(false, frozen, of: app) }
        if let whole {
            try? setFrozen(false, whole, of: app)
            if signal == Signal.kill, (try? whole.kill()) != nil { return }
        }
        // Stop the whole tree first so nothing forks its way out, then thaw and signal. (A
        // unit's tree is its cgroup's: a gone one's is walked no more than it is killed.)
        let tree = gone ? [] : stopTree(app, uid: uid)
        let cgroup = whole ?? (signal == Signal.kill || tree.isEmpty || (sharedCgroupUntil[app] ?? .min) > now ? nil
            : try? ownCgroup(of: app, uid: uid, tree: { tree }, at: now).get())
        // A frozen process app's cgroup may hold processes that left its tree (a daemonized
        // child); a unit's are its walk's already.
        var known = Set(tree.map(\.pid))
        var pidfds = tree + (whole.flatMap { unit(app) == nil ? members(of: $0, uid: uid).filter { !known.contains($0.pid) } : nil } ?? [])
        // What its suspension stopped and the walk no longer finds (re-parented meanwhile) is
        // the app's all the same.
        known.formUnion(pidfds.map(\.pid))
        pidfds += (held ?? []).dropFirst().filter { !known.contains($0.pid) && Self.owner(uid, maySignal: $0) }
        known.formUnion(pidfds.map(\.pid))
        pidfds += Self.reproved(adopting.filter { !known.contains($0.pid) }).filter { Self.owner(uid, maySignal: $0) }
        let signalled = signal == Signal.kill ? nil : cgroup.flatMap { cgroup in cgroup.instance().map { SignalledCgroup(cgroup: cgroup, instance: $0) } }
        let stopping = Stopping(uid: uid, command: command, signal: signal, pidfds: pidfds, cgroup: signalled, next: now + Self.terminationStopSpacing,
                                signalBy: now + Self.signalBound(grace: signal == Signal.kill ? nil : grace), started: now)
        // A process app's tree (no cgroup to kill it whole): signalled once its stops took.
        guard whole == nil, unit(app) == nil, !pidfds.isEmpty, stoppingBudget.allows(pidfds.count, for: uid, within: heldStopLimits)
        else { return signalTermination(app, stopping, at: now) }
        stoppingForSignal[app] = stopping
        stoppingBudget.add(pidfds.count, for: uid)
        armTerminationStops(at: stopping.next)
        holds(app, Self.identities(of: pidfds))
    }

    /// Signals a termination's processes (`Stopping`) that their owner may still signal;
    /// a catchable signal is followed by `SIGKILL` after the grace (`kill`), and reported
    /// (`signalled`) when sent before it (`now`).
    private func signalTermination(_ app: ProcessIdentity, _ stopping: Stopping, at now: Int64?) {
        for pidfd in stopping.pidfds where Self.owner(stopping.uid, maySignal: pidfd) {
            if stopping.signal != Signal.kill { try? pidfd.send(signal: Signal.continue) }
            try? pidfd.send(signal: stopping.signal)
        }
        guard stopping.signal != Signal.kill else { return }
        terminating[app] = (stopping.pidfds, stopping.cgroup, false)
        guard let now else { return }
        holds(app, Self.identities(of: stopping.pidfds))
        signalled(app, now, stopping.cgroup)
    }

    /// Each process's identity, for a restarted daemon to re-prove; gone already: nothing to
    /// kill, and no identity to read (its start time 0).
    private static func identities(of pidfds: [Pidfd]) -> [ProcessIdentity] {
        pidfds.compactMap { pidfd in
            let identity = ProcessIdentity(pid: pidfd.pid, startTime: pidfd.startTime, inode: pidfd.inode)
            return identity.startTime == 0 ? nil : identity
        }
    }

    /// Pidfds for the processes that are still those saved: pid, start time and pidfs inode,
    /// read while the pidfd is held (pid ≤ 1 refused by `Pidfd.open`).
    private static func reproved(_ processes: [ProcessIdentity]) -> [Pidfd] {
        processes.compactMap { process in
            guard let pidfd = try? Pidfd.open(pid: process.pid), pidfd.startTime == process.startTime,
                  process.inode == 0 || pidfd.inode == process.inode else { return nil }
            return pidfd
        }
    }

    /// A termination a previous daemon signalled, or stopped for a `SIGKILL` it had not sent
    /// (restored): those of its processes that are still those processes (pid, start time
    /// and pidfs inode, read while a pidfd is held) are held for the grace's end or the
    /// bound (`kill`), as if this daemon had signalled them — one re-parented away from the
    /// app's tree included, which no walk from the app's own process would find — and the
    /// cgroup that was the app's whole, killed whole then if it is still the instance
    /// signalled (`kill` looks).
    func adoptSignalled(_ app: ProcessIdentity, _ processes: [ProcessIdentity], cgroup: SignalledCgroup?, bound: Bool = false) {
        let pidfds = Self.reproved(processes)
        guard terminating[app] == nil, !pidfds.isEmpty || cgroup != nil else { return }
        terminating[app] = (pidfds, cgroup, bound)
    }

    /// Processes of a terminated app found after its signal (a tracked app's forks, read as
    /// its own process exited within the grace: a handler's worker, or the child of a fork
    /// under way in another thread as the app stopped), which no walk will find: held with
    /// the rest for the grace's `SIGKILL` (each owner-checked then), and saved.
    func holdForGrace(_ app: ProcessIdentity, _ found: [Pidfd]) {
        guard var record = terminating[app] else { return }
        let known = Set(record.pidfds.map(\.pid))
        let more = found.filter { !known.contains($0.pid) }
        guard !more.isEmpty else { return }
        record.pidfds += more
        terminating[app] = record
        holds(app, Self.identities(of: record.pidfds))
    }

    /// Signals the terminations whose processes have all stopped (`terminate`), each once
    /// its processes' lists of children name none it does not hold: a fork under way as the
    /// walk stopped its parent finishes after the stop (the kernel gives up a fork for a
    /// fatal signal only), and its child joined the list after the walk read it; signalled
    /// with its parent, that child lived on, re-parented (a python forking beside 100 idle
    /// children, terminated 30 times: 23 lived on). Such a child is stopped then, with what it
    /// forked (a walk below each process held, each stopped before its children are read),
    /// and the termination waits for its stop in turn. A termination whose processes have
    /// not all stopped (one continued by someone else, or in the kernel for long) is
    /// signalled all the same at its bound (`signalBound`: the model's `terminationStopBound`,
    /// or half a catchable signal's grace), whose grace runs from then (`signalled`).
    /// Without `waiting` (the daemon is stopping) every termination is looked at and
    /// signalled now.
    ///
    /// What a look costs is bounded: a process found stopped is not read again (one its owner
    /// continues after that may fork its way out, as a double fork may), and a termination
    /// still waiting is looked at again after twice as long each time (1, 2, 4 … ms, at most
    /// `terminationStopSpacingAtMost`): uid 65534 keeping one of 2,000 processes running
    /// costs about 2,000 reads and a dozen looks at it, not 2,000 reads a millisecond.
    func signalStoppedTerminations(at now: Int64, waiting: Bool = true) {
        terminationStopsArmed = nil
        for app in Array(stoppingForSignal.keys) {
            guard var stopping = stoppingForSignal[app], !waiting || stopping.next <= now else { continue }
            while stopping.stopped < stopping.pidfds.count, Self.isPastFork(stopping.pidfds[stopping.stopped]) { stopping.stopped += 1 }
            let bounded = now >= stopping.signalBy
            if waiting, stopping.stopped < stopping.pidfds.count, !bounded {
                stopping.next = min(now + stopping.spacing, stopping.signalBy)
                stopping.spacing = min(2 * stopping.spacing, Self.terminationStopSpacingAtMost)
                stoppingForSignal[app] = stopping
                continue
            }
            if listsNameOthers(of: app, stopping.pidfds) {
                let known = Set(stopping.pidfds.map(\.pid))
                var walked: Set<Int32> = []
                let found = stopBelow(stopping.pidfds, uid: stopping.uid, known: &walked).filter { !known.contains($0.pid) }
                if !found.isEmpty {
                    log(.notice, about: stopping.uid, "App \(app) (\(stopping.command)): pid \(found.map { String($0.pid) }.joined(separator: ", ")) forked as the app was terminated, after its walk; stopped now, and terminated with it")
                    // Their stops to take in turn, within the owner's share (past it, signalled now).
                    let wait = waiting && !bounded && stoppingBudget.allows(found.count, for: stopping.uid, within: heldStopLimits)
                    stopping.pidfds += found
                    stoppingBudget.add(found.count, for: stopping.uid)
                    stopping.next = min(now + stopping.spacing, stopping.signalBy)
                    stoppingForSignal[app] = stopping
                    holds(app, Self.identities(of: stopping.pidfds))
                    if wait { continue }
                }
                reportExcluded(app, uid: stopping.uid, command: stopping.command, action: "terminated")
            }
            if waiting, bounded, stopping.stopped < stopping.pidfds.count {
                log(.notice, about: stopping.uid, "App \(app) (\(stopping.command)): not every process of it had stopped \(ConfigurationValue.formatTimeSpan(.nanoseconds(stopping.signalBy - stopping.started))) after its termination; signalled all the same\(stopping.signal == Signal.kill ? "" : ", its terminate grace from now")")
            }
            signalTermination(app, takeStopping(app)!, at: now)
        }
        if let next = stoppingForSignal.values.lazy.map(\.next).min() { armTerminationStops(at: next) }
    }

    /// Whether a process is past any fork: stopped, gone, or waiting for the child it
    /// `vfork`ed (which the walk found and stopped, keeping its parent waiting: a shell's
    /// loop suspended between a `vfork` and its `exec` waited for the stop until the grace
    /// ran out, and got its catchable signal with the `SIGKILL`).
    static func isPastFork(_ pidfd: Pidfd) -> Bool {
        guard let stat = try? ProcStat.read(pid: pidfd.pid), !"TtZX".contains(stat.state) else { return true }
        if stat.state == "D", ProcStat.waitsForVforkChild(pid: pidfd.pid) { return true }
        return pidfd.hasExited
    }

    /// How long a termination waits for its processes' stops at most: the model's
    /// `terminationStopBound` (with `SIGKILL`, its `kill` falls due then too); for a catchable
    /// signal no more than half its grace, so the signal goes out before the grace's first
    /// end, which the model then moves to the grace after the signal (`signalled`): a
    /// process kept running — continued by someone else, long in the kernel — costs the app
    /// at most this wait, never its handler's time.
    static func signalBound(grace: Int64?) -> Int64 {
        let bound = BackgroundModel.terminationStopBound.nanoseconds
        guard let grace else { return bound }
        return min(bound, max(0, grace / 2))
    }

    private func takeStopping(_ app: ProcessIdentity) -> Stopping? {
        guard let stopping = stoppingForSignal.removeValue(forKey: app) else { return nil }
        stoppingBudget.remove(stopping.pidfds.count, for: stopping.uid)
        return stopping
    }

    private func armTerminationStops(at instant: Int64) {
        guard instant < (terminationStopsArmed ?? .max) else { return }
        schedule(.terminationStops, instant)
        terminationStopsArmed = instant
    }

    /// The grace after a catchable terminate signal ran out: `SIGKILL` whatever is left.
    /// (A termination begun by a previous daemon has what `adoptSignalled` held, and its
    /// tree.)
    func kill(_ app: ProcessIdentity, uid: UInt32) {
        defer { forgetLeftOut() }
        // Its processes not all stopped by the bound (a `SIGKILL` termination's kill), or a
        // catchable signal still not sent when even the grace the model gave it again ran out
        // (`BackgroundModel.advance`: a daemon held up past the first, whose signal's bound
        // fell due in the same pass, is given it once more): signalled now (`SIGKILL`: that
        // is all; a catchable signal is followed by `SIGKILL` below).
        if let stopping = takeStopping(app) {
            log(.notice, about: uid, "App \(app) (\(stopping.command)): not every process of it had stopped when its \(stopping.signal == Signal.kill ? "termination's bound" : "terminate grace") ran out; signalled all the same")
            signalTermination(app, stopping, at: nil)
            if stopping.signal == Signal.kill { return }
        }
        let record = terminating.removeValue(forKey: app) ?? ([], nil, false)
        var survivors = record.pidfds.filter { !$0.hasExited }
        let cgroup = record.cgroup?.cgroup
        let now = cgroup?.instance()
        if let cgroup, let now, now != record.cgroup?.instance {
            // Not the cgroup the app was terminated in: its unit's manager started the unit
            // again within the grace (`Restart=`), a new app that nobody terminated. What
            // was signalled is killed, and what it forked since; not the cgroup whole.
            var known: Set<Int32> = []
            survivors = stopBelow(survivors, uid: uid, known: &known)
            log(.notice, about: uid, "App \(app): \(cgroup.directory) was started again within its terminate grace; SIGKILL to the \(survivors.count) process(es) left of those signalled and what they forked, not to the cgroup")
        } else {
            // The instance terminated (gone: its unit stopped, between instances, with
            // nothing in it to kill).
            if now != nil { try? cgroup?.kill() }
            // And anything the main process forked meanwhile (gone, it has no tree to walk:
            // a unit's walk would be of its cgroup, started again there maybe).
            if let root = root(app), !root.hasExited { survivors += stopTree(app, uid: uid) }
        }
        // Only what the owner may still signal: a process of the app may have become
        // another user's during the grace (a setuid program), as at the signal itself.
        survivors.removeAll { !Self.owner(uid, maySignal: $0) }
        for pidfd in survivors { try? pidfd.send(signal: Signal.kill) }
        if !survivors.isEmpty {
            log(.warning, about: uid, "App \(app) still had \(survivors.count) process(es) after the \(record.bound ? "termination's bound" : "terminate grace"); sent SIGKILL")
        }
    }

    /// The app's own process is gone: nothing is left to resume, except what a frozen
    /// cgroup would keep frozen with nobody left to thaw it (the rest of a unit).
    func forget(_ app: ProcessIdentity, at now: Int64) {
        if let held = takeHeldStops(app), let record = suspended[app] {
            // Stopped with it: continued, not left stopped for ever with nobody to resume them.
            let continued = continueHeld(held.dropFirst(), uid: record.uid, root: false)
            if continued > 0 {
                log(.notice, about: record.uid, "App \(app) (\(record.command)) exited while suspended; \(continued) of the processes stopped with it continued")
            }
            forgetLeftOut()
        }
        if case let .freezer(cgroup)? = suspended[app]?.method { try? setFrozen(false, cgroup, of: app) }
        if let pending = takePendingFreeze(of: app) { try? setFrozen(false, pending.cgroup, of: app) }
        units[app] = nil
        sharedCgroupUntil[app] = nil
        forgetWalks(of: app)
        note(app, nil, at: now)
        freezerWatches[app] = nil
    }

    /// Whether the app looks suspended: its own process stopped, or its own cgroup frozen.
    func isStopped(_ app: ProcessIdentity, uid: UInt32) -> Bool {
        sendQueuedStops()  // first: a look at an app sees what was decided for it
        defer { forgetLeftOut() }
        guard let root = root(app), let stat = try? ProcStat.read(pid: root.pid), stat.startTime == app.startTime else {
            return false
        }
        if stat.state == "T" { return true }
        guard let cgroup = try? ownCgroup(of: app, uid: uid, tree: { members(of: app, uid: uid) }, at: nil).get() else { return false }
        return (try? cgroup.isFrozen()) == true
    }

    /// Resumes every app this daemon suspended (it is stopping).
    func resumeAll(at now: Int64) -> [ProcessIdentity] {
        let apps = suspended.map { ($0.key, $0.value.uid) } + pendingFreezes.filter { suspended[$0.key] == nil }.map { ($0.key, $0.value.uid) }
        for (app, uid) in apps { resume(app, uid: uid, at: now) }
        return apps.map(\.0)
    }

    // MARK: Signals

    /// The app's processes, each held by a pidfd: a unit app's whole cgroup, a process app's
    /// tree (empty once its own process is gone). For an unprivileged owner, only those it
    /// could signal itself (the others are noted in `excluded`, for one log line per action).
    ///
    /// `visit` is called on each member of a process app before its children are read
    /// (`ProcessTree`): stopping it there makes one walk catch every fork. It returns whether
    /// the process is still there (a signal sent through its pidfd says so: `ESRCH`), which
    /// spares an app (tracked or walked) a poll of its own process's pidfd per action.
    func members(of app: ProcessIdentity, uid: UInt32, visit: ((Pidfd) -> Bool)? = nil,
                 memory: ProcessTree.Memory? = nil) -> [Pidfd] {
        guard let root = root(app) else { return [] }
        if let unit = unit(app) { return members(of: unit, uid: uid) }
        var left: [Int32] = [], unopened: [Int32] = []
        defer {
            excluded.formUnion(left)
            unreached.formUnion(unopened)
        }
        let owner = uid == 0 ? nil : uid
        let own = ownPID
        if let followed = tracked(app, [root.pid], false) {
            var known: Set<Int32> = [ownPID]
            return followedMembers(of: app, root: root, next: [root] + followed, known: &known, owner: owner,
                                   excluded: &left, visit: visit)
        }
        let guarded = visit.map { visit in { (pidfd: Pidfd) in pidfd.pid == own || visit(pidfd) } }
        return ProcessTree.members(of: root, owner: owner, excluded: &left, unreached: &unopened, visit: guarded,
                                   memory: memory).filter { $0.pid != own }
    }

    /// A tracked app's members: its own process and the tracker's set, no walk (the tracker
    /// has read every fork of a member since it followed the app, in order). The set as
    /// read so far is visited first, then the events waiting are read and what they add is
    /// visited, until a read adds nothing: a member stopped by `visit` forks no more, so a
    /// fork made before its stop is in that read (one read per app when nothing forked; a
    /// read before the first visit found only what the read after it finds too). A fork
    /// whose event is read only after the app was stopped is stopped then (`forked`). With
    /// `owner`, only the processes that uid may signal itself.
    ///
    /// `next`: what to visit first; `known`: the pids visited (or left out) already. Without
    /// `reading`, nothing is read: the caller reads later (`finishStops`).
    private func followedMembers(of app: ProcessIdentity, root: Pidfd, next first: [Pidfd], known: inout Set<Int32>,
                                 owner: UInt32?, excluded: inout [Int32], visit: ((Pidfd) -> Bool)?,
                                 reading: Bool = true) -> [Pidfd] {
        // Its own process gone: nothing (its pidfd reports the exit). A visit tells by its
        // signal; without one, the pidfd is polled.
        if visit == nil, root.hasExited { return [] }
        var members: [Pidfd] = []
        var next = first
        for _ in 0..<Self.maximumStopPasses {
            for pidfd in next where known.insert(pidfd.pid).inserted {
                if let owner, !ProcessTree.belongs(pidfd, to: owner) {
                    // As a walk: nothing of a root that is not the owner's (or is gone).
                    if pidfd.pid == root.pid {
                        if !root.hasExited { excluded.append(root.pid) }
                        return []
                    }
                    excluded.append(pidfd.pid)
                    continue
                }
                if let visit, !visit(pidfd) {
                    if pidfd.pid == root.pid { return [] }
                    continue
                }
                members.append(pidfd)
            }
            guard reading else { break }
            next = tracked(app, known, true) ?? []
            if next.isEmpty { break }
        }
        return members
    }

    /// Queues the suspension of a tracked app (its own process and the tracker's set as read
    /// so far) for `sendQueuedStops`; false for an app the tracker does not follow (a unit,
    /// a `tree` app: stopped now, by a walk that must stop each process before it reads its
    /// children). A pass's suspensions are signalled together at its end: a burst's 9,872
    /// `SIGSTOP`s sent one per call, between the calls' other work, cost the daemon 19 %
    /// more CPU per app and its bursts 12–15 % more time than sent in one loop (the same
    /// rounds in turns, the kernel's DAMON sampling waited out). Nothing is read or checked
    /// here; `sendQueuedStops` checks each process against the owner just before its signal,
    /// as a walk does.
    private func queueStops(of app: ProcessIdentity, uid: UInt32, command: String, at now: Int64) -> Bool {
        guard unit(app) == nil, let root = root(app), let followed = tracked(app, [root.pid], false) else { return false }
        // Every member, unchecked and unsignalled (a visit that keeps each spares a poll of
        // the root's pidfd).
        var known: Set<Int32> = [ownPID], left: [Int32] = []
        let members = followedMembers(of: app, root: root, next: [root] + followed, known: &known, owner: nil,
                                      excluded: &left, visit: { _ in true }, reading: false)
        queuedStops.append(QueuedStops(app: app, uid: uid, command: command, members: members, at: now))
        unreadStops[app] = known
        return true
    }

    /// Sends the stops queued since the last call, app by app in the order suspended: what
    /// `stopTree` would have done at each suspension. Each process is checked against an
    /// unprivileged owner just before its signal; an app whose own process is not the
    /// owner's, or is gone (`ESRCH`), is not suspended after all, and nothing more of it is
    /// signalled (its pidfd reports an exit). An app no longer suspended with signals (resumed,
    /// terminated or gone later in the pass: each of those forgets the suspension first) is
    /// skipped. Called before anything reporting a suspension goes out (`finishStops`) and
    /// before a look at the apps' processes (`checkStops`, `isStopped`, `forked`).
    func sendQueuedStops() {
        guard !queuedStops.isEmpty else { return }
        let queued = queuedStops
        queuedStops = []
        for entry in queued where suspended[entry.app]?.method == .signals {
            guard let root = root(entry.app) else { continue }
            // The members as queued, checked and stopped as `stopTree` would have (nothing
            // read: the pass's one read is `finishStops`'s); none when the root is not the
            // owner's or is gone.
            var known: Set<Int32> = [ownPID], left: [Int32] = []
            let stopped = followedMembers(of: entry.app, root: root, next: entry.members, known: &known,
                                          owner: entry.uid == 0 ? nil : entry.uid, excluded: &left,
                                          visit: { $0.trySend(signal: Signal.stop) }, reading: false)
            if stopped.isEmpty {
                note(entry.app, nil, at: entry.at)
                unreadStops[entry.app] = nil
            } else {
                setTrackedCheckCost(of: entry.app, processes: stopped.count, held: 0)
            }
            excluded.formUnion(left)
            reportExcluded(entry.app, uid: entry.uid, command: entry.command, action: "suspended")
        }
    }

    /// The queued stops are sent (`sendQueuedStops`), then the last read of every tracked
    /// app suspended since the previous call is made, once for all of them: the members they
    /// forked before their stops are stopped too, as each app's own read would have (a
    /// burst of 10,000 suspensions read the connector once per app, nearly always finding
    /// nothing). Called before anything that reports a suspension goes out (`Daemon.commit`,
    /// and a connection's flush when it becomes writable). An app resumed or gone meanwhile
    /// is left alone. Returns whether it read after stops (tracked apps were suspended).
    @discardableResult
    func finishStops() -> Bool {
        sendQueuedStops()
        guard !unreadStops.isEmpty else { return false }
        let apps = unreadStops
        unreadStops = [:]
        var reading = true  // the first read drains the connector for all
        for (app, before) in apps {
            guard let record = suspended[app], record.method == .signals, let root = root(app) else { continue }
            guard let added = tracked(app, before, reading) else { continue }  // no longer followed
            reading = false
            guard !added.isEmpty else { continue }
            var known = before, left: [Int32] = []
            _ = followedMembers(of: app, root: root, next: added, known: &known, owner: record.uid == 0 ? nil : record.uid,
                                excluded: &left, visit: { $0.trySend(signal: Signal.stop) })
            excluded.formUnion(left)
            reportExcluded(app, uid: record.uid, command: record.command, action: "suspended")
        }
        return true
    }

    /// The tracker read a fork into `app`: if the app is suspended with signals, the child
    /// is stopped too, provided it is still the child of that member (not re-parented, not a
    /// recycled pid) and its owner could signal it. Anything else is left to the stray check.
    func forked(into app: ProcessIdentity, parent: Int32, child: Pidfd) {
        sendQueuedStops()  // first: the parent is stopped before its child
        guard let record = suspended[app], record.method == .signals, child.pid != ownPID,
              let info = child.info, info.parentPID == parent,
              record.uid == 0 || info.uids.signallable(by: record.uid) else { return }
        try? child.send(signal: Signal.stop)
    }

    /// Logs, once per action, the processes of an app's tree that its owner could not signal.
    func reportExcluded(_ app: ProcessIdentity, uid: UInt32, command: String, action: String) {
        defer { forgetLeftOut() }
        reportUnreached(app, uid: uid, command: command, action: action)
        guard !excluded.isEmpty else { return }
        let pids = excluded.sorted().map(String.init).joined(separator: ", ")
        log(.warning, about: uid, "App \(app) (\(command)): pid \(pids) not \(action): the app's owner could not signal it, and bgtaskd does not lend it the right")
    }

    /// Logs the processes of the app the action could not reach for want of descriptors.
    func reportUnreached(_ app: ProcessIdentity, uid: UInt32, command: String, action: String) {
        if cgroupsUnread {
            log(.warning, about: uid, "App \(app) (\(command)): the processes in its cgroups past the first \(Self.cgroupsPerLook) not \(action): bgtaskd reads no more per action (the owner makes them)")
        }
        guard !unreached.isEmpty else { return }
        log(.warning, about: uid, "App \(app) (\(command)): \(unreached.count) of its processes not \(action), or not looked into for children: bgtaskd is out of descriptors (one is held per process for the length of an action; raise its LimitNOFILE=); they are tried again at the next action")
    }

    /// Drops what the last look at an app left out (`excluded`, `unreached`), unreported:
    /// after a look that reports nothing, so that it is not told of the next app acted on.
    func forgetLeftOut() {
        excluded = []
        unreached = []
        cgroupsUnread = false
    }

    /// Keeps `stopped` (a process app's, `stopTree`'s) for the app's resumption; `again`
    /// (a stray `SIGCONT`'s re-stop, which finds what the members forked meanwhile) adds it to
    /// what its suspension kept, if that was kept. Nothing is kept for a unit app (its cgroup
    /// is its members), after a walk that left members unreached (this action's), or past
    /// `heldStopLimits` (in all, or the owner's): that app's resumption walks. Called once
    /// the suspension is noted (its owner is the record's).
    func holdStops(_ app: ProcessIdentity, _ stopped: [Pidfd], again: Bool) {
        let earlier = takeHeldStops(app)
        guard let uid = suspended[app]?.uid, unit(app) == nil, unreached.isEmpty, !stopped.isEmpty, !again || earlier != nil
        else { return }
        var held = stopped
        if let earlier, again {
            let known = Set(stopped.map(\.pid))
            held += earlier.dropFirst().filter { !known.contains($0.pid) && !$0.hasExited }
        }
        guard heldStopBudget.allows(held.count, for: uid, within: heldStopLimits) else { return }
        heldStops[app] = (uid, held, nil)
        heldStopBudget.add(held.count, for: uid)
    }

    /// The kept processes' `/proc/PID/stat` files, opened at the app's first check (not on
    /// the suspension's path: 400 opens were a locked session's suspension 3–6 ms later,
    /// `scripts/bench-lock`) and held until its resumption (and on to its next suspension,
    /// where its walk memory holds the process): a descriptor each, within the bound of the
    /// pidfds beside them; one that would take the spare below the limit is not held (that
    /// process is read by path).
    private func keptStats(of app: ProcessIdentity) -> [FileDescriptor?] {
        guard let held = heldStops[app] else { return [] }
        if let stats = held.stats { return stats }
        let room = Self.heldDescriptorRoom
        // Held with what the app's walks hold, where they hold the process: from one
        // suspension to the next, as its lists of children (400 opens a lock, and as many
        // closes at its unlock, for a locked session's windows).
        let memory = walkMemories[app]?.memory
        let stats = held.pidfds.map { pidfd -> FileDescriptor? in
            func open() -> FileDescriptor? {
                guard let stat = pidfd.openStat(), stat.rawValue < room else { return nil }
                return stat
            }
            return memory.map { $0.stat(of: pidfd, open: open) } ?? open()
        }
        heldStops[app]?.stats = stats
        heldStatCount += stats.count { $0 != nil }
        return stats
    }

    private func takeHeldStops(_ app: ProcessIdentity) -> [Pidfd]? {
        guard let held = heldStops.removeValue(forKey: app) else { return nil }
        heldStopBudget.remove(held.pidfds.count, for: held.uid)
        heldStatCount -= held.stats?.count { $0 != nil } ?? 0
        return held.pidfds
    }

    /// Sends `SIGCONT` to what a suspension kept (`holdStops`), the app's own process first
    /// (`root`): as a walk from it would, nothing if an unprivileged owner could not signal
    /// that one itself now; each other process checked so too (left out: `excluded`). Returns
    /// how many were sent it.
    @discardableResult
    func continueHeld(_ held: some Collection<Pidfd>, uid: UInt32, root: Bool = true) -> Int {
        var sent = 0
        for (index, pidfd) in held.enumerated() {
            if !Self.owner(uid, maySignal: pidfd) {
                if !pidfd.hasExited { excluded.insert(pidfd.pid) }
                if root, index == 0 { return 0 }
                continue
            }
            if (try? pidfd.send(signal: Signal.continue)) != nil { sent += 1 }
        }
        return sent
    }

    /// Stops every process of the app; returns the pidfds of the processes stopped. A process
    /// app's tree in one walk, each process stopped before its children are read (see
    /// `ProcessTree.members`); a unit's cgroup pass after pass until no new process appears
    /// (a stopped process cannot fork, but its cgroup's list has no order to walk in).
    /// A process app's walk reads what its last walk held (`walkMemories`) and holds what it
    /// finds for the next.
    @discardableResult
    func stopTree(_ app: ProcessIdentity, uid: UInt32) -> [Pidfd] {
        guard unit(app) != nil else {
            let memory = takeWalkMemory(app)
                ?? ProcessTree.Memory(holdBelow: Self.heldDescriptorRoom,
                                      processesAtMost: walkMemoryBudget.room(for: uid, within: heldStopLimits))
            defer { keepWalkMemory(app, uid: uid, memory) }
            return members(of: app, uid: uid, visit: { $0.trySend(signal: Signal.stop) }, memory: memory)
        }
        var stopped: [Int32: Pidfd] = [:]
        for _ in 0..<Self.maximumStopPasses {
            var found = false
            for pidfd in members(of: app, uid: uid) where stopped[pidfd.pid] == nil {
                try? pidfd.send(signal: Signal.stop)
                stopped[pidfd.pid] = pidfd
                found = true
            }
            if !found { break }
        }
        return Array(stopped.values)
    }

    /// Takes the app's walk memory out of `walkMemories`, for a walk (`keepWalkMemory` after).
    private func takeWalkMemory(_ app: ProcessIdentity) -> ProcessTree.Memory? {
        guard let (uid, memory, counted) = walkMemories.removeValue(forKey: app) else { return nil }
        walkMemoryBudget.remove(counted, for: uid)
        return memory
    }

    /// Keeps what a walk of the app held for its next walk, within `heldStopLimits` (past
    /// them, it is let go: closed), for an app still watched (one forgotten meanwhile, its
    /// process gone, is not).
    private func keepWalkMemory(_ app: ProcessIdentity, uid: UInt32, _ memory: ProcessTree.Memory) {
        guard memory.count > 0, root(app) != nil, walkMemoryBudget.allows(memory.count, for: uid, within: heldStopLimits)
        else { return }
        walkMemories[app] = (uid, memory, memory.count)
        walkMemoryBudget.add(memory.count, for: uid)
    }

    /// Lets go of what the app's walks held (it is no longer watched, or has exited).
    func forgetWalks(of app: ProcessIdentity) { _ = takeWalkMemory(app) }

    func signalTree(_ app: ProcessIdentity, uid: UInt32, _ signal: Int32) {
        for pidfd in members(of: app, uid: uid) { try? pidfd.send(signal: signal) }
    }

    /// The processes in `cgroup` (in at most `cgroupsPerLook` of its cgroups), but the
    /// daemon, that the owner could signal itself; what was left out is noted for the
    /// action's report (`excluded`, `unreached`, `cgroupsUnread`).
    func members(of cgroup: Cgroup, uid: UInt32) -> [Pidfd] {
        var left: [Int32] = [], unopened: [Int32] = [], complete = true
        defer {
            excluded.formUnion(left)
            unreached.formUnion(unopened)
            if !complete { cgroupsUnread = true }
        }
        return ProcessTree.members(of: cgroup, owner: uid == 0 ? nil : uid, excluded: &left, unreached: &unopened,
                                   cgroupsAtMost: Self.cgroupsPerLook, complete: &complete).filter { $0.pid != ownPID }
    }

    /// Notes how `app` is suspended (`nil`: it is not).
    func note(_ app: ProcessIdentity, _ record: (method: Method, command: String, uid: UInt32)?, at now: Int64) {
        suspended[app] = record
        if record?.method != .signals {
            _ = takeHeldStops(app)
            setTrackedCheckCost(of: app, processes: nil)
            _ = takeTrackedStats(app)
        }
        if case .freezer? = record?.method {} else if freezerWatches[app]?.held == false { freezerWatches[app] = nil }
        if record?.method == .signals { signalSuspended.insert(app) } else { signalSuspended.remove(app) }
        armStopCheck(at: now)
    }

    // MARK: Stray SIGCONT

    /// Looks at a few signal-suspended apps (a sweep over all of them takes
    /// `stopCheckInterval`): one found running was continued by someone else, and is stopped
    /// again. An app whose suspension kept what it stopped (`holdStops`) is those processes'
    /// states, read with no walk; a re-parented one continued is found so too (a walk from
    /// the app's process no longer reaches it). Not found: a process forked by a kept one
    /// continued meanwhile that was stopped again by someone else before the check. Such an
    /// app's first check also looks for the child of a fork under way as it was stopped
    /// (`forkedWhileStopped`).
    func checkStops(at now: Int64) {
        sendQueuedStops()  // first: an app suspended in this pass is not found running for want of its stop
        stopCheckArmed = false
        stopChecksInRow += 1
        if sweep.isEmpty { sweep = Array(signalSuspended) }
        var cost = 0
        while cost < Self.stopCheckBudget, let app = sweep.popLast() {
            guard let record = suspended[app], record.method == .signals else { continue }
            let running: ProcStat?
            let held = heldStops[app]
            if let held {
                // The first check opens the files (about a read by path each), later ones read them.
                let first = held.stats == nil
                cost += Self.readCost(processes: held.pidfds.count, held: held.stats?.count { $0 != nil } ?? 0)
                running = Self.firstRunning(held.pidfds, stats: keptStats(of: app), owner: record.uid)
                if running == nil, first {
                    cost += held.pidfds.count * Self.pathReadCost  // a read of each one's list of children
                    if let whole = forkedWhileStopped(app, kept: held.pidfds, uid: record.uid) {
                        holdStops(app, whole, again: true)
                    }
                    continue
                }
            } else if trackedCheckCosts[app] != nil {
                let members = members(of: app, uid: record.uid)
                cost += Self.readCost(processes: members.count, held: min(members.count, trackedStats[app]?.files.count ?? 0))
                let stats = trackedStatFiles(of: app, uid: record.uid, members)
                setTrackedCheckCost(of: app, processes: members.count, held: stats.count { $0 != nil })
                running = Self.firstRunning(members, stats: stats, owner: nil)
            } else {
                cost += Self.unkeptAppCost
                running = Self.firstRunning(members(of: app, uid: record.uid), owner: nil)
            }
            guard let running else { continue }
            log(.warning, about: record.uid, "App \(app) (\(record.command)) was resumed while suspended (pid \(running.pid) is '\(running.state)', a stray SIGCONT?); stopping it again")
            holdStops(app, stopAgain(app, kept: held?.pidfds, uid: record.uid), again: true)
        }
        forgetLeftOut()
        armStopCheck(at: now)
    }

    /// What a fork under way as the suspension's walk stopped its parent added, looked for at
    /// the app's first check, once the stops have taken (every kept process stopped: no fork
    /// under way any more). Such a fork finishes after the stop (the kernel gives up a fork
    /// for a fatal signal only) and can put its child on the list after the walk read it (a
    /// python forking flat out, suspended 60 times: a child missed in 2–18); that child ran
    /// on through the suspension. The kept processes' lists of children are read, and only
    /// if one names a process not kept is the tree walked again, each process found stopped
    /// before its children are read (a read of each list is about half a walk's system
    /// calls). Returns the tree walked, for `holdStops` (`again`: the next check looks once
    /// more, for the forks of what this one found), if it found a process the suspension
    /// did not keep; nil if not.
    private func forkedWhileStopped(_ app: ProcessIdentity, kept: [Pidfd], uid: UInt32) -> [Pidfd]? {
        guard listsNameOthers(of: app, kept) else { return nil }
        let known = Set(kept.map(\.pid))
        let walked = stopTree(app, uid: uid)
        let found = walked.filter { !known.contains($0.pid) }
        guard let record = suspended[app], !found.isEmpty else { return nil }
        log(.notice, about: record.uid, "App \(app) (\(record.command)): pid \(found.map { String($0.pid) }.joined(separator: ", ")) forked as the app was suspended, after its walk; stopped now")
        return walked
    }

    /// Whether the lists of children of `processes` (each stopped, so past any fork) name a
    /// process not among them: the child of a fork under way as a walk stopped its parent.
    /// Read through the files the app's walks held, where they hold the process (a list read
    /// by path for the others; one that cannot be read counts as naming one). A zombie not
    /// yet reaped is listed too: then the walk this leads to finds nothing new.
    private func listsNameOthers(of app: ProcessIdentity, _ processes: [Pidfd]) -> Bool {
        let known = Set(processes.map(\.pid))
        let memory = walkMemories[app]?.memory
        return processes.contains { pidfd in
            let children = memory.map { $0.children(of: pidfd) } ?? ProcessTree.children(of: pidfd.pid)
            return children?.contains { !known.contains($0) } ?? true
        }
    }

    /// Stops the app again after a stray `SIGCONT`: its tree (`stopTree`), then, below each
    /// kept process the walk did not reach (re-parented while stopped), that process's own
    /// tree, each process stopped before its children are read, as a walk does. Nothing if
    /// the walk reached nothing (the app's own process gone, or no longer the owner's).
    private func stopAgain(_ app: ProcessIdentity, kept: [Pidfd]?, uid: UInt32) -> [Pidfd] {
        let stopped = stopTree(app, uid: uid)
        guard let kept, !stopped.isEmpty else { return stopped }
        var known = Set(stopped.map(\.pid))
        return stopped + stopBelow(kept.dropFirst(), uid: uid, known: &known)
    }

    /// Stops, below each of `processes` not `known` and not gone, that process's own tree,
    /// each process stopped before its children are read (as a walk does; an unprivileged
    /// owner's only what it could signal itself); returns what it stopped, now `known`.
    private func stopBelow(_ processes: some Collection<Pidfd>, uid: UInt32, known: inout Set<Int32>) -> [Pidfd] {
        var stopped: [Pidfd] = []
        var left: [Int32] = [], unopened: [Int32] = []
        defer {
            excluded.formUnion(left)
            unreached.formUnion(unopened)
        }
        for pidfd in processes where !known.contains(pidfd.pid) && !pidfd.hasExited {
            for member in ProcessTree.members(of: pidfd, owner: uid == 0 ? nil : uid, excluded: &left, unreached: &unopened,
                                              visit: { $0.pid == self.ownPID || $0.trySend(signal: Signal.stop) })
            where member.pid != ownPID && known.insert(member.pid).inserted {
                stopped.append(member)
            }
        }
        return stopped
    }

    /// Notes what a tracked app's stray check costs (`nil`: it is not checked).
    private func setTrackedCheckCost(of app: ProcessIdentity, processes: Int?, held: Int = 0) {
        let cost = processes.map { Self.readCost(processes: $0, held: held) }
        trackedCheckCost += (cost ?? 0) - (trackedCheckCosts[app] ?? 0)
        trackedCheckCosts[app] = cost
    }

    /// The held `/proc/PID/stat` of each of a tracked app's `members` (`trackedStats`),
    /// opened for those that have none yet; those of processes no longer listed are closed.
    /// One that would take the spare below the limit is not held (that process is read by
    /// path), as `keptStats`.
    private func trackedStatFiles(of app: ProcessIdentity, uid: UInt32, _ members: [Pidfd]) -> [FileDescriptor?] {
        let before = takeTrackedStats(app)
        var kept: [Int32: TrackedStat] = [:]
        let room = Self.heldDescriptorRoom
        let files = members.map { pidfd -> FileDescriptor? in
            if let held = before[pidfd.pid], held.inode == pidfd.inode, held.startTime == pidfd.startTime {
                kept[pidfd.pid] = held
                return held.file
            }
            guard trackedStatBudget.allows(kept.count + 1, for: uid, within: heldStopLimits),
                  let file = pidfd.openStat(), file.rawValue < room else { return nil }
            kept[pidfd.pid] = TrackedStat(inode: pidfd.inode, startTime: pidfd.startTime, file: file)
            return file
        }
        if !kept.isEmpty {
            trackedStats[app] = (uid, kept)
            trackedStatBudget.add(kept.count, for: uid)
        }
        return files
    }

    /// Takes a tracked app's held stat files out of `trackedStats` (closed when dropped).
    private func takeTrackedStats(_ app: ProcessIdentity) -> [Int32: TrackedStat] {
        guard let (uid, files) = trackedStats.removeValue(forKey: app) else { return [:] }
        trackedStatBudget.remove(files.count, for: uid)
        return files
    }

    /// The first of `processes` that runs or sleeps. 'D' is no sign of a resumption: a shell
    /// that vforked a child stopped before its exec waits for it uninterruptibly for as long
    /// as it is stopped, and a process continued while in 'D' shows 'R' or 'S' at a later
    /// look. A state read of a process whose pidfd reports an exit (its pid may be another's
    /// by now) is not its; with `owner`, one that uid could no longer signal (a kept process
    /// that ran a setuid program) is not the app's either, as in a walk.
    /// `stats`, where given, are the processes' `/proc/PID/stat` held open: read with no
    /// open, and no look at the pidfd (a held file's read fails once its process is gone).
    static func firstRunning(_ processes: [Pidfd], stats: [FileDescriptor?] = [], owner: UInt32?) -> ProcStat? {
        for (index, pidfd) in processes.enumerated() {
            let held = index < stats.count ? stats[index] : nil
            guard let stat = held.map({ try? ProcStat.read(held: $0) }) ?? (try? ProcStat.read(pid: pidfd.pid)),
                  !"TtZXD".contains(stat.state), held != nil || !pidfd.hasExited,
                  owner.map({ Self.owner($0, maySignal: pidfd) }) ?? true else { continue }
            return stat
        }
        return nil
    }

    /// What reading `processes` states costs, `held` of them from held files (`stopCheckBudget`'s units).
    static func readCost(processes: Int, held: Int) -> Int {
        held + (processes - held) * pathReadCost
    }

    /// Whether an app's owner could signal a process the app's suspension kept: root any, an
    /// unprivileged uid only while the process is still one it may signal (a kept process that
    /// ran a setuid program since is no longer the app's, as in a walk). The one check of what
    /// is kept, for the termination, the resumption and the stray check alike.
    static func owner(_ uid: UInt32, maySignal pidfd: Pidfd) -> Bool {
        uid == 0 || ProcessTree.belongs(pidfd, to: uid)
    }

    /// How long after a check the next one comes, for a sweep whose reads cost `cost`.
    static func stopCheckSpacing(cost: Int) -> Int64 {
        let checks = Int64(max(1, (cost + stopCheckBudget - 1) / stopCheckBudget))
        return max(minimumStopCheckSpacing, stopCheckInterval / checks)
    }

    /// The next check armed while an app is suspended with signals, disarmed when none is: an
    /// idle daemon does not wake.
    private func armStopCheck(at now: Int64) {
        if signalSuspended.isEmpty {
            if stopCheckArmed { schedule(.stopCheck, nil) }
            stopCheckArmed = false
            stopChecksInRow = 0
        } else if !stopCheckArmed {
            if stopChecksInRow > 0, stopChecksInRow < Self.stopChecksBackToBack, !sweep.isEmpty {
                schedule(.stopCheck, now + 1)  // the next pass: the rest of the row
            } else {
                let unkept = max(0, signalSuspended.count - heldStops.count - trackedCheckCosts.count)
                let cost = Self.readCost(processes: heldStopBudget.total, held: heldStatCount) + unkept * Self.unkeptAppCost + trackedCheckCost
                schedule(.stopCheck, now + Self.stopCheckSpacing(cost: cost) * Int64(max(1, stopChecksInRow)))
                stopChecksInRow = 0
            }
            stopCheckArmed = true
        }
    }
}

/// Things the daemon holds for apps (descriptors), counted in all and by the apps' owner, so
/// that both stay within limits (`Enforcer.heldStopLimits`). The count in all is kept beside
/// the owners' (summing those at each look would cost a pass over the users).
struct OwnerBudget {
    private(set) var total = 0
    private(set) var byUser: [UInt32: Int] = [:]

    /// Whether `count` more for `uid` stay within `limits`, in all and for that owner.
    func allows(_ count: Int, for uid: UInt32, within limits: (all: Int, perUser: Int)) -> Bool {
        total + count <= limits.all && byUser[uid, default: 0] + count <= limits.perUser
    }

    /// How many more `uid` may have within `limits` (0 when none).
    func room(for uid: UInt32, within limits: (all: Int, perUser: Int)) -> Int {
        max(0, min(limits.all - total, limits.perUser - byUser[uid, default: 0]))
    }

    mutating func add(_ count: Int, for uid: UInt32) {
        total += count
        byUser[uid, default: 0] += count
    }

    mutating func remove(_ count: Int, for uid: UInt32) {
        total -= count
        let left = byUser[uid, default: 0] - count
        byUser[uid] = left > 0 ? left : nil
    }
}
