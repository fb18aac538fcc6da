// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl reload`
enum ReloadVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        guard arguments.isEmpty else { throw UsageError("reload takes no arguments") }
        let reply = try context.call(.reload)
        if context.json { context.printJSON(.object(reply)) }
    }
}
