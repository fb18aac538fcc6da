import BGTaskCore
import BGTaskSystem

/// Log records: to the journal with structured fields, or to stderr. Every message is
/// escaped (`cescape`): process and task names are chosen by clients.
extension Daemon {
    func log(_ entry: LogEntry) {
        if entry.priority == .debug, !logDebug { return }
        var fields: [(String, String)] = [("BGTASKD_EVENT", entry.kind.rawValue),
                                          ("MESSAGE_ID", LogMessageID.id(for: entry.kind))]
        if let app = entry.app { fields.append(("BGTASKD_PID", String(app.pid))) }
        if let command = entry.command { fields.append(("BGTASKD_COMMAND", command.cEscaped)) }
        if let id = entry.taskID { fields.append(("BGTASKD_TASK_ID", String(id))) }
        if let name = entry.taskName { fields.append(("BGTASKD_TASK_NAME", name.cEscaped)) }
        if let reason = entry.reason { fields.append(("BGTASKD_REASON", reason)) }
        Journal.log(priority: entry.priority.rawValue, message: entry.message.cEscaped, fields: fields)
    }

    func log(_ priority: LogEntry.Priority, _ message: String) {
        Journal.log(priority: priority.rawValue, message: message.cEscaped)
    }
}

/// Journal `MESSAGE_ID`s, one per kind of record, so `journalctl MESSAGE_ID=...` finds them.
/// Each is fixed here, once, like systemd's `sd-messages.h`: an ID never changes once
/// shipped, whatever cases are added to `LogKind` or in what order.
enum LogMessageID {
    static let table: [LogKind: String] = [
        .appRegistered: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a01",
        .appBackgrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a02",
        .appForegrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a03",
        .appExited: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a04",
        .appSuspended: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a05",
        .appResumed: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a06",
        .appTerminated: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a07",
        .taskGranted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a08",
        .taskDenied: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a09",
        .taskWarned: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0a",
        .taskExpired: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0b",
        .taskEnded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0c",
        .taskAgeWarning: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0d",
    ]

    static func id(for kind: LogKind) -> String { table[kind]! }
}
