// SPDX-License-Identifier: Apache-2.0
/// The background-execution model: every app and task, and the rules of DESIGN.md §2.
///
/// A value the daemon feeds events to, with time as an argument. Each mutating call appends
/// what the daemon must do to `effects`; `nextDeadline()` says when to call `advance(to:)`.
/// Nothing here reads a clock or touches the OS.
public struct BackgroundModel {
    /// The configuration in force; `reload` replaces it.
    public private(set) var configuration: Configuration { didSet { spans = Spans(configuration) } }
    /// Its spans read on every call, in nanoseconds: converting a `Duration` (`nanoseconds`)
    /// was ~18 instructions, four times a call (callgrind).
    private(set) var spans: Spans
    /// Whether to emit debug log records (every task granted and ended). Off, they are not
    /// even formatted: they would cost more than the call they describe.
    public var debugLogging = true
    /// Whose tasks have every change listed (`Effect.taskChanged`, and a grant's lifecycle
    /// event), beside tasks begun with `more`, whose stream hears of them: the owners the
    /// daemon's monitors may see. Otherwise a snapshot and an effect per change, two or three
    /// per call, went to nobody (callgrind: ~1,500 instructions of each call's ~16,000), and
    /// uid 65534's one monitor had every user's calls pay ~2,800 instructions more for
    /// changes only root's monitors could have.
    public var monitoredOwners = MonitoredOwners.everyone
    var apps = ChangeTracked<ProcessIdentity, AppRecord>()
    /// Counts, for each uid's bucket (`appsBucket`), the apps of its uids added, removed or
    /// made unit apps (`isolate`): which app `app(containing:)` finds for a process of a uid
    /// stays the same while its bucket's count does, as it finds only apps of the process's
    /// own uid, and an app's uid and unit change only so. Counted by every replaced record
    /// and for every user, one user flipping its own app's state had every other user's
    /// next call resolve its caller again (~560 instructions: callgrind).
    private var appsGenerations = [UInt64](repeating: 0, count: 64)
    /// Root's bucket is its own: shared (`uid % 64`), a user given uid 64 or 1024 had
    /// root's calls resolve their caller again with each app it started. Other uids share
    /// the 63 others (more resolutions, never fewer).
    private static func appsBucket(_ uid: UInt32) -> Int { uid == 0 ? 0 : 1 + Int((uid - 1) % 63) }
    /// Where `uid`'s apps stand (`appsGenerations`). Mutating only to be read in place, on
    /// every call (`Daemon.inPlace`).
    public mutating func appsGeneration(of uid: UInt32) -> UInt64 { appsGenerations[Self.appsBucket(uid)] }
    /// An app of `uid` was added, removed or made a unit app.
    private mutating func appsChanged(of uid: UInt32) { appsGenerations[Self.appsBucket(uid)] &+= 1 }
    /// Active tasks only: a task that ends is forgotten (its names live on in history).
    var tasks = ChangeTracked<TaskID, TaskRecord>()
    /// Each task whose owner is not its app's own process, under that owner (a helper's
    /// tasks, ended when it exits). The app's own process's tasks are its record's
    /// `taskIDs`, ended with it: listed here too, they were an insert and a removal a task
    /// for nothing (callgrind).
    var tasksByOwner: [ProcessIdentity: TaskIDs] = [:]
    /// Whether `process` is a registered app's own process.
    public func isApp(_ process: ProcessIdentity) -> Bool { apps.contains(process) }

    /// The uid `process` runs for: its app's, or, for a process waiting for its `SIGKILL`,
    /// the uid of the app it was. `nil` if the model does not know the process. Mutating
    /// only to read the records where they lie (`peek`): a dictionary's getter hands out a
    /// copy of the whole record, its strings and arrays retained and released.
    public mutating func uid(of process: ProcessIdentity) -> UInt32? {
        if let uid = apps.peek(process, { $0.uid }) { return uid }
        if let termination = terminating[process] { return termination.uid }
        guard let id = tasksByOwner[process]?.first else { return nil }
        return tasks.peek(id) { $0.uid }
    }

    /// Background time used per app key, in the rolling window (`BackgroundModel+Quota`).
    var quotaUsage: [String: [QuotaInterval]] = [:]
    /// Apps of each key holding a task now (their time counts as it passes).
    var quotaHolders: [String: Set<ProcessIdentity>] = [:]
    var quotaChanged: Set<String> = []
    /// Each uid's keys in `quotaUsage`, for its share (`maximumQuotaKeysPerUser`).
    var quotaKeysByUID: [UInt32: Set<String>] = [:]
    /// Apps by owner, so listings filter before they build and per-user limits cost nothing.
    var appsByUID: [UInt32: Set<ProcessIdentity>] = [:]
    /// Unit apps by their unit's cgroup path: a call from any process in it is the app's.
    var appsByUnit: [String: ProcessIdentity] = [:]
    /// The keys of `appsByUnit` by unit name (a name two managers share has two paths).
    var unitPathsByName: [String: Set<String>] = [:]
    /// How process apps (not units) registered from now on are contained: what the daemon
    /// can do on this machine (`tracked` with the process-events connector, else `tree`).
    public var processContainment: Containment = .tree
    /// Active tasks by the uid of their app (`MaxTasksPerUser`). Keyed by one word
    /// (`WordKey`), not hashed by a `Hasher`: it changes with every BeginTask and EndTask.
    var tasksPerUID: [WordKey<UInt32>: Int] = [:]
    var tasksByConnection: [ConnectionID: TaskIDs] = [:]
    /// Processes sent a catchable terminate signal, and when their grace runs out (the
    /// `SIGKILL`). Changes are noted in `apps`, whose entry for the process is gone.
    var terminating: [ProcessIdentity: Termination] = [:]
    /// The terminations whose `SIGKILL` fell due before their catchable signal went out (a
    /// held-up daemon), given their grace again from then, once (`advance`). Not saved: a
    /// restart gives an unsent signal its grace anyway.
    var killsPutOff: Set<ProcessIdentity> = []
    var timers = TimerQueue()
    /// The daemon's waits armed, each by the serial of its current timer entry.
    var waits: [Wait: UInt64] = [:]
    var waitSerial: UInt64 = 0
    // Scheduled work (`BackgroundModel+Requests`): pending requests by app key, which app
    // runs for a key, the conditions, the launches not yet completed (by their task).
    var requestBook: [String: SavedRequests] = [:]
    var requestKeyOfApp: [ProcessIdentity: String] = [:]
    var appOfRequestKey: [String: ProcessIdentity] = [:]
    public internal(set) var conditions = Conditions()
    var launchesInFlight: [TaskID: Launch] = [:]
    /// Launches whose task ended before the app said `SetTaskCompleted` (denied while
    /// pending, warned away), by app, until it says so or is suspended: its completion still
    /// finishes the wake it was resumed for. At most `maximumEndedLaunches` per app.
    var endedLaunches: [ProcessIdentity: Set<String>] = [:]
    static var maximumEndedLaunches: Int { 16 }
    var requestPassSerial: UInt64 = 0
    /// When the requests are next looked at (a pass launches what is due then).
    public internal(set) var requestPassAt: Instant?
    var requestsPerUID: [UInt32: Int] = [:]
    var requestKeysByUID: [UInt32: Set<String>] = [:]
    var requestTotal = 0
    var requestChanges: Set<String> = []
    /// How long the machine had slept when last told (`machineSlept`), and whether that
    /// changed since the state file last heard it.
    var sleepCounted: Duration?
    var sleepChanged = false
    /// Tasks in creation order, for the age warning. Its delay is one constant, so the
    /// deadlines come in this order: a queue, not heap entries that would outlive their
    /// tasks by TaskAgeWarningSec. Ended tasks at the front are dropped at once.
    var ageQueue: [(id: TaskID, created: Instant)] = []
    var ageQueueHead = 0
    /// Entries in `ageQueue` whose task has ended; compacted away once they are half.
    var ageQueueDead = 0
    /// Apps per state, kept as states change, so a status line costs nothing.
    public private(set) var stateCounts: [AppState: Int] = [:]
    /// `stateCounts[.background]`, read on every pass without hashing (`KeepAwake=`).
    public private(set) var backgroundApps = 0
    var nextTaskID: TaskID = 1
    var random: SplitMix64

    /// A model with no apps. `seed` draws the grant latencies (`GrantLatencySeed`, or random).
    public init(configuration: Configuration, seed: UInt64) {
        self.configuration = configuration
        self.spans = Spans(configuration)
        self.random = SplitMix64(seed: configuration.grantLatencySeed ?? seed)
    }

    /// A configuration's spans read on every call, in nanoseconds.
    struct Spans {
        /// `TaskAgeWarningSec`.
        var taskAgeWarning: Int64
        /// `GrantLatencyMinSec` and `GrantLatencyMaxSec` (at least the first).
        var grantLatency: (low: Int64, high: Int64)

        init(_ settings: borrowing Configuration) {
            taskAgeWarning = settings.taskAgeWarning.nanoseconds
            let low = settings.grantLatencyMin.nanoseconds
            grantLatency = (low, max(low, settings.grantLatencyMax.nanoseconds))
        }
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

    /// The registered app that `process` belongs to, of the same uid (a process of another
    /// uid is never part of an app; it is an app of its own): the unit app of its unit, else
    /// the app that is the process or its nearest registered ancestor. Mutating only to read
    /// the records in place (`uid(of:)`): the daemon asks on every call.
    public mutating func app(containing process: ProcessDescription) -> ProcessIdentity? {
        if let unit = process.unit, let app = appsByUnit[unit], apps.peek(app, { $0.uid }) == process.uid { return app }
        if let uid = apps.peek(process.identity, { $0.uid }) { return uid == process.uid ? process.identity : nil }
        return process.ancestors.first { apps.peek($0, { $0.uid }) == process.uid }
    }

    /// The unit app whose unit's cgroup path is `unit`.
    public func app(unit: String) -> ProcessIdentity? { appsByUnit[unit] }

    /// The cgroup paths of the unit apps whose unit is called `name` (of `uid`'s apps only,
    /// if given): an index, never a scan.
    public func unitPaths(named name: String, ownedBy uid: UInt32? = nil) -> [String] {
        (unitPathsByName[name] ?? []).filter { path in uid == nil || appsByUnit[path].flatMap { apps[$0]?.uid } == uid }
    }

    /// The cgroup path of the unit `app` is, for a unit app.
    public func unit(of app: ProcessIdentity) -> String? { apps[app]?.unit }

    /// The process app `app` now lives in a transient scope of its own, at cgroup `path`
    /// (moved there by the daemon): from now on it is that scope's app, containment `scope`.
    /// `false` (and nothing changes) if it is gone, already a unit app, or the path is taken.
    public mutating func isolate(_ app: ProcessIdentity, inScope path: String, effects: inout [Effect]) -> Bool {
        guard var record = apps[app], record.unit == nil, appsByUnit[path] == nil else { return false }
        record.unit = path
        record.containment = .scope
        apps[app] = record
        indexUnit(path, of: app)
        appsChanged(of: record.uid)
        effects.append(.log(.app(.appIsolated, .info, app, uid: record.uid, command: record.command,
                                 "moved into scope \(AppUnit.name(ofPath: path)) of its own (containment scope)")))
        return true
    }

    /// The settings `app` lives by: its policy's, else the daemon's.
    public func settings(of app: ProcessIdentity) -> Configuration {
        apps[app].map(settings) ?? configuration
    }

    func settings(_ record: AppRecord) -> Configuration { record.policy?.configuration ?? configuration }

    /// Gives `app` the policy that matches it now (a reload): from its next background period.
    public mutating func setPolicy(_ policy: AppPolicy?, quotaKey: String?, of app: ProcessIdentity, at now: Instant) {
        guard var record = apps[app], record.policy != policy || record.quotaKey != quotaKey else { return }
        if let since = record.holdingSince, let key = record.quotaKey {  // counted so far under the old one
            record.holdingSince = nil
            stopHolding(app, key: key, since: since, at: now)
        }
        record.policy = policy
        record.quotaKey = quotaKey
        apps[app] = record
        settleQuota(app, at: now)
    }

    /// How `app`'s processes are held together; `nil` if it is not an app.
    public func containment(of app: ProcessIdentity) -> Containment? { apps[app]?.containment }

    /// The app containing `process`, registering the process as a new foreground app when
    /// none does (rule 1). `privileged`: asked by root or `ManagerGroup`, who are held to
    /// `MaxApps` alone; everyone else also to `MaxAppsPerUser` and to `MaxApps` less the
    /// reserve, so that no user (or several) can lock the managers out.
    public mutating func register(_ process: ProcessDescription, privileged: Bool = false, policy: AppPolicy? = nil,
                                  quotaKey: String? = nil, at now: Instant,
                                  effects: inout [Effect]) throws(BGTaskError) -> ProcessIdentity {
        if let existing = app(containing: process) { return existing }
        guard process.identity.pid > 1 else {
            throw .invalidParameter("pid \(process.identity.pid) cannot be managed")
        }
        guard apps[process.identity] == nil else {
            // The pid's app belongs to another uid (the process changed uid): not this caller's.
            throw .invalidParameter("pid \(process.identity.pid) is an app of another user")
        }
        guard apps.count < configuration.maxApps else {
            throw .limitExceeded("MaxApps=\(configuration.maxApps) reached")
        }
        if !privileged, process.uid != 0 {
            guard apps.count < configuration.maxApps - configuration.reservedApps else {
                throw .limitExceeded("MaxApps=\(configuration.maxApps) reached (the last \(configuration.reservedApps) are kept for root and ManagerGroup)")
            }
            guard appCount(ownedBy: process.uid) < configuration.maxAppsPerUser else {
                throw .limitExceeded("MaxAppsPerUser=\(configuration.maxAppsPerUser) reached for uid \(process.uid)")
            }
        }
        let identity = process.identity
        let watched = needsWatch(identity)
        // A unit already taken (by an app of another uid) leaves this one a process app.
        let unit = process.unit.flatMap { appsByUnit[$0] == nil ? $0 : nil }
        insertApp(AppRecord(identity: identity, uid: process.uid, command: process.command, unit: unit,
                            containment: unit == nil ? processContainment : .unit, policyBox: policy.map(Shared.init),
                            quotaKey: quotaKey))
        settleWatch(identity, before: watched, effects: &effects)
        let containment = unit.map { "as unit \(AppUnit.name(ofPath: $0))" }
            ?? (processContainment == .tree ? "(containment tree: a process that re-parents, by a double fork or setsid, escapes it)"
                : "(containment \(processContainment.rawValue))")
        effects.append(.log(.app(.appRegistered, .info, identity, uid: process.uid, command: process.command,
                                 "registered in the foreground \(containment)")))
        return identity
    }

    /// The app's snapshot at `now`, or `nil` if there is no such app.
    public func snapshot(of app: ProcessIdentity, at now: Instant) -> AppSnapshot? {
        apps[app].map { snapshot($0, at: now) }
    }

    /// Every app, or those of `uid`, by pid. Filtered before anything is built: a caller pays
    /// for what it may see, not for the whole machine.
    public func listApps(ownedBy uid: UInt32? = nil, at now: Instant) -> [AppSnapshot] {
        let records: [AppRecord] = uid.map { (appsByUID[$0] ?? []).compactMap { apps[$0] } } ?? Array(apps.values)
        return records.map { snapshot($0, at: now) }.sorted { $0.identity.pid < $1.identity.pid }
    }

    /// Active tasks, of one app, of the apps of `uid`, or of all, by id.
    public func listTasks(of app: ProcessIdentity? = nil, ownedBy uid: UInt32? = nil, at now: Instant) -> [TaskSnapshot] {
        var ids: [TaskID]
        if let app {
            ids = apps[app].map { uid == nil || $0.uid == uid ? $0.taskIDs : [] } ?? []
        } else if let uid {
            ids = (appsByUID[uid] ?? []).flatMap { apps[$0]?.taskIDs ?? [] }
        } else {
            ids = Array(tasks.keys)
        }
        ids.sort()
        return ids.compactMap { tasks[$0].map { snapshot($0, at: now) } }
    }

    /// Number of registered apps.
    public var appCount: Int { apps.count }
    /// Number of active tasks.
    public var taskCount: Int { tasks.count }
    /// Apps owned by `uid`.
    public func appCount(ownedBy uid: UInt32) -> Int { appsByUID[uid]?.count ?? 0 }
    /// Active tasks of the apps owned by `uid`.
    public func taskCount(ownedBy uid: UInt32) -> Int { tasksPerUID[WordKey(uid)] ?? 0 }
    /// Apps of `uid` per state, for a status line that shows a user only its own.
    public func stateCounts(ownedBy uid: UInt32) -> [AppState: Int] {
        var counts: [AppState: Int] = [:]
        for identity in appsByUID[uid] ?? [] { if let app = apps[identity] { counts[app.state, default: 0] += 1 } }
        return counts
    }

    /// Background time left: `nil` in the foreground (unlimited), zero once suspended.
    public func backgroundTimeRemaining(of app: ProcessIdentity, at now: Instant) -> Duration? {
        guard let record = apps[app] else { return nil }
        return remaining(record, at: now)
    }

    func remaining(_ app: AppRecord, at now: Instant) -> Duration? {
        switch app.state {
        case .foreground: return nil
        case .suspended, .terminated: return .zero
        case .background: return app.deadline.map { max(.zero, $0 - now) }  // none: exempt
        }
    }

    func snapshot(_ app: AppRecord, at now: Instant) -> AppSnapshot {
        AppSnapshot(identity: app.identity, uid: app.uid, command: app.command, unit: app.unit,
                    containment: app.containment, policy: app.policy?.name, exempt: app.policy?.exempt == true,
                    backgroundQuotaRemaining: quotaRemaining(app, at: now),
                    state: app.state,
                    phase: app.phase, taskCount: app.taskIDs.count,
                    backgroundTimeRemaining: remaining(app, at: now), subscribed: app.subscribers > 0,
                    manager: app.manager)
    }

    func snapshot(_ task: TaskRecord, at now: Instant, reason: TaskReason? = nil) -> TaskSnapshot {
        TaskSnapshot(id: task.id, app: task.app, owner: task.owner, uid: task.uid,
                     name: task.name, state: task.state, reason: reason, age: max(.zero, now - task.created),
                     expirationHandler: task.expirationHandler)
    }

    /// Adds an app record and keeps the indexes in step.
    mutating func insertApp(_ record: AppRecord) {
        apps[record.identity] = record
        appsByUID[record.uid, default: []].insert(record.identity)
        if let unit = record.unit { indexUnit(unit, of: record.identity) }
        count(from: nil, to: record.state)
        appsChanged(of: record.uid)
    }

    mutating func indexUnit(_ path: String, of app: ProcessIdentity) {
        appsByUnit[path] = app
        unitPathsByName[AppUnit.name(ofPath: path), default: []].insert(path)
    }

    /// Removes an app record (its tasks must be gone already) and keeps the indexes in step.
    mutating func removeApp(_ identity: ProcessIdentity, at now: Instant) {
        guard let record = apps[identity] else { return }
        apps[identity] = nil
        endedLaunches[identity] = nil
        appsByUID[record.uid]?.remove(identity)
        appsChanged(of: record.uid)
        if let unit = record.unit, appsByUnit[unit] == identity {
            appsByUnit[unit] = nil
            let name = AppUnit.name(ofPath: unit)
            unitPathsByName[name]?.remove(unit)
            if unitPathsByName[name]?.isEmpty == true { unitPathsByName[name] = nil }
        }
        if let since = record.holdingSince, let key = record.quotaKey {
            stopHolding(identity, key: key, since: since, at: now)
        }
        if appsByUID[record.uid]?.isEmpty == true { appsByUID[record.uid] = nil }
        if record.requestKey != nil { detachRequests(of: identity, at: now) }
        count(from: record.state, to: nil)
    }

    /// Keeps `stateCounts` in step with a state change (`nil`: not an app).
    mutating func count(from old: AppState?, to new: AppState?) {
        if let old { stateCounts[old, default: 0] -= 1 }
        if let new { stateCounts[new, default: 0] += 1 }
        if old == .background { backgroundApps -= 1 }
        if new == .background { backgroundApps += 1 }
    }

    // MARK: Process watching

    /// Whether the daemon must watch `process` for its exit: it is an app, owns a task, or
    /// is being terminated. Inlined: called from the model's mutating methods, a method that
    /// does not mutate is handed a copy of the whole model (688 bytes, a `memcpy` per call).
    @inline(__always)
    func needsWatch(_ process: ProcessIdentity) -> Bool {
        apps.contains(process) || tasksByOwner[process] != nil || terminating[process] != nil
    }

    /// Emits `watch`/`unwatch` if whether `process` needs a watch changed since it was `before`.
    func settleWatch(_ process: ProcessIdentity, before: Bool, effects: inout [Effect]) {
        let after = needsWatch(process)
        if before != after { effects.append(after ? .watch(process) : .unwatch(process)) }
    }
}

/// An immutable value shared by reference, to keep a large, rarely present field out of a
/// record that exists by the thousand.
final class Shared<Value: Sendable>: Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// Whose tasks' changes monitors may have (`BackgroundModel.monitoredOwners`): root's and
/// `ManagerGroup`'s monitors see every app's, another user's its own uid's.
public enum MonitoredOwners: Equatable, Sendable {
    case nobody
    case everyone
    case some(Set<UInt32>)

    @inline(__always)
    public func contains(_ uid: UInt32) -> Bool {
        switch self {
        case .nobody: false
        case .everyone: true
        case let .some(uids): uids.contains(uid)
        }
    }
}
