// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskProtocol
import BGTaskSystem
import Glibc
import Varlink

/// `bgtaskctl run [--name NAME] -- CMD...`: holds a background task while CMD runs, like
/// `systemd-inhibit` holds a lock. When the task starts expiring (or is denied or ends),
/// CMD gets `SIGTERM`. `SIGINT`/`SIGTERM` to bgtaskctl are passed on to CMD. Exits with
/// CMD's status (128 + N if a signal N ended it). This process does not subscribe: it
/// follows its own task's stream.
enum RunVerb {
    static func run(_ context: Context, _ arguments: [String]) throws {
        var rest = arguments[...]
        var name = ""
        while let first = rest.first, first != "--" {
            rest.removeFirst()
            switch first {
            case "--name": name = try rest.popFirst() ?? { throw UsageError("--name needs a value") }()
            case let flag where flag.hasPrefix("--name="): name = String(flag.dropFirst("--name=".count))
            default: throw UsageError("run: unknown option '\(first)'")
            }
        }
        guard rest.popFirst() == "--", !rest.isEmpty else { throw UsageError("run needs -- CMD...") }
        let command = Array(rest)
        if name.isEmpty { name = command[0] }

        // The task first: a command that must not run without it does not start.
        let stream = try context.connect()
        try stream.send(VarlinkCall(.beginTask,
                                    parameters: ["name": .string(name), "expirationHandler": true], more: true))
        let first = try VarlinkConnection.check(try stream.receive(timeoutMilliseconds: 10_000))
        let signals = try SignalDescriptor([SIGINT, SIGTERM, SIGHUP])
        let child = try Subprocess.spawn(command)
        var warned = false
        var taskOpen = first["state"]?.stringValue.map { ["pending", "granted", "expiring"].contains($0) } ?? false
        func stop(_ why: String) {
            guard !warned else { return }
            warned = true
            printError("bgtaskctl run: task \(first["taskId"]?.cell ?? "?") (\(name)) \(why); sending SIGTERM to \(command[0])")
            try? child.send(signal: SIGTERM)
        }
        if first["state"]?.stringValue == "expiring" { stop("is expiring") }
        while true {
            let descriptors = [child.descriptor.rawValue, signals.descriptor.rawValue] + (taskOpen ? [stream.fileDescriptor] : [])
            let ready = try waitReadable(descriptors)
            if ready.contains(0) {
                let status = try Subprocess.wait(pid: child.pid) ?? 0
                // Exit without closing first: the connection closes with the process, so the
                // task ends as the app's process tree winds down, not before.
                exit(Subprocess.exitCode(status))
            }
            if ready.contains(1) {
                try? child.send(signal: try signals.next())
            }
            if ready.contains(2) {
                repeat {
                    let reply = try stream.receive()
                    let state = reply.error == nil ? reply.parameters["state"]?.stringValue : nil
                    switch state {
                    case "expiring"?: stop("is expiring")
                    case "denied"?, "ended"?, "expired"?: stop("\(state!)")
                    case nil: stop("failed: \(reply.error ?? "?")")
                    default: break
                    }
                    if !reply.continues { taskOpen = false }
                } while taskOpen && stream.hasBufferedReply
            }
        }
    }
}
