// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import Glibc

/// `bgtaskctl [--socket PATH|--user|--system] [--json] [--no-legend] VERB [ARGS...]`
let verbs: [String: (Context, [String]) throws -> Void] = [
    "status": StatusVerb.run, "apps": AppsVerb.run, "tasks": TasksVerb.run, "history": HistoryVerb.run,
    "background": StateVerb.background, "foreground": StateVerb.foreground, "terminate": TerminateVerb.run, "expire": ExpireVerb.run, "policy": PolicyVerb.run, "wake": WakeVerb.run,
    "monitor": MonitorVerb.run, "reload": ReloadVerb.run, "run": RunVerb.run,
    "requests": RequestsVerb.run, "launch": RequestsVerb.launch,
]

var arguments = Array(CommandLine.arguments.dropFirst())[...]
/// The verb being run, once known (for its usage on a usage error).
var currentVerb: String?
var context = Context()
do {
    while let first = arguments.first, first.hasPrefix("-") {
        arguments.removeFirst()
        switch first {
        case "--json": context.json = true
        case "--no-legend": context.legend = false
        case "--socket":
            guard let path = arguments.popFirst() else { throw UsageError("--socket needs a path") }
            context.socketPath = path
        case let flag where flag.hasPrefix("--socket="): context.socketPath = String(flag.dropFirst("--socket=".count))
        case "--user": context.socketPath = DaemonSocket.userPath  // the per-user daemon's, as `systemctl --user`
        case "--system": context.socketPath = DaemonSocket.systemPath  // the system daemon's, whatever else answers
        case "-h", "--help": print(Context.usage); exit(0)
        case "--version": print("bgtaskctl 0.1.0"); exit(0)
        default: throw UsageError("unknown option '\(first)'")
        }
    }
    guard let verb = arguments.popFirst() else { throw UsageError("no verb given") }
    if verb == "help" {
        guard arguments.count <= 1 else { throw UsageError("help takes at most one VERB") }
        guard let named = arguments.first else { print(Context.usage); exit(0) }
        if named == "-h" || named == "--help" { print(VerbHelp.table["help"]!.usage, terminator: ""); exit(0) }
        guard let help = VerbHelp.table[named] else { throw UsageError("unknown verb '\(named)'") }
        print(help.usage, terminator: "")
        exit(0)
    }
    guard let run = verbs[verb], let help = VerbHelp.table[verb] else { throw UsageError("unknown verb '\(verb)'") }
    currentVerb = verb
    if VerbHelp.asksForHelp(Array(arguments)) {
        print(help.usage, terminator: "")
        exit(0)
    }
    if let option = help.unknownOption(in: Array(arguments)) { throw UsageError("\(verb): unknown option '\(option)'") }
    try run(context, Array(arguments))
    exit(0)
} catch let error as UsageError {
    // A verb's usage error shows that verb's usage; any other, the whole.
    printError("bgtaskctl: \(error.message)\n\n\(currentVerb.flatMap { VerbHelp.table[$0]?.usage } ?? Context.usage)")
    exit(2)
} catch let error as ClientError {
    printError("bgtaskctl: \(explain(error, verb: currentVerb))")
    exit(1)
} catch {
    printError("bgtaskctl: \(error)")
    exit(1)
}

/// A sentence for the errors people meet; the raw Varlink error otherwise.
func explain(_ error: ClientError, verb: String?) -> String {
    guard let varlink = error.varlinkError else { return error.message }
    let parameter = { (key: String) in varlink.parameters[key]?.cell ?? "?" }
    switch ErrorName(varlink) {
    case .noSuchApp?:
        if let unit = varlink.parameters["unit"]?.stringValue { return "no unit app or unit named \(unit.cEscaped)" }
        return "no app contains pid \(parameter("pid"))"
    case .permissionDenied?:
        if verb == "reload" { return "permission denied: reloading is for root, ManagerGroup and the daemon's own user" }
        return "permission denied: the app belongs to another user"
    case .invalidParameter?: return "invalid parameter: \(parameter("parameter"))"
    case .invalidConfiguration?: return "configuration not reloaded: \(parameter("message"))"
    case .limitExceeded?: return "limit reached: \(parameter("limit"))"
    case .noSuchTaskRequest?: return "no pending request \(parameter("identifier")) for that app"
    default: return error.message
    }
}
