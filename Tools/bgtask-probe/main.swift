// SPDX-License-Identifier: Apache-2.0
// bgtask-probe: a scriptable app for end-to-end tests.
//
// Reads commands on stdin, one per line, and writes one JSON object per line on stdout:
//   subscribe                 open a Subscribe stream        → {"event": {...}} per event
//   begin NAME                BeginTask                      → {"call":"begin","reply":{...}}
//   begin-more NAME           BeginTask with more, own conn  → {"task": {...}} per state
//   begin-json "NAME"         BeginTask, the name a JSON string literal (any bytes)
//   end ID                    EndTask                        → {"call":"end",...}
//   finish                    FinishBackgroundTransition     → {"call":"finish",...}
//   remaining                 GetTimeRemaining               → {"call":"remaining",...}
//   close-streams             close every begin-more connection
//   exit CODE                 exit with CODE
// A call on a connection the daemon closed (it restarted) connects again, once.
// Errors come back as {"call": ..., "error": NAME, "parameters": {...}}.
import BGTaskClient
import BGTaskProtocol
import BGTaskSystem
import Glibc
import Varlink

func emit(_ object: [String: JSON]) {
    let bytes = Array((JSON.object(object).serialized + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

var arguments = Array(CommandLine.arguments.dropFirst())
var socketPath: String?
if arguments.count >= 2, arguments[0] == "--socket" { socketPath = arguments[1]; arguments.removeFirst(2) }
let path = DaemonSocket.path(explicit: socketPath)

var main: VarlinkConnection?
var subscription: VarlinkConnection?
var taskStreams: [VarlinkConnection] = []
var input: [UInt8] = []

@MainActor func connection() throws -> VarlinkConnection {
    if let main { return main }
    let made = try VarlinkConnection(path: path)
    main = made
    return made
}

@MainActor func call(_ name: String, _ method: String, _ parameters: [String: JSON] = [:]) {
    do {
        let reply: [String: JSON]
        do {
            reply = try connection().call("io.bgtaskd.App.\(method)", parameters)
        } catch let error as ClientError where error.code != .callFailed {
            main = nil  // the daemon restarted: connect again, once
            reply = try connection().call("io.bgtaskd.App.\(method)", parameters)
        }
        emit(["call": .string(name), "reply": .object(reply)])
    } catch let error as ClientError {
        emit(["call": .string(name), "error": .string(error.varlinkError?.name ?? error.message),
              "parameters": .object(error.varlinkError?.parameters ?? [:])])
    } catch {
        emit(["call": .string(name), "error": .string("\(error)")])
    }
}

@MainActor func execute(_ line: String) {
    let words = line.split(separator: " ", maxSplits: 1).map(String.init)
    guard let command = words.first else { return }
    let argument = words.count > 1 ? words[1] : ""
    switch command {
    case "subscribe":
        do {
            let stream = try VarlinkConnection(path: path)
            try stream.send(VarlinkCall(.subscribe, more: true))
            subscription = stream
        } catch {
            emit(["call": "subscribe", "error": .string("\(error)")])
        }
    case "begin":
        call("begin", "BeginTask", ["name": .string(argument), "expirationHandler": .bool(true)])
    case "begin-json":
        let name = (try? JSON.parse(argument))?.stringValue ?? argument
        call("begin", "BeginTask", ["name": .string(name), "expirationHandler": .bool(true)])
    case "begin-more":
        do {
            let stream = try VarlinkConnection(path: path)
            try stream.send(VarlinkCall(.beginTask,
                                        parameters: ["name": .string(argument), "expirationHandler": .bool(true)], more: true))
            taskStreams.append(stream)
        } catch {
            emit(["call": "begin-more", "error": .string("\(error)")])
        }
    case "end":
        call("end", "EndTask", ["taskId": .int(Int64(argument) ?? 0)])
    case "finish":
        call("finish", "FinishBackgroundTransition")
    case "remaining":
        call("remaining", "GetTimeRemaining")
    case "close-streams":
        taskStreams.forEach { $0.close() }
        taskStreams = []
    case "exit":
        exit(Int32(argument) ?? 0)
    default:
        emit(["error": .string("unknown command '\(command)'")])
    }
}

/// Reads every reply buffered or waiting on a stream and emits it under `key`.
func drain(_ stream: VarlinkConnection, as key: String) -> Bool {
    repeat {
        guard let reply = try? stream.receive(timeoutMilliseconds: 0) else { return false }
        if let error = reply.error {
            emit([key: .object(["error": .string(error), "parameters": .object(reply.parameters)])])
        } else {
            emit([key: .object(reply.parameters)])
        }
        if !reply.continues { return false }
    } while stream.hasBufferedReply
    return true
}

emit(["ready": .int(Int64(getpid()))])
while true {
    var fds = [pollfd(fd: 0, events: Int16(POLLIN), revents: 0)]
    if let subscription { fds.append(pollfd(fd: subscription.fileDescriptor, events: Int16(POLLIN), revents: 0)) }
    for stream in taskStreams { fds.append(pollfd(fd: stream.fileDescriptor, events: Int16(POLLIN), revents: 0)) }
    if poll(&fds, nfds_t(fds.count), -1) < 0 { if errno == EINTR { continue } else { exit(1) } }
    var index = 1
    if let stream = subscription {
        if fds[index].revents != 0, !drain(stream, as: "event") { subscription = nil }
        index += 1
    }
    var open: [VarlinkConnection] = []
    for stream in taskStreams {
        if fds[index].revents == 0 || drain(stream, as: "task") { open.append(stream) }
        index += 1
    }
    taskStreams = open
    if fds[0].revents != 0 {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = read(0, &buffer, buffer.count)
        if n <= 0 { exit(0) }  // stdin closed: the test is done with us
        input += buffer[..<n]
        while let newline = input.firstIndex(of: UInt8(ascii: "\n")) {
            let line = String(decoding: input[..<newline], as: UTF8.self)
            input.removeSubrange(...newline)
            execute(line)
        }
    }
}
