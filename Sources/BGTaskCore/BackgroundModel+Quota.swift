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
    /// Keys kept: beyond, those idle longest are forgotten first (a user minting executables
    /// cannot grow the state without bound; at worst one forgotten key starts afresh).
    static var maximumQuotaKeys: Int { 16384 }

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
        var used = (quotaUsage[key] ?? []).reduce(Duration.zero) { $0 + within($1.start, $1.end) }
        for app in quotaHolders[key] ?? [] {
            if let since = apps[app]?.holdingSince { used += within(since, now) }
        }
        return used
    }

    /// Starts or stops counting `app`'s time, as its holding a granted task in the
    /// background changed. Cheap (and nothing) for apps without a quota.
    mutating func settleQuota(_ app: ProcessIdentity, at now: Instant) {
        guard var record = apps[app], record.policy?.dailyBackground != nil, let key = record.quotaKey else { return }
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
        var intervals = (quotaUsage[key] ?? []).filter { $0.end > now - configuration.quotaWindow }
        intervals.append(QuotaInterval(start: since, end: now))
        if intervals.count > Self.maximumQuotaIntervals {
            // Merge the two oldest: the window may count a little early time twice as long,
            // never less.
            intervals[1].start = intervals[0].start
            intervals.removeFirst()
        }
        quotaUsage[key] = intervals
        quotaChanged.insert(key)
        if quotaUsage.count > Self.maximumQuotaKeys { forgetIdleQuotaKeys(at: now) }
    }

    /// Drops keys with nothing left in the window, then, if still too many, those idle longest.
    mutating func forgetIdleQuotaKeys(at now: Instant) {
        let windowStart = now - configuration.quotaWindow
        var idle = quotaUsage.filter { quotaHolders[$0.key] == nil }
            .map { (key: $0.key, last: $0.value.last?.end ?? .zero) }
            .sorted { $0.last < $1.last }
        let excess = quotaUsage.count - Self.maximumQuotaKeys * 3 / 4
        idle = idle.enumerated().filter { $0.offset < excess || $0.element.last <= windowStart }.map(\.element)
        for (key, _) in idle {
            quotaUsage[key] = nil
            quotaChanged.insert(key)
        }
    }

    /// The quota records changed since the last call (a key with none left: empty).
    public mutating func takeQuotaChanges() -> [(key: String, intervals: [QuotaInterval])] {
        guard !quotaChanged.isEmpty else { return [] }
        defer { quotaChanged.removeAll() }
        return quotaChanged.sorted().map { ($0, quotaUsage[$0] ?? []) }
    }
}
