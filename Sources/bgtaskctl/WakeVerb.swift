// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl wake PID|--unit NAME [--reason TEXT] [--payload JSON]`
enum WakeVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        var rest: [String] = []
        var reason = "bgtaskctl wake"
        var payload: JSON?
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--reason" || argument == "--payload" {
                guard index + 1 < arguments.count else { throw UsageError("\(argument) needs a value") }
                let value = arguments[index + 1]
                if argument == "--reason" {
                    reason = value
                } else {
                    guard let parsed = try? JSON.parse(value), case .object = parsed else {
                        throw UsageError("--payload takes a JSON object, e.g. '{\"message\":42}'")
                    }
                    payload = parsed
                }
                index += 2
            } else {
                rest.append(argument)
                index += 1
            }
        }
        var parameters = try appArgument(rest, verb: "wake")
        parameters["reason"] = .string(reason)
        if let payload { parameters["payload"] = payload }
        let reply = try context.call(.wake, parameters)
        if context.json { return context.printJSON(.object(reply)) }
        switch reply["outcome"]?.stringValue {
        case "told"?: print("The app is in the background: told of the wake; its deadline stays.")
        case "foreground"?: print("The app is in the foreground: nothing to wake.")
        default:
            if let app = reply["app"] { print(AppsVerb.table([app]).render(legend: context.legend, noun: "app"), terminator: "") }
        }
    }
}
