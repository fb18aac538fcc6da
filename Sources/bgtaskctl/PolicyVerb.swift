// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `bgtaskctl policy PID|--unit NAME`: which policy file matched the app, and the settings
/// it lives by, like `networkctl status`.
enum PolicyVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        let reply = try context.call(.getPolicy, try appArgument(arguments, verb: "policy"))
        if context.json { return context.printJSON(.object(reply)) }
        let file = reply["file"]?.stringValue
        print("Policy: " + (reply["policy"]?.stringValue.map { "\($0) (\(file ?? "?"))" } ?? "none (bgtaskd.conf alone)"))
        let settings = reply["settings"]?.objectValue ?? [:]
        for name in settings.keys.sorted() {
            print("  \(name)=\(settings[name]?.cell ?? "")".replacingOccurrences(of: "=-", with: "="))
        }
    }
}
