// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import Glibc
import Varlink

/// `bgtaskctl monitor`: events as they happen; `--json` prints one object a line.
enum MonitorVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        guard arguments.isEmpty else { throw UsageError("monitor takes no arguments") }
        let connection = try context.connect()
        try connection.send(VarlinkCall(.monitor, more: true))
        while true {
            let reply = try connection.receive()
            let event = try VarlinkConnection.check(reply)
            if context.json {
                writeLine(JSON.object(event).serialized)
            } else if event["event"]?.stringValue != "monitoring" {
                writeLine(describe(event))
            }
            if !reply.continues { return }
        }
    }

    static func describe(_ event: [String: JSON]) -> String {
        let name = event["event"]?.stringValue ?? "?"
        if let task = event["task"] {
            return "task \(task["id"]?.cell ?? "?") (\(task["name"]?.cell ?? "-")) of pid \(task["appPid"]?.cell ?? "?"): "
                + (task["state"]?.cell ?? "?") + (task["reason"].map { " (\($0.cell))" } ?? "")
        }
        if let entry = event["entry"] {
            let tasks = (entry["tasks"]?.arrayValue ?? []).compactMap(\.stringValue)
            return "pid \(entry["pid"]?.cell ?? "?") (\(entry["command"]?.cell ?? "?")) \(name): \(entry["reason"]?.cell ?? "?")"
                + (tasks.isEmpty ? "" : " holding \(tasks.joined(separator: ", "))")
        }
        var details: [String] = []
        for key in event.keys.sorted() where !["event", "pid"].contains(key) {
            let value = event[key]!
            details.append("\(key)=\(value.doubleValue.map { humanTime($0) } ?? value.serialized)")
        }
        return "pid \(event["pid"]?.cell ?? "?") \(name)" + (details.isEmpty ? "" : " " + details.joined(separator: " "))
    }
}
