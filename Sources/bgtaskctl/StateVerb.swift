import Varlink

/// `bgtaskctl background PID`, `bgtaskctl foreground PID`
enum StateVerb {
    static func background(_ context: Context, _ arguments: [String]) throws {
        try set(context, arguments, state: "background")
    }

    static func foreground(_ context: Context, _ arguments: [String]) throws {
        try set(context, arguments, state: "foreground")
    }

    static func set(_ context: Context, _ arguments: [String], state: String) throws {
        let pid = try pidArgument(arguments, verb: state)
        let reply = try context.call("SetAppState", ["pid": .int(pid), "state": .string(state)])
        if context.json { return context.printJSON(.object(reply)) }
        let app = reply["app"] ?? .null
        print(AppsVerb.table([app]).render(legend: context.legend, noun: "app"), terminator: "")
    }
}
