// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// Log records: to the journal with structured fields, or to stderr. Every message is
/// escaped (`cescape`): process and task names are chosen by clients.
extension Daemon {
    /// Records about one (non-root) uid's apps per window: one user cycling its own apps
    /// wrote 121,000 lines in 15 s, past journald's own rate limit, which then dropped other
    /// users' records. Past the burst, the uid's records are counted, and the count logged
    /// with its next record after the window.
    static let logBurst = 200
    static let logWindow: Int64 = 10_000_000_000

    func log(_ entry: LogEntry) {
        if entry.priority == .debug, !logDebug { return }
        if let uid = entry.uid, uid != 0, !allowLog(uid: uid) { return }
        // The structured fields go to the journal only: on stderr a record is its message.
        guard Journal.toJournal else { return Journal.log(priority: entry.priority.rawValue, message: entry.message.cEscaped) }
        var fields: [(String, String)] = [("BGTASKD_EVENT", entry.kind.rawValue),
                                          ("MESSAGE_ID", entry.kind.messageID)]
        if let app = entry.app { fields.append(("BGTASKD_PID", String(app.pid))) }
        if let command = entry.command { fields.append(("BGTASKD_COMMAND", command.cEscaped)) }
        if let id = entry.taskID { fields.append(("BGTASKD_TASK_ID", String(id))) }
        if let name = entry.taskName { fields.append(("BGTASKD_TASK_NAME", name.cEscaped)) }
        if let reason = entry.reason { fields.append(("BGTASKD_REASON", reason)) }
        Journal.log(priority: entry.priority.rawValue, message: entry.message.cEscaped, fields: fields)
    }

    /// Whether a record about `uid`'s apps goes out now (`logBurst` per `logWindow`).
    func allowLog(uid: UInt32) -> Bool {
        let now = loop.now
        var budget = logBudgets[uid] ?? (windowStart: now, logged: 0, suppressed: 0)
        if now - budget.windowStart >= Self.logWindow {
            if budget.suppressed > 0 {
                log(.notice, "\(budget.suppressed) records about apps of uid \(uid) were not logged (at most \(Self.logBurst) every \(Self.logWindow / 1_000_000_000)s per user)")
            }
            budget = (now, 0, 0)
        }
        if logBudgets.count > 4096 { logBudgets = logBudgets.filter { now - $0.value.windowStart < Self.logWindow } }
        defer { logBudgets[uid] = budget }
        guard budget.logged < Self.logBurst else {
            budget.suppressed += 1
            return false
        }
        budget.logged += 1
        return true
    }

    func log(_ priority: LogEntry.Priority, _ message: String) {
        Journal.log(priority: priority.rawValue, message: message.cEscaped)
    }
}
