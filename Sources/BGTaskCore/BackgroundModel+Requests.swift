// SPDX-License-Identifier: Apache-2.0
/// Scheduled work (iOS's `BGTaskScheduler`): an app submits requests to be launched later;
/// the model launches them when due, their conditions hold and the app is suspended or in
/// the background, gathered within `CoalesceWindowSec` so that many apps cost one wake-up.
///
/// A launch is a background task the daemon begins for the app (named by the request's
/// identifier, with an expiration handler): the window is a background period as any, its
/// task warned with the others and ended by `SetTaskCompleted`. A suspended app is resumed
/// for the window, as for `Wake`. Requests are kept by app key (the app across relaunches,
/// like its quota) and survive restarts; a key none of whose processes ran for
/// `RequestRetentionSec` is forgotten.
extension BackgroundModel {
    // MARK: The app's calls

    /// `SubmitTaskRequest`: replaces a pending request with the same identifier.
    public mutating func submitTaskRequest(_ request: TaskRequest, from app: ProcessIdentity, key: String,
                                           at now: Instant, effects: inout [Effect]) throws(BGTaskError) {
        guard let record = apps[app] else { throw .noSuchApp(app.pid) }
        _ = try TaskRequest.validate(identifier: request.identifier)
        if let interval = request.interval, interval < TaskRequest.minimumInterval { throw .invalidParameter("interval") }
        attach(app, key: key, at: now)
        var book = requestBook[key] ?? SavedRequests(uid: record.uid, requests: [], lastSeen: now, launches: [])
        let replaced = book.requests.firstIndex { $0.identifier == request.identifier }
        let others = book.requests.enumerated().filter { $0.offset != replaced }.map(\.element)
        guard others.filter({ $0.kind == request.kind }).count < TaskRequest.maximumPending(request.kind) else {
            throw .tooManyPendingTaskRequests(request.kind.rawValue)
        }
        if replaced == nil {
            guard record.uid == 0 || requestCount(ownedBy: record.uid) < configuration.maxTaskRequestsPerUser else {
                throw .limitExceeded("MaxTaskRequestsPerUser=\(configuration.maxTaskRequestsPerUser) reached for uid \(record.uid)")
            }
            guard requestTotal < configuration.maxTaskRequests else {
                throw .limitExceeded("MaxTaskRequests=\(configuration.maxTaskRequests) reached")
            }
        }
        book.requests = others + [request]
        if requestBook[key] == nil { makeRoomForKey(of: record.uid) }
        setBook(book, of: key)
        effects.append(.log(.app(.requestSubmitted, .info, app, uid: record.uid, command: record.command,
                                 "submitted \(request.kind.rawValue) request \(request.identifier)")))
        replan(at: now)
    }

    /// `CancelTaskRequest`: an identifier not pending is nothing to cancel.
    public mutating func cancelTaskRequest(_ identifier: String, from app: ProcessIdentity, at now: Instant) {
        guard let key = requestKeyOfApp[app], var book = requestBook[key] else { return }
        book.requests.removeAll { $0.identifier == identifier }
        setBook(book, of: key)
        replan(at: now)
    }

    /// `CancelAllTaskRequests`.
    public mutating func cancelAllTaskRequests(from app: ProcessIdentity, at now: Instant) {
        guard let key = requestKeyOfApp[app], var book = requestBook[key] else { return }
        book.requests = []
        setBook(book, of: key)
        replan(at: now)
    }

    /// `GetPendingTaskRequests`.
    public func pendingTaskRequests(of app: ProcessIdentity) -> [TaskRequest] {
        requestKeyOfApp[app].flatMap { requestBook[$0]?.requests } ?? []
    }

    /// `SetTaskCompleted`: the launch of `identifier` is over; its task ends (and an app
    /// holding nothing else is suspended, rule 5).
    public mutating func setTaskCompleted(_ identifier: String, success: Bool, of app: ProcessIdentity,
                                          at now: Instant, effects: inout [Effect]) throws(BGTaskError) {
        guard let record = apps[app] else { throw .noSuchApp(app.pid) }
        // A launch is its task: after a daemon restart, the task the daemon began, by name.
        // Looked up among the app's own tasks: no other user's launches are read.
        let id = record.taskIDs.first { launchesInFlight[$0]?.request.identifier == identifier }
            ?? record.taskIDs.first { tasks[$0]?.owner == app && tasks[$0]?.connection == nil && tasks[$0]?.name == identifier }
        if let id {
            try endTask(id, in: app, at: now, effects: &effects)
            endedLaunches[app]?.remove(identifier)
        } else {
            // Its task is gone already (denied before its grant when a condition was lost,
            // or warned and ended): the launch is still what the app was woken for.
            guard endedLaunches[app]?.remove(identifier) != nil else { throw .noSuchTaskRequest(identifier) }
        }
        if endedLaunches[app]?.isEmpty == true { endedLaunches[app] = nil }
        effects.append(.log(.app(.requestCompleted, .info, app, uid: record.uid, command: record.command,
                                 "completed request \(identifier) (\(success ? "success" : "failure"))")))
        // Resumed for its launches and none left: done, as a wake is (`FinishWake`).
        if apps[app]?.phase == .woken, !launchesInFlight.values.contains(where: { $0.app == app }) {
            finishWake(of: app, at: now, effects: &effects)
        }
    }

    // MARK: Managers and the system

    /// `LaunchTask` (`bgtaskctl launch`): runs a pending request of `app` now, whatever its
    /// date, conditions and budget (iOS's debugger-only `_simulateLaunchForTaskWithIdentifier`).
    public mutating func launchNow(_ identifier: String, of app: ProcessIdentity, at now: Instant,
                                   effects: inout [Effect]) throws(BGTaskError) {
        guard apps[app] != nil else { throw .noSuchApp(app.pid) }
        guard let key = requestKeyOfApp[app], let request = requestBook[key]?.requests.first(where: { $0.identifier == identifier })
        else { throw .noSuchTaskRequest(identifier) }
        try launch([request], key: key, app: app, at: now, effects: &effects)
        replan(at: now)
    }

    /// What the system says of power and network changed. A processing launch whose
    /// condition stopped holding is warned at once, and ends as at its deadline.
    public mutating func setConditions(_ new: Conditions, at now: Instant, effects: inout [Effect]) {
        let lostPower = conditions.externalPower && !new.externalPower, lostNetwork = conditions.network && !new.network
        conditions = new
        if lostPower || lostNetwork {
            let affected = Set(launchesInFlight.values.filter {
                (lostPower && $0.request.requiresExternalPower) || (lostNetwork && $0.request.requiresNetworkConnectivity)
            }.map(\.app))
            for app in affected.sorted(by: { $0.pid < $1.pid }) { try? expireNow(app, to: .warning, at: now, effects: &effects) }
        }
        replan(at: now)
    }

    /// Pending requests: of one app, of the apps of `uid`, or all; by key, then identifier.
    public func listTaskRequests(of app: ProcessIdentity? = nil, ownedBy uid: UInt32? = nil, at now: Instant) -> [TaskRequestSnapshot] {
        // One user's listing reads that user's keys only (`requestKeysByUID`).
        let keys = app.map { requestKeyOfApp[$0].map { [$0] } ?? [] }
            ?? uid.map { Array(requestKeysByUID[$0] ?? []) } ?? Array(requestBook.keys)
        var result: [TaskRequestSnapshot] = []
        for key in keys.sorted() {
            guard let book = requestBook[key], uid == nil || book.uid == uid else { continue }
            for request in book.requests.sorted(by: { $0.identifier < $1.identifier }) {
                let wait = self.wait(request, key: key, at: now) ?? (request.earliestBegin <= now ? .coalescing : .date)
                result.append(TaskRequestSnapshot(key: key, uid: book.uid, app: appOfRequestKey[key], request: request, waitingFor: wait))
            }
        }
        return result
    }

    /// Pending requests of `uid`'s apps.
    public func requestCount(ownedBy uid: UInt32) -> Int { requestsPerUID[uid] ?? 0 }

    /// Which app key an app's requests are kept by; requests kept for that key are the app's
    /// again (a relaunch, or a daemon restart).
    public mutating func attach(_ app: ProcessIdentity, key: String, at now: Instant) {
        guard apps[app] != nil, requestKeyOfApp[app] != key else { return }
        requestKeyOfApp[app] = key
        appOfRequestKey[key] = app
        apps.update(app) { $0.requestKey = key }
        if var book = requestBook[key] {
            book.lastSeen = now
            setBook(book, of: key)
        }
        replan(at: now)
    }

    /// Whether any request is kept for apps of `uid` (the daemon looks up an app's key at
    /// registration only then).
    public func hasRequests(ownedBy uid: UInt32) -> Bool { requestCount(ownedBy: uid) > 0 }

    // MARK: Deciding

    /// Why `request` cannot be launched at `now` (`nil`: it can, once its pass comes).
    func wait(_ request: TaskRequest, key: String, at now: Instant) -> RequestWait? {
        guard let app = appOfRequestKey[key], let record = apps[app] else { return .app }
        switch record.state {
        case .foreground: return .foreground
        case .terminated: return .app
        case .background where record.warned: return .quota
        case .background, .suspended: break
        }
        if now < request.earliestBegin { return .date }
        if request.requiresExternalPower, !conditions.externalPower { return .power }
        if request.requiresNetworkConnectivity, !conditions.network { return .network }
        if record.policy?.exempt == true { return nil }
        if quotaRemaining(record, at: now) == .zero { return .quota }
        if let limit = settings(record).dailyLaunches,
           (requestBook[key]?.launches.filter { $0 > now - configuration.quotaWindow }.count ?? 0) >= limit { return .quota }
        return nil
    }

    /// Something a request may wait on changed: look again in this pass (a timer due now).
    mutating func replan(at now: Instant) {
        guard !requestBook.isEmpty || !launchesInFlight.isEmpty else { return }
        requestPassAt = now
        requestPassSerial += 1
        timers.insert(.requests(serial: requestPassSerial), at: now)
    }

    /// The requests' timer: launch what is due, then arm the next pass.
    mutating func runRequests(at now: Instant, launched: Bool = false, effects: inout [Effect]) {
        forgetStaleKeys(at: now)
        // The next pass: gathering within the coalescing window those due soonest (their
        // dates known; a condition that comes back replans). Exempt apps' requests are not
        // held back.
        var dates: [Instant] = [], exempt: [Instant] = []
        var quotaBound: Instant?
        for (key, book) in requestBook {
            for request in book.requests {
                let wait = self.wait(request, key: key, at: now)
                if wait == .quota {
                    // DailyLaunches frees when the oldest launch leaves the window; background
                    // time, as it ages out: looked at again a coalescing window later.
                    let freed = book.launches.filter { $0 > now - configuration.quotaWindow }.min()
                        .map { $0 + configuration.quotaWindow } ?? now + configuration.coalesceWindow
                    let bound = max(now + .nanoseconds(1), min(freed, now + configuration.coalesceWindow * 60))
                    quotaBound = min(quotaBound ?? bound, bound)
                }
                guard wait == nil || wait == .date else { continue }
                if let app = appOfRequestKey[key], apps[app]?.policy?.exempt == true { exempt.append(request.earliestBegin) } else {
                    dates.append(request.earliestBegin)
                }
            }
        }
        var pass: Instant?
        if let first = dates.min() { pass = dates.filter { $0 <= first + configuration.coalesceWindow }.max() }
        if let soonest = exempt.min() { pass = min(pass ?? soonest, soonest) }
        if let due = pass, due <= now {
            // What remains has a pass of its own; what could not be launched (a limit) is
            // tried again a window later.
            guard launched else {
                launchDue(at: now, effects: &effects)
                return runRequests(at: now, launched: true, effects: &effects)
            }
            pass = now + configuration.coalesceWindow
        }
        requestPassAt = [pass, quotaBound, nextRetention()].compactMap { $0 }.min()
        if let next = requestPassAt {
            requestPassSerial += 1
            timers.insert(.requests(serial: requestPassSerial), at: next)
        }
    }

    /// Launches every request that can be, app by app (an app's due requests in one window).
    private mutating func launchDue(at now: Instant, effects: inout [Effect]) {
        for key in requestBook.keys.sorted() {
            guard let app = appOfRequestKey[key] else { continue }
            let due = (requestBook[key]?.requests ?? []).filter { wait($0, key: key, at: now) == nil }
            if !due.isEmpty { try? launch(due, key: key, app: app, at: now, effects: &effects) }
        }
    }

    /// Launches `requests` of `app`: resumed for the longest of their windows if suspended,
    /// then a task begun for each and `launchTask` sent. Launched requests leave the pending
    /// ones; a periodic one is submitted again, its interval from now.
    private mutating func launch(_ requests: [TaskRequest], key: String, app: ProcessIdentity, at now: Instant,
                                 effects: inout [Effect]) throws(BGTaskError) {
        guard let record = apps[app] else { throw .noSuchApp(app.pid) }
        let settings = settings(record)
        if record.state == .suspended {
            let window = requests.map { $0.kind == .refresh ? settings.refreshTime : settings.processingTime }.max()!
            resume(app, forWindow: window, reason: .launch,
                   detail: requests.map(\.identifier).joined(separator: ", "), at: now, effects: &effects)
        }
        guard var book = requestBook[key] else { return }
        for request in requests {
            let task = try beginTask(in: app, owner: app, name: request.identifier, expirationHandler: true, connection: nil,
                                     at: now, effects: &effects)
            launchesInFlight[task.id] = Launch(app: app, key: key, request: request)
            book.requests.removeAll { $0.identifier == request.identifier }
            if let interval = request.interval {
                var again = request
                again.earliestBegin = now + interval
                book.requests.append(again)
            }
            // Bounded: `DailyLaunches` counts at most this many (a user launching its own app
            // in a loop with `LaunchTask` cannot grow the record).
            book.launches = (book.launches.filter { $0 > now - configuration.quotaWindow } + [now])
                .suffix(Self.maximumCountedLaunches)
            effects.append(.lifecycle(app, uid: record.uid, .launchTask(identifier: request.identifier, kind: request.kind,
                                                                       taskID: task.id,
                                                                       backgroundTimeRemaining: remaining(apps[app]!, at: now))))
            effects.append(.log(.app(.requestLaunched, .notice, app, uid: record.uid, command: record.command,
                                     "launched \(request.kind.rawValue) request \(request.identifier) (task \(task.id))")))
        }
        book.lastSeen = now
        setBook(book, of: key)
    }

    // MARK: Bookkeeping

    /// Keys kept per uid with nothing pending (only their launches counted, for
    /// `DailyLaunches`): past this, the idlest goes, so a user minting executables cannot
    /// grow the table (keys with requests are bounded by `MaxTaskRequestsPerUser`).
    static var maximumIdleKeysPerUser: Int { 256 }
    /// Launches kept per key for `DailyLaunches` (which accepts no more than this).
    public static var maximumCountedLaunches: Int { 256 }

    private mutating func makeRoomForKey(of uid: UInt32) {
        let idle = (requestKeysByUID[uid] ?? []).compactMap { key in
            requestBook[key].flatMap { $0.requests.isEmpty ? (key, $0.lastSeen) : nil }
        }
        guard idle.count >= Self.maximumIdleKeysPerUser,
              let idlest = idle.min(by: { ($0.1, $0.0) < ($1.1, $1.0) })?.0 else { return }
        if let app = appOfRequestKey.removeValue(forKey: idlest) { requestKeyOfApp[app] = nil; apps.update(app) { $0.requestKey = nil } }
        setBook(nil, of: idlest)
    }

    /// Keys with no process running for `RequestRetentionSec` are forgotten.
    private mutating func forgetStaleKeys(at now: Instant) {
        for (key, book) in requestBook where appOfRequestKey[key] == nil && book.lastSeen + configuration.requestRetention <= now {
            setBook(nil, of: key)
        }
    }

    private func nextRetention() -> Instant? {
        requestBook.filter { appOfRequestKey[$0.key] == nil }.map { $0.value.lastSeen + configuration.requestRetention }.min()
    }

    /// Stores (or, `nil` or empty and without launches to count, drops) a key's requests,
    /// keeping the counts in step and noting the change for the state file.
    mutating func setBook(_ book: SavedRequests?, of key: String) {
        if let old = requestBook[key] {
            requestsPerUID[old.uid, default: 0] -= old.requests.count
            requestTotal -= old.requests.count
            if requestsPerUID[old.uid] == 0 { requestsPerUID[old.uid] = nil }
            requestKeysByUID[old.uid]?.remove(key)
            if requestKeysByUID[old.uid]?.isEmpty == true { requestKeysByUID[old.uid] = nil }
        }
        let keep = book.flatMap { $0.requests.isEmpty && $0.launches.isEmpty && appOfRequestKey[key] == nil ? nil : $0 }
        requestBook[key] = keep
        if let keep {
            requestsPerUID[keep.uid, default: 0] += keep.requests.count
            requestTotal += keep.requests.count
            requestKeysByUID[keep.uid, default: []].insert(key)
        }
        requestChanges.insert(key)
    }

    /// The app's process is gone: its key's requests wait for the next one.
    mutating func detachRequests(of app: ProcessIdentity, at now: Instant) {
        guard let key = requestKeyOfApp.removeValue(forKey: app) else { return }
        if appOfRequestKey[key] == app { appOfRequestKey[key] = nil }
        if var book = requestBook[key] {
            book.lastSeen = now
            setBook(book, of: key)
        }
        replan(at: now)
    }

    /// Requests changed since the last call, by key (`nil`: forgotten), for the state file.
    /// With none (nearly every pass), nothing is sorted, allocated or freed (callgrind: 241
    /// instructions per call before).
    public mutating func takeRequestChanges() -> [(key: String, requests: SavedRequests?)] {
        guard !requestChanges.isEmpty else { return [] }
        defer { requestChanges.removeAll() }
        return requestChanges.sorted().map { ($0, requestBook[$0]) }
    }
}

/// A request launched and not yet completed: its task's id is the key.
struct Launch {
    var app: ProcessIdentity
    var key: String
    var request: TaskRequest
}
