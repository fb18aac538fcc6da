// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl tasks [PID|--unit NAME]`
enum TasksVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let parameters = arguments.isEmpty ? [:] : try appArgument(arguments, verb: "tasks")
        let reply = try context.call(.listTasks, parameters)
        if context.json { return context.printJSON(.object(reply)) }
        var table = Table("ID", "PID", "APP", "NAME", "STATE", "AGE", "HANDLER")
        for task in reply["tasks"]?.arrayValue ?? [] {
            table.add([task["id"]?.cell ?? "-", task["pid"]?.cell ?? "-", task["appPid"]?.cell ?? "-",
                       task["name"]?.cell ?? "-", task["state"]?.cell ?? "-", humanTime(task["age"]?.doubleValue ?? 0),
                       task["expirationHandler"]?.cell ?? "-"])
        }
        print(table.render(legend: context.legend, noun: "task"), terminator: "")
    }
}
