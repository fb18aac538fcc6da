// SPDX-License-Identifier: Apache-2.0
/// Each verb's usage, for `bgtaskctl VERB --help` and `bgtaskctl help VERB`: what it does,
/// its arguments, an example; and the options it takes, so that any other is a usage error.
struct VerbHelp {
    var synopsis: String
    var text: String
    var example: String
    /// Options the verb takes (`--unit` also as `--unit=NAME`).
    var options: [String] = []

    static let table: [String: VerbHelp] = [
        "status": VerbHelp(synopsis: "status", text: "The daemon's summary (version, apps, tasks, connections, uptime) and the apps table.",
                           example: "bgtaskctl status"),
        "apps": VerbHelp(synopsis: "apps", text: "Every app you may see: its state, phase, tasks, time left, containment, policy and quota.",
                         example: "bgtaskctl --json apps"),
        "tasks": VerbHelp(synopsis: "tasks [PID|--unit NAME]",
                          text: "Active background tasks: all you may see, or those of the app containing PID, or of the unit app NAME.",
                          example: "bgtaskctl tasks 1234", options: ["--unit"]),
        "history": VerbHelp(synopsis: "history", text: "Suspensions, resumptions, terminations and wakes, with their reasons, oldest first.",
                            example: "bgtaskctl history"),
        "monitor": VerbHelp(synopsis: "monitor", text: "Every event as it happens (one JSON object a line with --json), until interrupted.",
                            example: "bgtaskctl --json monitor"),
        "background": VerbHelp(synopsis: "background PID|--unit NAME",
                               text: "Moves the app containing PID (or the unit app NAME) to the background: its transition window and background time begin.",
                               example: "bgtaskctl background --unit app-org.example.Editor-1234.scope", options: ["--unit"]),
        "foreground": VerbHelp(synopsis: "foreground PID|--unit NAME",
                               text: "Brings the app to the foreground: a suspended app is resumed, its deadline cleared.",
                               example: "bgtaskctl foreground 1234", options: ["--unit"]),
        "terminate": VerbHelp(synopsis: "terminate PID|--unit NAME", text: "Terminates the app (TerminateSignal, then SIGKILL after TerminateGraceSec).",
                              example: "bgtaskctl terminate 1234", options: ["--unit"]),
        "expire": VerbHelp(synopsis: "expire PID|--unit NAME [--deadline]",
                           text: "Gives a background app its expiration warning now (its handlers run), or with --deadline passes its deadline now.",
                           example: "bgtaskctl expire 1234 --deadline", options: ["--unit", "--deadline"]),
        "policy": VerbHelp(synopsis: "policy PID|--unit NAME", text: "Which policy file matched the app, and the settings it lives by.",
                           example: "bgtaskctl policy 1234", options: ["--unit"]),
        "wake": VerbHelp(synopsis: "wake PID|--unit NAME [--reason TEXT] [--payload JSON]",
                         text: "Resumes a suspended app into the background for WakeTimeSec, as for a background fetch or a silent push; its subscribers get didWake with the reason and payload (a JSON object of at most 4 KiB).",
                         example: "bgtaskctl wake 1234 --reason sync --payload '{\"mailbox\":\"inbox\"}'",
                         options: ["--unit", "--reason", "--payload"]),
        "requests": VerbHelp(synopsis: "requests [PID|--unit NAME]",
                             text: "Pending scheduled requests (BGTaskScheduler): of all apps you may see, or of one; when each is due, its conditions, and what it waits for (date, power, network, quota, coalescing, foreground, app).",
                             example: "bgtaskctl requests 1234", options: ["--unit"]),
        "launch": VerbHelp(synopsis: "launch PID|--unit NAME IDENTIFIER",
                           text: "Launches the app's pending request IDENTIFIER now, whatever its date, conditions and budget (iOS's debugger-only _simulateLaunchForTaskWithIdentifier).",
                           example: "bgtaskctl launch 1234 org.example.refresh", options: ["--unit"]),
        "reload": VerbHelp(synopsis: "reload", text: "Reloads the daemon's configuration and policies (root or ManagerGroup); a bad file keeps the old ones.",
                           example: "bgtaskctl reload"),
        "run": VerbHelp(synopsis: "run [--name NAME] -- CMD...",
                        text: "Holds a background task while CMD runs; when the task starts expiring CMD gets SIGTERM; exits with CMD's status.",
                        example: "bgtaskctl run --name backup -- rsync -a ~/ /mnt/backup/", options: ["--name"]),
        "help": VerbHelp(synopsis: "help [VERB]", text: "This usage, or VERB's.", example: "bgtaskctl help wake"),
    ]

    /// `Usage: bgtaskctl VERB ...`, what it does, and an example.
    var usage: String {
        "Usage: bgtaskctl [--socket PATH|--user|--system] [--json] [--no-legend] \(synopsis)\n\n\(text)\n\nExample:\n  \(example)\n"
    }

    /// Whether `arguments` ask for help (before `--`, where a command begins).
    static func asksForHelp(_ arguments: [String]) -> Bool {
        arguments.prefix { $0 != "--" }.contains { $0 == "-h" || $0 == "--help" }
    }

    /// The first option in `arguments` (before `--`) the verb does not take.
    func unknownOption(in arguments: [String]) -> String? {
        var rest = arguments.prefix { $0 != "--" }[...]
        while let argument = rest.popFirst() {
            guard argument.hasPrefix("-"), argument.count > 1 else { continue }
            let name = String(argument.prefix { $0 != "=" })
            guard options.contains(name) else { return argument }
            if name == argument, Self.takingValues.contains(name) { _ = rest.popFirst() }  // its value, whatever it is
        }
        return nil
    }

    static let takingValues: Set = ["--unit", "--reason", "--payload", "--name"]
}
