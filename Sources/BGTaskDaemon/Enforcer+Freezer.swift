// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Glibc

/// The cgroup v2 freezer: which cgroup is an app's own to freeze, freezing it, confirming
/// the freeze by `cgroup.events` (watched in the daemon's epoll group), the fallback to
/// signals when the kernel does not confirm within `freezeBound`, and a thaw nobody asked for.
extension Enforcer {
    enum NotOwn: Error {
        case reason(String)
        var text: String { if case let .reason(text) = self { text } else { "" } }
    }

    /// The app's cgroup — a unit app's unit; a process app's cgroup if every process in it
    /// (and below it) belongs to the app and every process of the app is in it — if (for an
    /// unprivileged owner) it is delegated to the owner: what the owner could freeze itself.
    /// `tree`, the app's processes, is asked for only once the cgroup could be the app's
    /// (not the root, delegated, not the daemon's): a cgroup that cannot be costs no walk (a
    /// session of 200 windows in a service not delegated to its user walked each app twice
    /// at its first suspension in `auto`, and again at each one `sharedCgroupRecheck` later).
    func ownCgroup(of app: ProcessIdentity, uid: UInt32, tree: () -> [Pidfd], at now: Int64?) -> Result<Cgroup, NotOwn> {
        guard Cgroup.mountPoint != nil, let cgroup = unit(app) ?? Cgroup.of(pid: app.pid) else {
            return .failure(.reason("no cgroup v2 hierarchy"))
        }
        guard !cgroup.isRoot else { return .failure(.reason("it is in the root cgroup")) }
        if uid != 0 {
            guard let owner = try? cgroup.freezeOwner(parents: parents), owner == uid else {
                return .failure(.reason("\(cgroup.directory) is not delegated to uid \(uid)"))
            }
        }
        if daemonCgroup(at: now)?.isWithin(cgroup) == true {
            return .failure(.reason("it shares \(cgroup.directory) with bgtaskd"))
        }
        if unit(app) != nil { return .success(cgroup) }  // the unit is the app, whatever is in it
        let tree = Set(tree().map(\.pid))
        // A shared cgroup (a session's: hundreds of processes) is told by its first stranger,
        // not by the list of all of them (`Cgroup.firstProcess`); without one, every member
        // was looked at. The cgroups below are the owner's to make: a look goes into at most
        // `cgroupsPerLook` (uid 65534's app above 5,000 empty ones held the loop ~150 ms at
        // every suspension, measured).
        var members: [Int32] = []
        do {
            switch try cgroup.firstProcess(where: { members.append($0); return !tree.contains($0) }, cgroupsAtMost: Self.cgroupsPerLook) {
            case let .found(stranger):
                return .failure(.reason("it shares \(cgroup.directory) with pid \(stranger), which is not part of the app"))
            case .tooManyCgroups:
                return .failure(.reason("it has more than \(Self.cgroupsPerLook - 1) cgroups below \(cgroup.directory)"))
            case .none: break
            }
        } catch {
            return .failure(.reason("cannot read \(cgroup.directory)/cgroup.procs"))
        }
        if let outside = tree.first(where: { !members.contains($0) }) {
            return .failure(.reason("its pid \(outside) is outside \(cgroup.directory)"))
        }
        return .success(cgroup)
    }

    /// The daemon's own cgroup, read again once a second (at `nil`: now): a burst of
    /// suspensions asked /proc/self/cgroup once per app.
    func daemonCgroup(at now: Int64?) -> Cgroup? {
        if let now, let known = knownDaemonCgroup, now < known.until { return known.cgroup }
        let cgroup = Cgroup.of(pid: ownPID)
        if let now { knownDaemonCgroup = (cgroup, now + 1_000_000_000) }
        return cgroup
    }

    func freeze(_ app: ProcessIdentity, uid: UInt32, command: String, cgroup: Cgroup, at now: Int64) {
        do {
            if freezerWatches[app]?.cgroup == cgroup {
                freezerWatches[app]?.reported = false  // a unit's, held since its watch
            } else {
                // Opened before the write: kernfs reports (`EPOLLPRI`) every change of the
                // file after its open, so a freeze that completes before the watch is added is
                // still reported when it is, and nothing need be read now. (A read right after
                // the write found `frozen 0` nearly always, and with the read of the report it
                // was a fifth of the daemon's time in a burst of freezes: `perf`.)
                freezerWatches[app] = try watch(cgroup, of: app, held: false)
            }
            try setFrozen(true, cgroup, of: app)
            note(app, (.freezer(cgroup), command, uid), at: now)
            // The kernel freezes asynchronously: confirmed by cgroup.events, or the bound passes.
            pendingFreezes[app] = PendingFreeze(cgroup: cgroup, command: command, uid: uid)
            schedule(.freeze(app), now + Self.freezeBound)
        } catch {
            if error.code == EMFILE || error.code == ENFILE, holdsFreezes {
                yieldHeldFreezes()
                return freeze(app, uid: uid, command: command, cgroup: cgroup, at: now)
            }
            log(.notice, about: uid, "App \(app) (\(command)) cannot be frozen: \(error); suspending with SIGSTOP")
            try? setFrozen(false, cgroup, of: app)
            let stopped = stopTree(app, uid: uid)
            note(app, (.signals, command, uid), at: now)
            holdStops(app, stopped, again: false)
        }
    }

    /// Freezes or thaws `cgroup`, the app's: through its held `cgroup.freeze` when it has one,
    /// else opening the file from its parent's descriptor.
    func setFrozen(_ frozen: Bool, _ cgroup: Cgroup, of app: ProcessIdentity) throws(Errno) {
        if let watch = freezerWatches[app], let freeze = watch.freeze, watch.cgroup == cgroup {
            return try Cgroup.setFrozen(frozen, through: freeze)
        }
        try cgroup.setFrozen(frozen, parents: parents)
    }

    /// `cgroup.events` of the app's cgroup, opened and added to the daemon's group.
    private func watch(_ cgroup: Cgroup, of app: ProcessIdentity, held: Bool) throws(Errno) -> FreezerWatch {
        let events = try cgroup.openEvents(parents: parents)
        let source = try group.add(events.rawValue, events: IOEvents.priority) { [unowned self] _ in
            self.freezerChanged(app)
        }
        return FreezerWatch(cgroup: cgroup, events: events, source: source, held: held)
    }

    /// Holds a unit app's `cgroup.events` open and watched from now until it exits (or is no
    /// app), and its `cgroup.freeze` open for writing: its freezes and thaws then open no
    /// file (each open of a kernfs file walks its path and allocates its file: the two opens
    /// were 29 % of the daemon's time in a burst of 9,872 freezes, and the one left, with its
    /// close, 20 %: `perf`). Two descriptors per unit app, beside its pidfd: the first is one
    /// a freeze held anyway while the app was suspended.
    /// Neither takes the last `spareDescriptors`; without them (or an open failed), a freeze
    /// opens its own.
    func watchUnit(_ app: ProcessIdentity, path: String) {
        guard freezerWatches[app] == nil, let cgroup = Cgroup.at(path: path) else { return }
        let room = Self.heldDescriptorRoom
        guard var watch = try? watch(cgroup, of: app, held: true), watch.events.rawValue < room else {
            // Looked up now, so that the first freeze's open finds `cgroup.freeze` in the
            // dentry cache: a kernfs file's first lookup allocates its dentry and inode (20 µs
            // for an open and close by path then, 12 after, in a loop over 5,000 new cgroups).
            _ = try? cgroup.freezeOwner(parents: parents)
            return
        }
        if holdsFreezes, let freeze = try? cgroup.openFreeze(parents: parents), freeze.rawValue < room { watch.freeze = freeze }
        freezerWatches[app] = watch
    }

    /// The daemon ran out of descriptors (a connection refused, a freeze that could not open
    /// its file): every held `cgroup.freeze` is let go, and none is held from then on. They
    /// only spare opens; an app's pidfd, a suspended app's `cgroup.events` and a connection
    /// need the descriptors. (The rule of `spareDescriptors` looks at one registration; a
    /// burst of suspensions of unit apps registered without room takes one more each.)
    func yieldHeldFreezes() {
        guard holdsFreezes else { return }
        holdsFreezes = false
        var yielded = 0
        for (app, watch) in freezerWatches where watch.freeze != nil {
            freezerWatches[app]?.freeze = nil
            yielded += 1
        }
        guard yielded > 0 else { return }
        log(.notice, "The cgroup.freeze files of \(yielded) unit app(s) let go for want of descriptors: each freeze and thaw opens its own from now on (raise LimitNOFILE= to have them held again after a restart)")
    }

    /// The app is no longer watched (`unwatch`): its held `cgroup.events` is let go (when it
    /// is not suspended; else when it is resumed).
    func unwatchUnit(_ app: ProcessIdentity) {
        guard freezerWatches[app]?.held == true else { return }
        freezerWatches[app]?.held = false
        if suspended[app] == nil { freezerWatches[app] = nil }
    }

    /// The pending freeze of `app`, removed, and its wait disarmed.
    func takePendingFreeze(of app: ProcessIdentity) -> PendingFreeze? {
        guard let pending = pendingFreezes.removeValue(forKey: app) else { return nil }
        schedule(.freeze(app), nil)
        return pending
    }

    /// The kernel had `freezeBound` to report `frozen 1`: if it has not, signals instead.
    func freezeWaitEnded(_ app: ProcessIdentity, at now: Int64) {
        guard let pending = pendingFreezes.removeValue(forKey: app) else { return }
        if (try? pending.cgroup.isFrozen()) == true { return }
        log(.notice, about: pending.uid, "App \(app) (\(pending.command)): \(pending.cgroup.directory) not frozen within \(Self.freezeBound / 1_000_000)ms; suspending with SIGSTOP")
        try? setFrozen(false, pending.cgroup, of: app)
        let stopped = stopTree(app, uid: pending.uid)
        note(app, (.signals, pending.command, pending.uid), at: now)
        holdStops(app, stopped, again: false)
    }

    /// A watched app's `cgroup.events` changed: a freeze confirmed, a thaw nobody asked for,
    /// or (for a held one) anything else, such as `populated`.
    func freezerChanged(_ app: ProcessIdentity) {
        guard let watch = freezerWatches[app] else { return }
        // Reading the watched descriptor acknowledges the change, or kernfs keeps polling ready.
        // A read that fails (`ENODEV`: the cgroup was removed) ends the watch: nothing more
        // can come from it (a pending freeze falls back to signals when its bound passes).
        guard let events = try? watch.events.readFromStart(upTo: 4096) else {
            freezerWatches[app] = nil
            return
        }
        guard case let .freezer(cgroup)? = suspended[app]?.method else { return }
        let frozen = Cgroup.isFrozen(events: events)
        if frozen {
            _ = takePendingFreeze(of: app)
            return
        }
        // `frozen 0` with the daemon's `1` in `cgroup.freeze`: a freeze under way. With `0`
        // there, someone thawed it — also while its freeze was pending: the kernel's `frozen 1`
        // and the owner's thaw can come before the daemon reads the first report (CI: the
        // thaw was taken for a freeze under way, and no freeze followed).
        guard (try? cgroup.freezeRequested()) == false else { return }
        if !watch.reported, let record = suspended[app] {
            freezerWatches[app]?.reported = true
            log(.warning, about: record.uid, "App \(app) (\(record.command)) was thawed while suspended (\(cgroup.directory)/cgroup.freeze set to 0 by someone else, or its slice thawed); freezing it again")
        }
        try? setFrozen(true, cgroup, of: app)
        // systemd stopping a frozen unit thaws it, then sends its kill signal: frozen again,
        // the app could never act on it. Looked at once the signal has had time to come.
        scheduleAfter(.thawCheck(app), Self.thawCheckDelay)
    }

    /// How long after a thaw by someone else a frozen app is looked at for a signal to stop
    /// (systemd sends it microseconds after its thaw; the daemon may freeze the app first).
    static let thawCheckDelay: Int64 = 50_000_000

    /// The signal to stop (`SIGTERM`, `SIGINT`, `SIGHUP` or `SIGQUIT`: what a `KillSignal=`
    /// is) pending on a process of `app`, a frozen app thawed by someone else and frozen
    /// again; `nil` if none (or the app is no longer frozen by the daemon). Looks at the
    /// first `stopLookProcesses` processes of at most `cgroupsPerLook` cgroups, stopping at
    /// the first with one: systemd signals every process of the unit (its main one alone
    /// with `KillMode=mixed`, the first listed as a rule), and an owner thawing a unit of
    /// thousands of processes over and over costs a bounded look each time.
    func stopSignalPending(_ app: ProcessIdentity) -> Int32? {
        guard case let .freezer(cgroup)? = suspended[app]?.method else { return nil }
        var signal: Int32?
        var left = Self.stopLookProcesses
        _ = try? cgroup.firstProcess(where: { pid in
            left -= 1
            signal = ProcStatus.pendingStopSignal(pid: pid)
            return signal != nil || left == 0
        }, cgroupsAtMost: Self.cgroupsPerLook)
        return signal
    }

    static let stopLookProcesses = 64
}
