import BGTaskCore
import BGTaskSystem

/// Log records: to the journal with structured fields, or to stderr. Every message is
/// escaped (`cescape`): process and task names are chosen by clients.
extension Daemon {
    func log(_ entry: LogEntry) {
        if entry.priority == .debug, !logDebug { return }
        var fields: [(String, String)] = [("BGTASKD_EVENT", entry.kind.rawValue),
                                          ("MESSAGE_ID", entry.kind.messageID)]
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
