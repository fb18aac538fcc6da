import Varlink

/// `bgtaskctl terminate PID`
enum TerminateVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let pid = try pidArgument(arguments, verb: "terminate")
        let reply = try context.call("Terminate", ["pid": .int(pid)])
        if context.json { context.printJSON(.object(reply)) }
    }
}
