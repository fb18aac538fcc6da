// SPDX-License-Identifier: Apache-2.0
import Varlink

/// `bgtaskctl terminate PID|--unit NAME`
enum TerminateVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let reply = try context.call("Terminate", try appArgument(arguments, verb: "terminate"))
        if context.json { context.printJSON(.object(reply)) }
    }
}
