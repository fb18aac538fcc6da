// SPDX-License-Identifier: Apache-2.0
extension BackgroundModel {
    /// `BeginTask` (rule 2): answers at once with a `pending` task; the grant follows after a
    /// latency drawn from [`GrantLatencyMinSec`, `GrantLatencyMaxSec`].
    /// - Parameters:
    ///   - owner: the calling process; its exit ends the task.
    ///   - connection: set when begun with `more`; closing it ends the task.
    public mutating func beginTask(in app: ProcessIdentity, owner: ProcessIdentity, name: String,
                                   expirationHandler: Bool, connection: ConnectionID?,
                                   at now: Instant, effects: inout [Effect]) throws(BGTaskError) -> TaskSnapshot {
        // The fields it needs, read in place: the getter's copy of the record (its strings
        // and arrays retained, then released) was a tenth of the call (callgrind).
        guard let (uid, state, warned, heldTasks, policy) = apps.peek(app, { ($0.uid, $0.state, $0.warned, $0.taskIDs.count, $0.policyBox) })
        else { throw .noSuchApp(app.pid) }
        if state == .suspended || warned { throw .noBackgroundTime }
        if state == .background, policy != nil, quotaRemaining(of: app, at: now) == .zero { throw .noBackgroundTime }
        if let policy = policy?.value, let maxTasks = policy.maxTasks, heldTasks >= maxTasks {
            throw .limitExceeded("MaxTasks=\(maxTasks) of policy \(policy.name) reached")
        }
        guard heldTasks < configuration.maxTasksPerApp else {
            throw .limitExceeded("MaxTasksPerApp=\(configuration.maxTasksPerApp) reached")
        }
        guard uid == 0 || taskCount(ownedBy: uid) < configuration.maxTasksPerUser else {
            throw .limitExceeded("MaxTasksPerUser=\(configuration.maxTasksPerUser) reached for uid \(uid)")
        }
        let id = nextTaskID
        nextTaskID += 1
        let task = TaskRecord(id: id, app: app, uid: uid, owner: owner, connection: connection, name: name,
                              expirationHandler: expirationHandler, created: now,
                              grantAt: Instant(nanoseconds: now.nanoseconds &+ drawGrantLatency(policy.map { Spans($0.value.configuration).grantLatency } ?? spans.grantLatency)))
        // The app's own process (the common case) is watched as the app, before and after:
        // two look-ups of a table of every app spared (`needsWatch`).
        let ownApp = owner == app
        let watched = ownApp || needsWatch(owner)
        tasks[id] = task
        tasksPerUID[WordKey(uid), default: 0] += 1
        apps.update(app, saved: false) { $0.taskIDs.append(id) }
        if let connection { tasksByConnection.insert(id, under: connection) }
        if !ownApp {
            tasksByOwner.insert(id, under: owner)
            settleWatch(owner, before: watched, effects: &effects)
        }
        timers.insert(.grant(id), at: task.grantAt)
        ageQueue.append((id, now))
        let snapshot = snapshot(task, at: now)
        if reportsChanges(of: task) { effects.append(.taskChanged(snapshot)) }
        return snapshot
    }

    /// `EndTask`: ends an active task of `app`. Ids of other apps' tasks are unknown here.
    public mutating func endTask(_ id: TaskID, in app: ProcessIdentity, at now: Instant,
                                 effects: inout [Effect]) throws(BGTaskError) {
        guard let task = tasks[id], task.app == app else { throw .noSuchTask(id) }
        if finish(task, as: .ended, reason: .endedByApp, at: now, effects: &effects) {
            suspend(app, reason: .tasksEnded, at: now, effects: &effects)
        }
    }

    /// `FinishBackgroundTransition` (rule 4): with no granted task the app is suspended and
    /// its pending tasks denied; otherwise it keeps running. Outside a transition, nothing.
    public mutating func finishTransition(of app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app], record.state == .background, record.phase == .transition else { return }
        apps.update(app) { $0.transitionDeadline = nil }
        let holdsAssertion = record.taskIDs.contains { tasks[$0]?.state.isAssertion == true }
        if holdsAssertion || record.policy?.exempt == true {  // an exempt app is not suspended
            apps.update(app) { $0.phase = record.warned ? .expiring : .running }
        } else {
            suspend(app, reason: .transitionFinished, at: now, effects: &effects)
        }
    }

    /// A lifecycle subscriber connected: from now on entering the background waits for
    /// `FinishBackgroundTransition` (rule 3).
    public mutating func subscribe(_ app: ProcessIdentity) {
        apps[unsaved: app]?.subscribers += 1
    }

    /// A lifecycle subscriber went away. An app whose last subscriber leaves mid-transition
    /// can no longer report it, so its transition counts as finished.
    public mutating func unsubscribe(_ app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app], record.subscribers > 0 else { return }
        apps[unsaved: app]?.subscribers -= 1
        if record.subscribers == 1 { finishTransition(of: app, at: now, effects: &effects) }
    }

    /// A connection closed: tasks begun on it with `more` end (rule 9), like a logind
    /// inhibitor lock ends with its file descriptor.
    public mutating func connectionClosed(_ connection: ConnectionID, at now: Instant, effects: inout [Effect]) {
        guard let ids = tasksByConnection.removeValue(forKey: connection) else { return }
        // Each app with whether its last task ended left it idle (`finish`), suspended after
        // all ended, in the order first met.
        var affected: [(app: ProcessIdentity, idle: Bool)] = []
        for id in ids.sorted() {
            guard let task = tasks[id] else { continue }
            let idle = finish(task, as: .ended, reason: .connectionClosed, at: now, effects: &effects)
            if let index = affected.firstIndex(where: { $0.app == task.app }) {
                affected[index].idle = idle
            } else {
                affected.append((task.app, idle))
            }
        }
        for (app, idle) in affected where idle { suspend(app, reason: .tasksEnded, at: now, effects: &effects) }
    }

    // MARK: Internals

    /// Whether anyone hears of `task`'s changes: its stream, for a task begun with `more`
    /// (`connection`), or a monitor of its owner's (`monitoredOwners`). Inlined, as
    /// `needsWatch` is.
    @inline(__always)
    func reportsChanges(of task: TaskRecord) -> Bool { task.connection != nil || monitoredOwners.contains(task.uid) }

    /// Lists `task`'s change (`Effect.taskChanged`) if anyone hears of it.
    @inline(__always)
    func reportChange(of task: TaskRecord, reason: TaskReason? = nil, at now: Instant, effects: inout [Effect]) {
        if reportsChanges(of: task) { effects.append(.taskChanged(snapshot(task, at: now, reason: reason))) }
    }

    /// A latency in [`low`, `high`] nanoseconds.
    mutating func drawGrantLatency(_ range: (low: Int64, high: Int64)) -> Int64 {
        range.low == range.high ? range.low : Int64.random(in: range.low...range.high, using: &random)
    }

    /// The grant timer fired.
    mutating func grant(_ id: TaskID, at now: Instant, effects: inout [Effect]) {
        // Read and changed in place: the getter's copy and the setter's write back were a
        // third of a grant (callgrind).
        guard let (app, state) = tasks.peek(id, { ($0.app, $0.state) }), state == .pending,
              let (warned, countsQuota, subscribed) = apps.peek(app, { ($0.warned, $0.countsQuota, $0.subscribers > 0) }),
              let (uid, connection) = tasks.update(id, { task in
                  task.state = warned ? .expiring : .granted
                  return (task.uid, task.connection)
              }) else { return }
        // Heard by the app's subscribers and by monitors of its owner's (`monitoredOwners`)
        // only: an effect listed for nobody was copied, looked up and destroyed on every grant.
        let monitored = monitoredOwners.contains(uid)
        if subscribed || monitored { effects.append(.lifecycle(app, uid: uid, .taskGranted(id))) }
        // The whole record (a copy, ~100 instructions) only for whoever hears of it.
        if monitored || connection != nil || debugLogging, let task = tasks[id] {
            reportChange(of: task, at: now, effects: &effects)
            if debugLogging {
                effects.append(.log(.task(.taskGranted, .debug, id, name: task.name, app: app, uid: uid,
                                          command: apps[app]?.command, "granted")))
            }
        }
        if countsQuota { settleQuota(app, at: now) }
    }

    /// Removes an active task, telling its stream and subscribers why. The record is taken
    /// (`consuming`) and becomes the one reported: a copy of it was two thirds of a
    /// `TaskRecord` copy's ~100 instructions per end, retains of its strings included
    /// (callgrind). Returns whether the app is left idle in the background (rule 5:
    /// `AppRecord.idleInBackground`), read with the record's change: the caller that
    /// suspends it then looks it up no more.
    @discardableResult
    mutating func finish(_ task: consuming TaskRecord, as state: TaskState, reason: TaskReason, at now: Instant,
                         effects: inout [Effect]) -> Bool {
        var ended = task
        ended.state = state
        let id = ended.id, app = ended.app, owner = ended.owner, uid = ended.uid
        // Each id is in its app's list once (`beginTask`): the first found is the only one.
        // What the rest of the end needs of the record is read with the change (one look-up).
        let left = apps.update(app, saved: false) { record in
            if let index = record.taskIDs.firstIndex(of: id) { record.taskIDs.remove(at: index) }
            return (countsQuota: record.countsQuota, idle: record.idleInBackground)
        }
        // The app's own process, its record there, is watched as the app before and after.
        let ownApp = owner == app && left != nil
        let watched = ownApp || needsWatch(owner)
        tasks[id] = nil
        if !launchesInFlight.isEmpty, let launch = launchesInFlight.removeValue(forKey: id),
           endedLaunches[app, default: []].count < Self.maximumEndedLaunches {
            endedLaunches[app, default: []].insert(launch.request.identifier)
        }
        if let index = tasksPerUID.index(forKey: WordKey(uid)) {
            tasksPerUID.values[index] -= 1
            if tasksPerUID.values[index] <= 0 { tasksPerUID.remove(at: index) }
        }
        if owner != app { tasksByOwner.remove(id, under: owner) }
        if let connection = ended.connection { tasksByConnection.remove(id, under: connection) }
        if !ownApp { settleWatch(owner, before: watched, effects: &effects) }
        if !ended.ageWarned { forgetAgeEntry() }
        if state == .denied { effects.append(.lifecycle(app, uid: uid, .taskDenied(id, reason))) }
        reportChange(of: ended, reason: reason, at: now, effects: &effects)
        if left?.countsQuota == true { settleQuota(app, at: now) }
        let idle = left?.idle == true
        if state == .ended, !debugLogging { return idle }
        let kind: LogKind = state == .denied ? .taskDenied : state == .expired ? .taskExpired : .taskEnded
        let verb = state == .denied ? "denied" : state == .expired ? "expired" : "ended"
        effects.append(.log(.task(kind, state == .ended ? .debug : .notice, id, name: ended.name, app: app, uid: uid,
                                  command: apps[app]?.command, "\(verb): \(reason.rawValue)", reason: reason)))
        return idle
    }

    /// Rule 5: a background app past its transition whose last task ended is suspended.
    mutating func suspendIfIdle(_ app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard apps.peek(app, { $0.idleInBackground }) == true else { return }
        suspend(app, reason: .tasksEnded, at: now, effects: &effects)
    }

    /// Removes the front of `ageQueue`; returns its task id if that task is still active.
    mutating func popAgeQueue() -> TaskID? {
        let id = ageQueue[ageQueueHead].id
        ageQueueHead += 1
        let alive = tasks[id] != nil
        if !alive { ageQueueDead -= 1 }
        if ageQueueHead == ageQueue.count {
            ageQueue.removeAll(keepingCapacity: true)
            ageQueueHead = 0
        } else if ageQueueHead > 1024, ageQueueHead * 2 > ageQueue.count {
            ageQueue.removeSubrange(0..<ageQueueHead)
            ageQueueHead = 0
        }
        return alive ? id : nil
    }

    /// A task with an entry in `ageQueue` ended: once dead entries are half the queue, drop
    /// them all (amortized O(1); the queue stays within about twice the active tasks).
    mutating func forgetAgeEntry() {
        ageQueueDead += 1
        let entries = ageQueue.count - ageQueueHead
        guard ageQueueDead > 64, ageQueueDead * 2 > entries else { return }
        let tasks = self.tasks.snapshot
        ageQueue = ageQueue[ageQueueHead...].filter { tasks[$0.id] != nil }
        ageQueueHead = 0
        ageQueueDead = 0
    }

    /// The age-warning timer fired: UIKit logs tasks held too long, so do we.
    mutating func warnAge(_ id: TaskID, at now: Instant, effects: inout [Effect]) {
        guard let task = tasks[id] else { return }
        tasks[id]?.ageWarned = true
        let age = ConfigurationValue.formatTimeSpan(configuration.taskAgeWarning)
        effects.append(.log(.task(.taskAgeWarning, .warning, id, name: task.name, app: task.app, uid: task.uid, command: apps[task.app]?.command,
                                  "was begun over \(age) ago; end it when its work is done")))
    }
}
