// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import Varlink

/// `bgtaskctl status`: the daemon summary, then the apps table.
enum StatusVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        guard arguments.isEmpty else { throw UsageError("status takes no arguments") }
        let connection = try context.connect()
        let status = try connection.call(.manager(.getStatus))
        let apps = try connection.call(.manager(.listApps))["apps"]?.arrayValue ?? []
        if context.json { return context.printJSON(.object(["status": .object(status), "apps": .array(apps)])) }
        let count = { (key: String) in status[key]?.intValue ?? 0 }
        print("""
        bgtaskd \(status["version"]?.cell ?? "?") on \(connection.path)
               Uptime: \(humanTime(status["uptime"]?.doubleValue ?? 0))
                 Apps: \(count("apps")) (\(count("backgroundApps")) background, \(count("suspendedApps")) suspended)
                Tasks: \(count("tasks"))
          Connections: \(count("connections"))
           Keep awake: \(keepAwake(status))

        """)
        print(AppsVerb.table(apps).render(legend: context.legend, noun: "app"), terminator: "")
    }

    /// `KeepAwake=` as the daemon says it (`keepAwake`; a daemon older than that field, only
    /// whether the inhibitor is held).
    static func keepAwake(_ status: [String: JSON]) -> String {
        switch status["keepAwake"]?.stringValue {
        case "held"?: "yes (logind's idle inhibitor held: apps run in the background)"
        case "asking"?: "not yet (logind's idle inhibitor asked for: apps run in the background)"
        case "refused"?: "no: logind's idle inhibitor refused (\(status["keepAwakeError"]?.stringValue ?? "no reason given")); asked again each minute while apps run in the background"
        case "off"?: "no (KeepAwake=no)"
        case "idle"?: "no (no app runs in the background)"
        default: status["idleInhibited"]?.boolValue == true ? "yes (logind's idle inhibitor held)" : "no"
        }
    }
}
