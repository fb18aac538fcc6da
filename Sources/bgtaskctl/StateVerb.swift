// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl background PID|--unit NAME`, `bgtaskctl foreground PID|--unit NAME`
enum StateVerb {
    static func background(_ context: Context, _ arguments: [String]) throws {
        try set(context, arguments, state: "background")
    }

    static func foreground(_ context: Context, _ arguments: [String]) throws {
        try set(context, arguments, state: "foreground")
    }

    static func set(_ context: Context, _ arguments: [String], state: String) throws {
        var parameters = try appArgument(arguments, verb: state)
        parameters["state"] = .string(state)
        let reply = try context.call(.setAppState, parameters)
        if context.json { return context.printJSON(.object(reply)) }
        let app = reply["app"] ?? .null
        print(AppsVerb.table([app]).render(legend: context.legend, noun: "app"), terminator: "")
    }
}
