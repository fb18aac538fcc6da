/// The background-execution model: every app and task, and the rules of DESIGN.md §2.
///
/// A value the daemon feeds events to, with time as an argument. Each mutating call appends
/// what the daemon must do to `effects`; `nextDeadline()` says when to call `advance(to:)`.
/// Nothing here reads a clock or touches the OS.
public struct BackgroundModel {
    struct AppRecord {
        let identity: ProcessIdentity
        let uid: UInt32
        let command: String
        var state: AppState = .foreground
        var phase: BackgroundPhase?
        /// When background time runs out; set while background.
        var deadline: Instant?
        /// When an unfinished transition is terminated; set while in `transition`.
        var transitionDeadline: Instant?
        /// Whether the expiration warning went out for this background period.
        var warned = false
        /// Bumped on every change between foreground and background; timers armed in an
        /// earlier period are stale.
        var epoch: UInt64 = 0
        var subscribers = 0
        /// Active tasks, oldest first.
        var taskIDs: [TaskID] = []
    }

    struct TaskRecord {
        let id: TaskID
        let app: ProcessIdentity
        let owner: ProcessIdentity
        let connection: ConnectionID?
        let name: String
        let expirationHandler: Bool
        let created: Instant
        var state: TaskState = .pending
        var grantAt: Instant
        /// Its age warning went out (so it is no longer in `ageQueue`).
        var ageWarned = false
    }

    /// The configuration in force; `reload` replaces it.
    public private(set) var configuration: Configuration
    /// Whether to emit debug log records (every task granted and ended). Off, they are not
    /// even formatted: they would cost more than the call they describe.
    public var debugLogging = true
    var apps = ChangeTracked<ProcessIdentity, AppRecord>()
    /// Active tasks only: a task that ends is forgotten (its names live on in history).
    var tasks = ChangeTracked<TaskID, TaskRecord>()
    var tasksByOwner: [ProcessIdentity: Set<TaskID>] = [:]
    var tasksByConnection: [ConnectionID: Set<TaskID>] = [:]
    /// Processes sent a catchable terminate signal, and when their grace runs out (the
    /// `SIGKILL`). Changes are noted in `apps`, whose entry for the process is gone.
    var terminating: [ProcessIdentity: Instant] = [:]
    var timers = TimerQueue()
    /// Tasks in creation order, for the age warning. Its delay is one constant, so the
    /// deadlines come in this order: a queue, not heap entries that would outlive their
    /// tasks by TaskAgeWarningSec. Ended tasks at the front are dropped at once.
    var ageQueue: [(id: TaskID, created: Instant)] = []
    var ageQueueHead = 0
    /// Entries in `ageQueue` whose task has ended; compacted away once they are half.
    var ageQueueDead = 0
    /// Apps per state, kept as states change, so a status line costs nothing.
    public private(set) var stateCounts: [AppState: Int] = [:]
    var nextTaskID: TaskID = 1
    var random: SplitMix64

    /// A model with no apps. `seed` draws the grant latencies (`GrantLatencySeed`, or random).
    public init(configuration: Configuration, seed: UInt64) {
        self.configuration = configuration
        self.random = SplitMix64(seed: configuration.grantLatencySeed ?? seed)
    }

    /// Replaces the configuration. Running deadlines keep the budget they started with;
    /// the next background period uses the new one.
    public mutating func reload(_ configuration: Configuration) {
        if configuration.grantLatencySeed != self.configuration.grantLatencySeed,
           let seed = configuration.grantLatencySeed {
            random = SplitMix64(seed: seed)
        }
        self.configuration = configuration
    }

    // MARK: Apps

    /// The registered app that is `process` or one of its ancestors.
    public func app(containing process: ProcessDescription) -> ProcessIdentity? {
        if apps[process.identity] != nil { return process.identity }
        return process.ancestors.first { apps[$0] != nil }
    }

    /// The app containing `process`, registering the process as a new foreground app when
    /// none does (rule 1).
    public mutating func register(_ process: ProcessDescription, at now: Instant,
                                  effects: inout [Effect]) throws(BGTaskError) -> ProcessIdentity {
        if let existing = app(containing: process) { return existing }
        guard process.identity.pid > 1 else {
            throw .invalidParameter("pid \(process.identity.pid) cannot be managed")
        }
        guard apps.count < configuration.maxApps else {
            throw .limitExceeded("MaxApps=\(configuration.maxApps) reached")
        }
        let identity = process.identity
        let watched = needsWatch(identity)
        apps[identity] = AppRecord(identity: identity, uid: process.uid, command: process.command)
        count(from: nil, to: .foreground)
        settleWatch(identity, before: watched, effects: &effects)
        effects.append(.log(LogEntry(priority: .info, kind: .appRegistered,
                                     message: "App \(identity) (\(process.command)) registered in the foreground",
                                     app: identity, command: process.command)))
        return identity
    }

    /// The app's snapshot at `now`, or `nil` if there is no such app.
    public func snapshot(of app: ProcessIdentity, at now: Instant) -> AppSnapshot? {
        apps[app].map { snapshot($0, at: now) }
    }

    /// Every app, by pid.
    public func listApps(at now: Instant) -> [AppSnapshot] {
        apps.values.map { snapshot($0, at: now) }.sorted { $0.identity.pid < $1.identity.pid }
    }

    /// Active tasks, of one app or of all, by id.
    public func listTasks(of app: ProcessIdentity? = nil, at now: Instant) -> [TaskSnapshot] {
        let ids = app.map { apps[$0]?.taskIDs ?? [] } ?? Array(tasks.keys)
        return ids.sorted().compactMap { tasks[$0].map { snapshot($0, at: now) } }
    }

    /// Number of registered apps.
    public var appCount: Int { apps.count }
    /// Number of active tasks.
    public var taskCount: Int { tasks.count }

    /// Background time left: `nil` in the foreground (unlimited), zero once suspended.
    public func backgroundTimeRemaining(of app: ProcessIdentity, at now: Instant) -> Duration? {
        guard let record = apps[app] else { return nil }
        return remaining(record, at: now)
    }

    func remaining(_ app: AppRecord, at now: Instant) -> Duration? {
        switch app.state {
        case .foreground: return nil
        case .suspended, .terminated: return .zero
        case .background: return max(.zero, (app.deadline ?? now) - now)
        }
    }

    func snapshot(_ app: AppRecord, at now: Instant) -> AppSnapshot {
        AppSnapshot(identity: app.identity, uid: app.uid, command: app.command, state: app.state,
                    phase: app.phase, taskCount: app.taskIDs.count,
                    backgroundTimeRemaining: remaining(app, at: now), subscribed: app.subscribers > 0)
    }

    func snapshot(_ task: TaskRecord, at now: Instant, reason: TaskReason? = nil) -> TaskSnapshot {
        TaskSnapshot(id: task.id, app: task.app, owner: task.owner, uid: apps[task.app]?.uid ?? 0,
                     name: task.name, state: task.state, reason: reason, age: max(.zero, now - task.created),
                     expirationHandler: task.expirationHandler)
    }

    /// Keeps `stateCounts` in step with a state change (`nil`: not an app).
    mutating func count(from old: AppState?, to new: AppState?) {
        if let old { stateCounts[old, default: 0] -= 1 }
        if let new { stateCounts[new, default: 0] += 1 }
    }

    // MARK: Process watching

    /// Whether the daemon must watch `process` for its exit: it is an app, owns a task, or
    /// is being terminated.
    func needsWatch(_ process: ProcessIdentity) -> Bool {
        apps[process] != nil || !(tasksByOwner[process]?.isEmpty ?? true) || terminating[process] != nil
    }

    /// Emits `watch`/`unwatch` if whether `process` needs a watch changed since it was `before`.
    func settleWatch(_ process: ProcessIdentity, before: Bool, effects: inout [Effect]) {
        let after = needsWatch(process)
        if before != after { effects.append(after ? .watch(process) : .unwatch(process)) }
    }
}
