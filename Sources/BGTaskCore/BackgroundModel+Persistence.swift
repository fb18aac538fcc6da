// SPDX-License-Identifier: Apache-2.0
/// What survives a daemon restart (DESIGN.md §5: the state lives in `$RUNTIME_DIRECTORY`):
/// every app and task with its deadlines, processes waiting for their `SIGKILL`, and the
/// next task id. Deadlines are `CLOCK_MONOTONIC` instants, which run on across a restart
/// of the daemon (not of the machine: the daemon checks the boot id).
public struct SavedApp: Equatable, Sendable {
    public var identity: ProcessIdentity
    public var uid: UInt32
    public var command: String
    public var unit: String?
    public var containment: Containment
    /// What its daily background time is kept by, and since when it has been counting.
    public var quotaKey: String?
    public var holdingSince: Instant?
    /// The key its scheduled requests are kept by.
    public var requestKey: String?
    public var state: AppState
    public var phase: BackgroundPhase?
    public var deadline: Instant?
    public var transitionDeadline: Instant?
    public var warned: Bool

    public init(identity: ProcessIdentity, uid: UInt32, command: String, unit: String? = nil,
                containment: Containment = .tree, state: AppState, phase: BackgroundPhase?,
                deadline: Instant?, transitionDeadline: Instant?, warned: Bool) {
        self.identity = identity
        self.uid = uid
        self.command = command
        self.unit = unit
        self.containment = containment
        self.quotaKey = nil
        self.holdingSince = nil
        self.requestKey = nil
        self.state = state
        self.phase = phase
        self.deadline = deadline
        self.transitionDeadline = transitionDeadline
        self.warned = warned
    }
}

public struct SavedTask: Equatable, Sendable {
    public var id: TaskID
    public var app: ProcessIdentity
    public var owner: ProcessIdentity
    public var name: String
    public var expirationHandler: Bool
    /// Begun with `more`: it ends with its connection, which a restart closes.
    public var connectionBound: Bool
    public var created: Instant
    public var state: TaskState
    public var grantAt: Instant
    public var ageWarned: Bool

    public init(id: TaskID, app: ProcessIdentity, owner: ProcessIdentity, name: String, expirationHandler: Bool,
                connectionBound: Bool, created: Instant, state: TaskState, grantAt: Instant, ageWarned: Bool) {
        self.id = id
        self.app = app
        self.owner = owner
        self.name = name
        self.expirationHandler = expirationHandler
        self.connectionBound = connectionBound
        self.created = created
        self.state = state
        self.grantAt = grantAt
        self.ageWarned = ageWarned
    }
}

/// The whole saved state, as read back.
public struct SavedState: Equatable, Sendable {
    public var apps: [ProcessIdentity: SavedApp] = [:]
    public var tasks: [TaskID: SavedTask] = [:]
    /// Terminated processes and when their `SIGKILL` is due.
    public var terminating: [ProcessIdentity: Termination] = [:]
    /// Background time used per app key (`BackgroundModel+Quota`).
    public var quota: [String: [QuotaInterval]] = [:]
    /// Scheduled requests per app key (`BackgroundModel+Requests`).
    public var requests: [String: SavedRequests] = [:]
    public var nextTaskID: TaskID = 1
    /// How long the machine had slept since it booted when this was saved: the instants of
    /// scheduled requests and quota records count that sleep (`machineSlept`); `nil` from a
    /// daemon that did not count it.
    public var sleep: Duration?

    public init() {}

    /// Applies a change, as read back from the state file's log.
    public mutating func apply(_ change: SavedProcessChange) {
        switch change {
        case let .app(app):
            apps[app.identity] = app
            terminating[app.identity] = nil
        case let .terminating(process, termination):
            apps[process] = nil
            terminating[process] = termination
        case let .gone(process):
            apps[process] = nil
            terminating[process] = nil
        }
    }

    public mutating func apply(_ change: SavedTaskChange) {
        switch change {
        case let .task(task): tasks[task.id] = task
        case let .gone(id): tasks[id] = nil
        }
    }

    /// Renames every process through `identify` (a file written before pidfs identities
    /// names processes without their inode: the daemon fills it in from the live process).
    public mutating func reidentify(_ identify: (ProcessIdentity) -> ProcessIdentity) {
        apps = Dictionary(apps.values.map { app in
            var app = app
            app.identity = identify(app.identity)
            return (app.identity, app)
        }, uniquingKeysWith: { first, _ in first })
        for id in tasks.keys {
            tasks[id]!.app = identify(tasks[id]!.app)
            tasks[id]!.owner = identify(tasks[id]!.owner)
        }
        terminating = Dictionary(terminating.map { (identify($0.key), $0.value) }, uniquingKeysWith: { first, _ in first })
    }
}

/// A process sent a terminate signal: when its `SIGKILL` is due, the uid of the app it was
/// (so a restart re-proves it before acting), a catchable signal's grace (`nil` for
/// `SIGKILL`), which runs from the signal (`BackgroundModel.terminationSignalled`), that
/// signal until the daemon has sent it (`unsent`: a restart sends it, `unsentTerminations`),
/// and the processes it went to (`signalled`: a restarted daemon, which holds none of them,
/// kills those it can re-prove when the grace ends — re-parented ones too, which no walk
/// from the app's own process finds; before the signal, those stopped for it, which a
/// restarted daemon signals), and the cgroup that was the app's whole (`cgroup`: a
/// unit's, or a process app's own), which the grace's end kills whole if it is still the
/// one signalled.
public struct Termination: Equatable, Sendable {
    public var killAt: Instant
    public var uid: UInt32
    public var grace: Duration?
    public var unsent: TerminateSignal?
    public var signalled: [ProcessIdentity]
    public var cgroup: TerminatedCgroup?

    public init(killAt: Instant, uid: UInt32, grace: Duration? = nil, unsent: TerminateSignal? = nil,
                signalled: [ProcessIdentity] = [], cgroup: TerminatedCgroup? = nil) {
        self.killAt = killAt
        self.uid = uid
        self.grace = grace
        self.unsent = unsent
        self.signalled = signalled
        self.cgroup = cgroup
    }
}

/// A cgroup a catchable termination is to kill whole when its grace ends: its path below
/// the hierarchy's mount point (as `/proc/PID/cgroup` shows it) and which cgroup was there
/// when the app was signalled — the directory's inode (the kernel's cgroup id, never reused
/// while the machine runs) and its unit's invocation where systemd set one. Another cgroup
/// at that path by then (the unit started again) is not killed.
public struct TerminatedCgroup: Equatable, Sendable {
    public var path: String
    public var inode: UInt64
    public var invocation: [UInt8]?

    public init(path: String, inode: UInt64, invocation: [UInt8]? = nil) {
        self.path = path
        self.inode = inode
        self.invocation = invocation
    }
}

/// How one process's saved record changed.
public enum SavedProcessChange: Equatable, Sendable {
    case app(SavedApp)
    case terminating(ProcessIdentity, Termination)
    /// Neither an app nor terminating any more.
    case gone(ProcessIdentity)
}

/// How one task's saved record changed.
public enum SavedTaskChange: Equatable, Sendable {
    case task(SavedTask)
    case gone(TaskID)
}

extension BackgroundModel {
    /// The id the next task gets.
    public var nextTaskIdentifier: TaskID { nextTaskID }

    /// Whether anything changed since the last `takeChanges()` or `takeQuotaChanges()`.
    public var hasUnsavedChanges: Bool { mutating get { apps.hasChanges || tasks.hasChanges || !quotaChanged.isEmpty || !requestChanges.isEmpty || sleepChanged } }

    /// What changed since the last call: the daemon writes these before it carries out the
    /// effects, so what is on disk is never behind what was done to a process.
    public mutating func takeChanges() -> (processes: [SavedProcessChange], tasks: [SavedTaskChange]) {
        var processes: [SavedProcessChange] = []
        var tasks: [SavedTaskChange] = []
        takeChanges(process: { processes.append($0) }, task: { tasks.append($0) })
        return (processes, tasks)
    }

    /// The same, each change handed over as it is read: the daemon writes them out without
    /// the two arrays (an allocation and a free on every call's pass, callgrind).
    public mutating func takeChanges(process: (SavedProcessChange) -> Void, task: (SavedTaskChange) -> Void) {
        // Plain loops over records read where they lie: closures over `self` here were handed
        // a copy of the whole model, and the getter a copy of each record (callgrind: ~5,000
        // instructions per app backgrounded).
        for identity in apps.changedKeys {
            if let app = apps.peek(identity, { Self.saved($0) }) {
                process(.app(app))
            } else if let termination = terminating[identity] {
                process(.terminating(identity, termination))
            } else {
                process(.gone(identity))
            }
        }
        for id in self.tasks.changedKeys {
            task(self.tasks.peek(id, { Self.saved($0) }).map { .task($0) } ?? .gone(id))
        }
        apps.clearChanges()
        self.tasks.clearChanges()
    }

    /// Everything, for rewriting the state file from scratch.
    public func savedState() -> SavedState {
        var state = SavedState()
        for app in apps.values { state.apps[app.identity] = Self.saved(app) }
        for task in tasks.values { state.tasks[task.id] = Self.saved(task) }
        state.terminating = terminating
        state.quota = quotaUsage
        state.requests = requestBook
        state.nextTaskID = nextTaskID
        state.sleep = sleepCounted
        return state
    }

    static func saved(_ app: AppRecord) -> SavedApp {
        var saved = SavedApp(identity: app.identity, uid: app.uid, command: app.command, unit: app.unit,
                             containment: app.containment, state: app.state, phase: app.phase,
                             deadline: app.deadline, transitionDeadline: app.transitionDeadline, warned: app.warned)
        saved.quotaKey = app.quotaKey
        saved.holdingSince = app.holdingSince
        saved.requestKey = app.requestKey
        return saved
    }

    static func saved(_ task: TaskRecord) -> SavedTask {
        SavedTask(id: task.id, app: task.app, owner: task.owner, name: task.name, expirationHandler: task.expirationHandler,
                  connectionBound: task.connection != nil, created: task.created, state: task.state,
                  grantAt: task.grantAt, ageWarned: task.ageWarned)
    }

    /// Takes over the state a previous daemon saved, into a model with no apps. Every
    /// process in it is watched again (the daemon reports those that died meanwhile as
    /// exited), timers are armed at their saved instants (`advance(to:)` then fires those
    /// that passed while no daemon ran, in order) but for a background app's warning and
    /// deadline (rule 7a, below), and what a restart necessarily ends,
    /// ends: tasks bound to a connection, and transitions whose subscriber was connected.
    /// `policy` gives each app its policy before its timers are armed (policies are not saved:
    /// they are matched again, and a warning instant depends on the app's policy).
    /// `reconnection`: how long after a restart a client library may take to be back (its
    /// backoff's longest); what rule 7a owes an app runs from then. Returns how many
    /// background apps' deadlines moved later: rule 7a across a restart, below.
    @discardableResult
    public mutating func restore(_ saved: SavedState, at now: Instant, reconnection: Duration = .zero,
                                 policy: (SavedApp) -> AppPolicy? = { _ in nil }, effects: inout [Effect]) -> Int {
        precondition(apps.count == 0 && tasks.count == 0, "restore into a model with no apps")
        nextTaskID = max(nextTaskID, saved.nextTaskID, (saved.tasks.keys.max() ?? 0) + 1)
        sleepCounted = saved.sleep
        // Keys of an older daemon that named no uid (units' were shared by every user) are
        // not kept: users must never share quota.
        for (key, intervals) in saved.quota where Self.quotaOwner(ofKey: key) != nil { setQuotaUsage(key, intervals) }
        quotaChanged.removeAll()
        var moved = 0
        for app in saved.apps.values.sorted(by: { $0.identity.pid < $1.identity.pid }) {
            let unit = app.unit.flatMap { appsByUnit[$0] == nil ? $0 : nil }
            var record = AppRecord(identity: app.identity, uid: app.uid, command: app.command, unit: unit,
                                   containment: unit == nil && app.containment == .unit ? .tree : app.containment)
            record.state = app.state
            record.phase = app.state == .background ? (app.phase ?? .running) : nil
            record.transitionDeadline = app.transitionDeadline
            record.warned = app.warned
            record.epoch = 1
            record.quotaKey = app.quotaKey
            record.policy = policy(app)
            record.holdingSince = app.holdingSince
            record.requestKey = app.requestKey
            // Rule 7a across a restart: time in which no daemon ran takes no app's warning. A
            // background app not warned yet has at least its warning's length left once its
            // library can be back (`reconnection`; one whose warning fell due meanwhile is
            // warned then, its warning timer at `deadline − lead`); one warned has at least the
            // minimum grace from then, for the task ends its library kept while the daemon was
            // away. Warnings off: as saved.
            let settings = settings(record)
            let lead = settings.expirationWarning
            let least = lead == .zero ? .zero : (app.warned ? Self.periodLength(.zero, settings) : lead) + reconnection
            record.deadline = app.deadline.map { app.state == .background && least > .zero ? max($0, now + least) : $0 }
            if record.deadline != app.deadline { moved += 1 }
            if let key = app.quotaKey, app.holdingSince != nil { quotaHolders[key, default: []].insert(app.identity) }
            insertApp(record)
            effects.append(.watch(app.identity))
            guard app.state == .background, let deadline = record.deadline else { continue }
            if !app.warned { timers.insert(.warning(app.identity, epoch: 1), at: max(now, deadline - lead)) }
            timers.insert(.deadline(app.identity, epoch: 1), at: deadline)
            if record.phase == .transition, let transitionDeadline = app.transitionDeadline {
                timers.insert(.transitionTimeout(app.identity, epoch: 1), at: transitionDeadline)
            }
        }
        let previousConnections = ConnectionID(0)
        for task in saved.tasks.values.sorted(by: { $0.id < $1.id }) where apps[task.app] != nil && task.state.isActive {
            let uid = apps[task.app]!.uid
            let record = TaskRecord(id: task.id, app: task.app, uid: uid, owner: task.owner,
                                    connection: task.connectionBound ? previousConnections : nil, name: task.name,
                                    expirationHandler: task.expirationHandler, created: task.created,
                                    state: task.state, grantAt: task.grantAt, ageWarned: task.ageWarned)
            let watched = needsWatch(task.owner)
            tasks[task.id] = record
            tasksPerUID[WordKey(uid), default: 0] += 1
            apps[unsaved: task.app]?.taskIDs.append(task.id)
            if task.owner != task.app { tasksByOwner.insert(task.id, under: task.owner) }
            if task.connectionBound { tasksByConnection.insert(task.id, under: previousConnections) }
            settleWatch(task.owner, before: watched, effects: &effects)
            if task.state == .pending { timers.insert(.grant(task.id), at: task.grantAt) }
            if !task.ageWarned { ageQueue.append((task.id, task.created)) }
        }
        ageQueue.sort { $0.created < $1.created }
        // Requests, as for quota, only of keys that name their uid.
        for (key, book) in saved.requests where Self.quotaOwner(ofKey: key) == book.uid { setBook(book, of: key) }
        for app in apps.values {
            guard let key = app.requestKey, requestBook[key] != nil else { continue }
            requestKeyOfApp[app.identity] = key
            appOfRequestKey[key] = app.identity
        }
        requestChanges.removeAll()
        replan(at: now)
        for (process, var termination) in saved.terminating where apps[process] == nil {
            let watched = needsWatch(process)
            // A catchable signal the previous daemon had not sent (it waited for the
            // processes' stops): the daemon sends it now, within half its grace
            // (`unsentTerminations`), so no `SIGKILL` comes before the grace from now.
            if termination.unsent != nil, let grace = termination.grace { termination.killAt = max(termination.killAt, now + grace) }
            terminating[process] = termination
            apps.touch(process)
            timers.insert(.kill(process), at: termination.killAt)
            settleWatch(process, before: watched, effects: &effects)
        }
        // The restart closed every connection: the same as each closing (rule 9) and each
        // subscriber leaving mid-transition.
        connectionClosed(previousConnections, at: now, effects: &effects)
        for app in apps.values where app.phase == .transition {
            finishTransition(of: app.identity, at: now, effects: &effects)
        }
        return moved
    }
}

extension SavedApp {
    /// The app with the key its scheduled requests are kept by.
    public func withRequests(key: String?) -> SavedApp {
        var app = self
        app.requestKey = key
        return app
    }

    /// The app with its quota record (read back from the state file).
    public func withQuota(key: String?, holdingSince: Instant?) -> SavedApp {
        var app = self
        app.quotaKey = key
        app.holdingSince = holdingSince
        return app
    }
}
