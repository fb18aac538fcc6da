// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl history`
enum HistoryVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        guard arguments.isEmpty else { throw UsageError("history takes no arguments") }
        let reply = try context.call(.getHistory)
        if context.json { return context.printJSON(.object(reply)) }
        var table = Table("TIME", "PID", "UID", "COMMAND", "ACTION", "REASON", "TASKS")
        for entry in reply["entries"]?.arrayValue ?? [] {
            let tasks = (entry["tasks"]?.arrayValue ?? []).compactMap(\.stringValue).joined(separator: ",")
            table.add([entry["time"]?.cell ?? "-", entry["pid"]?.cell ?? "-", entry["uid"]?.cell ?? "-",
                       entry["command"]?.cell ?? "-", (entry["action"]?.cell ?? "-").replacingOccurrences(of: "woken", with: "WAKE"),
                       entry["detail"]?.stringValue.map { "\(entry["reason"]?.cell ?? "-"): \($0)" } ?? entry["reason"]?.cell ?? "-",
                       tasks.isEmpty ? "-" : tasks])
        }
        print(table.render(legend: context.legend, noun: "entry", plural: "entries"), terminator: "")
    }
}
