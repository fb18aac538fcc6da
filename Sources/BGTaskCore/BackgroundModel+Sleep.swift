// SPDX-License-Identifier: Apache-2.0
/// The machine's sleep (suspend to RAM or disk). The model's instants are on
/// `CLOCK_MONOTONIC`, which stops while the machine sleeps: right for what counts an app's
/// running (background time, deadlines, warnings, grants, graces, wake windows: an app does
/// not run while the machine sleeps). What counts the calendar does not stop: a scheduled
/// request's date (`earliestBeginDate` and a periodic request's `interval`, dates as iOS's
/// `Date`), the quota window (`QuotaWindowSec`'s "daily", for `DailyBackgroundSec` and
/// `DailyLaunches`) and `RequestRetentionSec`. Told how long the machine has slept since it
/// booted (`CLOCK_BOOTTIME` − `CLOCK_MONOTONIC`), the model moves those instants earlier by
/// what was slept since it was last told: a refresh due in 15 minutes is due on waking from
/// a night's sleep, and a day's quota is back after a day, asleep or not.
extension BackgroundModel {
    /// The least sleep counted: below it, a difference between two readings is the time
    /// between reading the two clocks, not sleep.
    public static var sleepResolution: Duration { .milliseconds(1) }

    /// The machine has slept `total` since it booted, as of `now`. The first time (a model
    /// that never counted), that is where counting starts; after, what was slept since is
    /// counted (returned; `nil` for less than `sleepResolution`). Time an app held a task
    /// before the sleep is recorded there, before it; a holding goes on counting from `now`.
    /// A reading well below the last (the same boot's sleep only grows: a state file of a
    /// daemon in another time namespace) starts counting again from it.
    @discardableResult
    public mutating func machineSlept(total: Duration, at now: Instant) -> Duration? {
        guard let counted = sleepCounted, total > counted - Self.sleepResolution else {
            sleepCounted = total
            sleepChanged = true
            return nil
        }
        let slept = total - counted
        guard slept >= Self.sleepResolution else { return nil }
        sleepCounted = total
        sleepChanged = true
        for (key, holders) in quotaHolders {
            for app in holders {
                guard let since = apps.peek(app, { $0.holdingSince }) ?? nil else { continue }
                recordHeld(key: key, since: since, at: now)
                apps.update(app) { $0.holdingSince = now }
            }
        }
        for (key, intervals) in quotaUsage {
            setQuotaUsage(key, intervals.map { QuotaInterval(start: $0.start - slept, end: $0.end - slept) })
        }
        for (key, var book) in requestBook {
            for index in book.requests.indices { book.requests[index].earliestBegin = book.requests[index].earliestBegin - slept }
            book.launches = book.launches.map { $0 - slept }
            book.lastSeen = book.lastSeen - slept
            setBook(book, of: key)
        }
        replan(at: now)
        return slept
    }

    /// How long the machine had slept when last told (`nil`: never told).
    public var machineSleepCounted: Duration? { sleepCounted }

    /// How long the machine had slept when last told, if that changed since the last call
    /// (for the state file).
    public mutating func takeSleepChange() -> Duration? {
        guard sleepChanged else { return nil }
        sleepChanged = false
        return sleepCounted
    }
}
