// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import Glibc
import Varlink

/// Global options and the connection every verb uses.
struct Context {
    var socketPath: String?
    var json = false
    var legend = true

    static let usage = """
    Usage: bgtaskctl [--socket PATH|--user|--system] [--json] [--no-legend] VERB [ARGS...]

    Verbs:
      status                 daemon summary and the apps table
      apps                   list apps
      tasks [PID|--unit NAME]
                             list active background tasks (of the app containing PID,
                             or of the unit app NAME)
      history                suspensions, resumptions and terminations
      monitor                print events as they happen, until interrupted
      background PID|--unit NAME
                             move the app containing PID (or the unit NAME) to the background
      foreground PID|--unit NAME
                             bring the app to the foreground
      terminate PID|--unit NAME
                             terminate the app
      expire PID|--unit NAME [--deadline]
                             give a background app its expiration warning now (its
                             handlers run), or with --deadline pass its deadline now
      policy PID|--unit NAME which policy file matched the app, and its effective settings
      wake PID|--unit NAME [--reason TEXT] [--payload JSON]
                             resume a suspended app into the background for WakeTimeSec,
                             as for a background fetch or a silent push
      requests [PID|--unit NAME]
                             pending scheduled requests (BGTaskScheduler) and what each
                             waits for
      launch PID|--unit NAME IDENTIFIER
                             launch the app's pending request now, whatever its date,
                             conditions and budget
      reload                 reload the daemon's configuration
      help [VERB]            this usage, or VERB's (also: bgtaskctl VERB --help)
      run [--name NAME] -- CMD...
                             hold a background task while CMD runs; CMD gets SIGTERM when
                             the task starts expiring; exits with CMD's status

    The socket is PATH (--user: $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd, the per-user
    daemon's; --system: \(DaemonSocket.systemPath)), else $BGTASKD_SOCKET, else the
    per-user daemon's where one answers as your user or root, else the system daemon's.
    Exit status: 0 success, 1 failure, 2 usage error.
    """

    /// A connection to the daemon; where none answers at one of the two sockets the units
    /// make, the error says how to start it.
    func connect() throws(ClientError) -> VarlinkConnection {
        let path = DaemonSocket.path(explicit: socketPath)
        do {
            return try VarlinkConnection(path: path)
        } catch where error.code == .notConnected {
            switch path {
            case DaemonSocket.systemPath:
                throw ClientError(.notConnected, error.message + " (is bgtaskd.socket started? systemctl status bgtaskd.socket)")
            case DaemonSocket.userPath:
                throw ClientError(.notConnected, error.message + " (a per-user daemon runs once enabled: systemctl --user enable --now bgtaskd.socket)")
            default:
                throw error
            }
        }
    }

    /// Calls a Manager method and returns its reply parameters.
    func call(_ method: ManagerMethod, _ parameters: [String: JSON] = [:]) throws -> [String: JSON] {
        try connect().call(.manager(method), parameters)
    }

    /// Prints one JSON document.
    func printJSON(_ value: JSON) { print(value.serialized) }
}

struct UsageError: Error {
    var message: String
    init(_ message: String) { self.message = message }
}

func printError(_ text: String) {
    let bytes = Array((text + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}

/// A PID argument: a positive integer.
func pidArgument(_ arguments: [String], verb: String) throws -> Int64 {
    guard arguments.count == 1, let pid = Int64(arguments[0]), pid > 0, pid <= Int64(Int32.max) else {
        throw UsageError("\(verb) takes one PID or --unit NAME")
    }
    return pid
}

/// `PID` or `--unit NAME` as call parameters: `{"pid": PID}` or `{"unit": NAME}`.
func appArgument(_ arguments: [String], verb: String) throws -> [String: JSON] {
    if arguments.first == "--unit" || arguments.first?.hasPrefix("--unit=") == true {
        let name = arguments.first == "--unit" ? (arguments.count == 2 ? arguments[1] : nil) : String(arguments[0].dropFirst(7))
        guard let name, !name.isEmpty, arguments.count == (arguments.first == "--unit" ? 2 : 1) else {
            throw UsageError("\(verb) takes one PID or --unit NAME")
        }
        return ["unit": .string(name)]
    }
    return ["pid": .int(try pidArgument(arguments, verb: verb))]
}

/// Writes a line to standard output at once (no buffering), for live output.
func writeLine(_ text: String) {
    let bytes = Array((text + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}
