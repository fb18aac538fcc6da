// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl expire PID|--unit NAME [--deadline]`: the app's expiration warning now (its
/// handlers run), or with `--deadline` its deadline.
enum ExpireVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let deadline = arguments.contains("--deadline")
        var parameters = try appArgument(arguments.filter { $0 != "--deadline" }, verb: "expire")
        parameters["to"] = .string(deadline ? "deadline" : "warning")
        let reply = try context.call(.expire, parameters)
        if context.json { context.printJSON(.object(reply)) }
    }
}
