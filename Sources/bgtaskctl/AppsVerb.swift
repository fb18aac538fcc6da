// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl apps`
enum AppsVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        guard arguments.isEmpty else { throw UsageError("apps takes no arguments") }
        let reply = try context.call(.listApps)
        if context.json { return context.printJSON(.object(reply)) }
        print(table(reply["apps"]?.arrayValue ?? []).render(legend: context.legend, noun: "app"), terminator: "")
    }

    static func table(_ apps: [JSON]) -> Table {
        var table = Table("PID", "UID", "COMMAND", "UNIT", "CONTAINMENT", "POLICY", "QUOTA", "STATE", "PHASE", "TASKS",
                          "REMAINING", "SUBSCRIBED", "MANAGER")
        for app in apps {
            let policy = app["policy"]?.stringValue.map { $0 + (app["exempt"] == true ? " (exempt)" : "") }
            table.add([app["pid"]?.cell ?? "-", app["uid"]?.cell ?? "-", app["command"]?.cell ?? "-",
                       app["unit"]?.cell ?? "-", app["containment"]?.cell ?? "-", policy ?? "-",
                       app["backgroundQuotaRemaining"]?.doubleValue.map { humanTime($0) } ?? "-",
                       app["state"]?.cell ?? "-", app["phase"]?.cell ?? "-", app["tasks"]?.cell ?? "0",
                       humanTime(app["backgroundTimeRemaining"]?.doubleValue), app["subscribed"]?.cell ?? "-",
                       app["manager"]?.cell ?? "-"])
        }
        return table
    }
}
