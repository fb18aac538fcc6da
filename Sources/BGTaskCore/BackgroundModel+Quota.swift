// SPDX-License-Identifier: Apache-2.0
/// A stretch of background time an app key used: from `start` to `end`.
public struct QuotaInterval: Equatable, Sendable {
    public var start: Instant
    public var end: Instant

    public init(start: Instant, end: Instant) {
        self.start = start
        self.end = end
    }
}

/// Daily background time (DESIGN.md §2b): time counts while a background app with a quota
/// holds a granted task (overlapping tasks once), per app key (the app across relaunches),
/// over a rolling `QuotaWindowSec`. A period's deadline is the earlier of its budget and the
/// quota left; with none left, `BeginTask` in the background is `NoBackgroundTime`.
extension BackgroundModel {
    /// Intervals kept per key; older ones are merged, so an app cannot grow the state.
    static var maximumQuotaIntervals: Int { 256 }
    /// Keys kept in all, and per uid. Past a uid's share, that uid's own idlest key goes;
    /// past the total, the idlest key of the uid holding the most. A key that goes is never
    /// time given back: its uid's keys not in the table count as used up until the window
    /// has passed (`evictedKey`). So a user minting executables (hard links of one binary)
    /// can neither grow the state nor reset anyone's quota, its own included.
    static var maximumQuotaKeys: Int { 16384 }
    static var maximumQuotaKeysPerUser: Int { 256 }

    /// The uid a quota key belongs to: every key starts with `uid N ` (`AppFacts.quotaKey`).
    static func quotaOwner(ofKey key: String) -> UInt32? {
        guard key.hasPrefix("uid ") else { return nil }
        return UInt32(key.dropFirst(4).prefix { $0 != " " })
    }

    /// The record standing for `uid`'s evicted keys: one interval as long as the window,
    /// ending when the last was evicted.
    static func evictedKey(uid: UInt32) -> String { "uid \(uid) evicted" }

    /// What `key` has used: its own record, or, for a key of a uid that had keys evicted,
    /// the evicted record (it may be one of them).
    func quotaIntervals(_ key: String) -> [QuotaInterval] {
        if let own = quotaUsage[key] { return own }
        guard let uid = Self.quotaOwner(ofKey: key) else { return [] }
        return quotaUsage[Self.evictedKey(uid: uid)] ?? []
    }

    /// The background time `app` may still use in the window; `nil` without a quota.
    public func quotaRemaining(of app: ProcessIdentity, at now: Instant) -> Duration? {
        apps[app].flatMap { quotaRemaining($0, at: now) }
    }

    func quotaRemaining(_ record: AppRecord, at now: Instant) -> Duration? {
        guard let limit = record.policy?.dailyBackground, let key = record.quotaKey else { return nil }
        return max(.zero, limit - quotaUsed(key, at: now))
    }

    /// Time `key` used in the window ending `now`: what is recorded, and what its apps that
    /// hold a task now are using.
    func quotaUsed(_ key: String, at now: Instant) -> Duration {
        let windowStart = now - configuration.quotaWindow
        func within(_ start: Instant, _ end: Instant) -> Duration { max(.zero, min(end, now) - max(start, windowStart)) }
        var used = quotaIntervals(key).reduce(Duration.zero) { $0 + within($1.start, $1.end) }
        for app in quotaHolders[key] ?? [] {
            if let since = apps[app]?.holdingSince { used += within(since, now) }
        }
        return used
    }

    /// Starts or stops counting `app`'s time, as its holding a granted task in the
    /// background changed. Cheap (and nothing) for apps without a quota.
    mutating func settleQuota(_ app: ProcessIdentity, at now: Instant) {
        // Most apps have no quota: asked of the record in place, before any copy.
        guard apps.peek(app, { $0.countsQuota }) == true,
              var record = apps[app], let key = record.quotaKey else { return }
        // A wake's window counts whole; otherwise time counts while a granted task is held.
        let holding = record.state == .background
            && (record.phase == .woken || record.taskIDs.contains { tasks[$0]?.state.isAssertion == true })
        if holding, record.holdingSince == nil {
            record.holdingSince = now
            apps[app] = record
            quotaHolders[key, default: []].insert(app)
        } else if !holding, let since = record.holdingSince {
            record.holdingSince = nil
            apps[app] = record
            stopHolding(app, key: key, since: since, at: now)
        }
    }

    /// Records the time an app that held a task used, from `since` to `now`.
    mutating func stopHolding(_ app: ProcessIdentity, key: String, since: Instant, at now: Instant) {
        quotaHolders[key]?.remove(app)
        if quotaHolders[key]?.isEmpty == true { quotaHolders[key] = nil }
        recordHeld(key: key, since: since, at: now)
    }

    /// Records time a key's app held a task, from `since` to `now`.
    mutating func recordHeld(key: String, since: Instant, at now: Instant) {
        var intervals = quotaIntervals(key).filter { $0.end > now - configuration.quotaWindow }
        intervals.append(QuotaInterval(start: since, end: now))
        if intervals.count > Self.maximumQuotaIntervals {
            // Merge the two oldest: the window may count a little early time twice as long,
            // never less.
            intervals[1].start = intervals[0].start
            intervals.removeFirst()
        }
        setQuotaUsage(key, intervals)
        if let uid = Self.quotaOwner(ofKey: key) {
            while quotaKeysByUID[uid, default: []].count > Self.maximumQuotaKeysPerUser, evictQuotaKey(of: uid, at: now) {}
        }
        if quotaUsage.count > Self.maximumQuotaKeys { forgetIdleQuotaKeys(at: now) }
    }

    /// Sets (or, with `nil` or nothing, removes) a key's record, keeping the per-uid index.
    mutating func setQuotaUsage(_ key: String, _ intervals: [QuotaInterval]?) {
        let intervals = intervals?.isEmpty == true ? nil : intervals
        if let uid = Self.quotaOwner(ofKey: key) {
            if intervals != nil {
                quotaKeysByUID[uid, default: []].insert(key)
            } else if quotaKeysByUID[uid]?.remove(key) != nil, quotaKeysByUID[uid]?.isEmpty == true {
                quotaKeysByUID[uid] = nil
            }
        }
        quotaUsage[key] = intervals
        quotaChanged.insert(key)
    }

    /// Drops keys with nothing left in the window (that gives no time back), then, while
    /// still too many, evicts from the uid holding the most.
    mutating func forgetIdleQuotaKeys(at now: Instant) {
        let windowStart = now - configuration.quotaWindow
        for (key, intervals) in quotaUsage where Self.quotaOwner(ofKey: key) == nil || quotaHolders[key] == nil && (intervals.last?.end ?? .zero) <= windowStart {
            setQuotaUsage(key, nil)
        }
        while quotaUsage.count > Self.maximumQuotaKeys * 3 / 4,
              let uid = quotaKeysByUID.max(by: { $0.value.count < $1.value.count })?.key, evictQuotaKey(of: uid, at: now) {}
    }

    /// Forgets `uid`'s idlest key not held now, which from now on counts as used up until
    /// the window has passed (the evicted record). Returns whether one went.
    @discardableResult
    mutating func evictQuotaKey(of uid: UInt32, at now: Instant) -> Bool {
        let marker = Self.evictedKey(uid: uid)
        let idlest = (quotaKeysByUID[uid] ?? []).filter { $0 != marker && quotaHolders[$0] == nil }
            .min { (quotaUsage[$0]?.last?.end ?? .zero, $0) < (quotaUsage[$1]?.last?.end ?? .zero, $1) }
        guard let idlest else { return false }
        setQuotaUsage(idlest, nil)
        setQuotaUsage(marker, [QuotaInterval(start: now - configuration.quotaWindow, end: now)])
        return true
    }

    /// The quota records changed since the last call (a key with none left: empty).
    public mutating func takeQuotaChanges() -> [(key: String, intervals: [QuotaInterval])] {
        guard !quotaChanged.isEmpty else { return [] }
        defer { quotaChanged.removeAll() }
        return quotaChanged.sorted().map { ($0, quotaUsage[$0] ?? []) }
    }
}
