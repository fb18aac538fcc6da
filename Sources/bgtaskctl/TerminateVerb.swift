// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl terminate PID|--unit NAME`
enum TerminateVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let reply = try context.call(.terminate, try appArgument(arguments, verb: "terminate"))
        if context.json { context.printJSON(.object(reply)) }
    }
}
