// SPDX-License-Identifier: Apache-2.0
/// What `Wake` did.
public enum WakeOutcome: String, Sendable {
    /// A suspended app was resumed into the background for its window.
    case woken
    /// A background app was told; its deadline stays (the window does not extend it).
    case told
    /// A foreground app: nothing to do.
    case foreground
}

/// `Wake` (DESIGN.md §2c): a suspended app resumed into the background for `WakeTimeSec`, as
/// iOS does for a background fetch or a silent push. The window is a background period whose
/// deadline is its end: tasks begun in it are warned and expire as in any (rules 6–7), and
/// at its end the app is suspended, or terminated if it still holds a task.
extension BackgroundModel {
    public mutating func wake(_ app: ProcessIdentity, reason: String, payload: String?, at now: Instant,
                              effects: inout [Effect]) throws(BGTaskError) -> WakeOutcome {
        guard let record = apps[app] else { throw .noSuchApp(app.pid) }
        switch record.state {
        case .foreground, .terminated:
            return .foreground
        case .background:
            effects.append(.lifecycle(app, uid: record.uid, .didWake(reason: reason, payload: payload,
                                                                    backgroundTimeRemaining: remaining(record, at: now))))
            effects.append(.log(.app(.appWoken, .info, app, uid: record.uid, command: record.command,
                                     "told of a wake (\(reason)); already in the background, its deadline stays")))
            return .told
        case .suspended:
            let window = resume(app, forWindow: settings(record).wakeTime, reason: .wake, detail: reason, at: now,
                                effects: &effects)
            effects.append(.lifecycle(app, uid: record.uid, .didWake(reason: reason, payload: payload,
                                                                    backgroundTimeRemaining: window)))
            settleQuota(app, at: now)
            return .woken
        }
    }

    /// Resumes a suspended app into the background for `length` (bounded by its quota, and
    /// no shorter than rule 7a allows): a period whose deadline is the window's end. Returns
    /// the window.
    @discardableResult
    mutating func resume(_ app: ProcessIdentity, forWindow length: Duration, reason: ActionReason, detail: String,
                         at now: Instant, effects: inout [Effect]) -> Duration {
        guard var record = apps[app], record.state == .suspended else { return .zero }
        let window = Self.periodLength(min(length, quotaRemaining(record, at: now) ?? length), settings(record))
        count(from: .suspended, to: .background)
        record.state = .background
        record.phase = .woken
        record.warned = false
        record.epoch += 1
        record.deadline = now + window
        timers.insert(.warning(app, epoch: record.epoch), at: max(now, record.deadline! - settings(record).expirationWarning))
        timers.insert(.deadline(app, epoch: record.epoch), at: record.deadline!)
        apps[app] = record
        effects.append(.act(AppActionRecord(app: app, uid: record.uid, command: record.command, unit: record.unit,
                                            action: .woken, reason: reason, taskNames: [], detail: detail), signal: nil))
        effects.append(.log(.app(.appWoken, .notice, app, uid: record.uid, command: record.command,
                                 "woken for \(ConfigurationValue.formatTimeSpan(window)): \(detail)", reason: reason)))
        return window
    }

    /// `FinishWake`: the woken app is done. Holding a granted task it runs on to the window's
    /// end (rules 5–7); otherwise it is suspended now.
    public mutating func finishWake(of app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app], record.state == .background, record.phase == .woken else { return }
        if record.taskIDs.contains(where: { tasks[$0]?.state.isAssertion == true }) {
            apps.update(app) { $0.phase = record.warned ? .expiring : .running }
            settleQuota(app, at: now)
        } else {
            suspend(app, reason: .wakeFinished, at: now, effects: &effects)
        }
    }
}
