// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl requests [PID|--unit NAME]`: pending scheduled requests and what each waits
/// for; `bgtaskctl launch PID|--unit NAME IDENTIFIER`: one launched now.
enum RequestsVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let parameters = arguments.isEmpty ? [:] : try appArgument(arguments, verb: "requests")
        let reply = try context.call(.listTaskRequests, parameters)
        if context.json { return context.printJSON(.object(reply)) }
        var table = Table("PID", "UID", "IDENTIFIER", "KIND", "DUE", "CONDITIONS", "WAITING FOR")
        for request in reply["requests"]?.arrayValue ?? [] {
            let due = request["earliestBeginDate"]?.doubleValue ?? 0
            var conditions = [request["requiresExternalPower"]?.boolValue == true ? "power" : nil,
                              request["requiresNetworkConnectivity"]?.boolValue == true ? "network" : nil].compactMap { $0 }
            if let interval = request["interval"]?.doubleValue { conditions.append("every " + humanTime(interval)) }
            table.add([request["pid"]?.cell ?? "-", request["uid"]?.cell ?? "-", request["identifier"]?.cell ?? "-",
                       request["kind"]?.cell ?? "-", due > 0 ? "in " + humanTime(due) : "now",
                       conditions.isEmpty ? "-" : conditions.joined(separator: ","), request["waitingFor"]?.cell ?? "-"])
        }
        print(table.render(legend: context.legend, noun: "request"), terminator: "")
        if context.legend {
            let power = reply["externalPower"]?.boolValue == true ? "on external power" : "on battery"
            let network = reply["network"]?.boolValue == true ? "a default route" : "no default route"
            print("Now: \(power), \(network).")
        }
    }

    static func launch(_ context: Context, _ arguments: [String]) throws {
        guard let identifier = arguments.last, arguments.count >= 2 else {
            throw UsageError("launch takes PID|--unit NAME and an IDENTIFIER")
        }
        var parameters = try appArgument(Array(arguments.dropLast()), verb: "launch")
        parameters["identifier"] = .string(identifier)
        let reply = try context.call(.launchTask, parameters)
        if context.json { context.printJSON(.object(reply)) }
    }
}
