// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import BGTaskSystem
import Glibc
import Varlink

/// An error from talking to bgtaskd: a code callers can switch on (new codes may be added),
/// and a sentence for people.
public struct ClientError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What kind of failure; compare with the static members.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(_ rawValue: String) { self.rawValue = rawValue }
        /// The daemon could not be reached.
        public static let notConnected = Code("notConnected")
        /// The connection broke or the daemon sent something that is not Varlink.
        public static let protocolError = Code("protocolError")
        /// The daemon answered with a Varlink error (see `varlinkError`).
        public static let callFailed = Code("callFailed")
        /// No answer within the time allowed.
        public static let timedOut = Code("timedOut")
        public var description: String { rawValue }
    }

    public var code: Code
    public var message: String
    /// The Varlink error name and parameters, for `callFailed`.
    public var varlinkError: VarlinkError?

    public init(_ code: Code, _ message: String, varlinkError: VarlinkError? = nil) {
        self.code = code
        self.message = message
        self.varlinkError = varlinkError
    }

    public var description: String { message }
}

/// Where clients find the daemon: `--socket PATH`, else `$BGTASKD_SOCKET`, else the per-user
/// daemon's socket where one answers as the caller's own uid or root (the user enabled their
/// own), else the system socket. The same rule in the C library (`bgtask_app_new`),
/// `bgtaskctl` and `bgtask-session`.
public enum DaemonSocket {
    public static let systemPath = "/run/bgtaskd/io.bgtaskd"

    /// The per-user daemon's socket, `$XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd` (its user unit's,
    /// and `make run`'s), the runtime directory `/run/user/UID` where that is not set (as
    /// `make run` takes it).
    public static var userPath: String {
        let runtime = getenv("XDG_RUNTIME_DIR").flatMap { $0.pointee == 0 ? nil : String(cString: $0) } ?? "/run/user/\(getuid())"
        return runtime + "/bgtaskd/io.bgtaskd"
    }

    public static func path(explicit: String? = nil) -> String {
        if let explicit { return explicit }
        if let value = getenv("BGTASKD_SOCKET"), value.pointee != 0 { return String(cString: value) }
        let user = userPath
        return isOwnDaemon(at: user) ? user : systemPath
    }

    /// Whether a daemon answers at `path` as this process's user or root. An inherited
    /// `$XDG_RUNTIME_DIR` (`sudo -E`, `su` without `-`) names another user's directory: root's
    /// clients would talk to that user's daemon, or to anything they run there.
    static func isOwnDaemon(at path: String) -> Bool {
        guard let socket = try? UnixSocket.connect(path: path) else { return false }
        defer { socket.close() }
        return (try? UnixSocket.peerCredentials(socket))?.isThisUserOrRoot == true
    }
}

/// A blocking Varlink connection: one call at a time, or one stream followed reply by reply.
public final class VarlinkConnection {
    public let path: String
    let socket: FileDescriptor
    var framer = VarlinkFramer(maximumMessageBytes: 1 << 30)  // ListTasks of a busy daemon is large

    /// Connects to the daemon's socket at `path`. A non-blocking connection never waits:
    /// writes take what the socket takes, and connecting fails if the daemon's backlog is full.
    public init(path: String, nonBlocking: Bool = false) throws(ClientError) {
        self.path = path
        do {
            socket = try UnixSocket.connect(path: path, nonBlocking: nonBlocking)
        } catch {
            throw ClientError(.notConnected, "cannot connect to bgtaskd at \(path): \(String(cString: strerror(error.code)))")
        }
    }

    /// The socket, for waiting on several connections at once.
    public var fileDescriptor: Int32 { socket.rawValue }

    /// Whether a complete reply is already buffered (so `poll` would not show it).
    public var hasBufferedReply: Bool { framer.bufferedByteCount > 0 && peekComplete() }

    private func peekComplete() -> Bool {
        var copy = framer
        return (try? copy.next()) != nil
    }

    /// Sends a call without waiting for its reply.
    public func send(_ call: VarlinkCall) throws(ClientError) {
        do {
            try socket.writeAll(call.json.varlinkFrame)
        } catch {
            throw ClientError(.protocolError, "lost the connection to bgtaskd: \(error)")
        }
    }

    /// Reads the next reply; a Varlink error reply is returned, not thrown.
    /// - Parameter timeoutMilliseconds: -1 waits forever.
    public func receive(timeoutMilliseconds: Int32 = -1) throws(ClientError) -> VarlinkReply {
        while true {
            do {
                if let message = try framer.next() {
                    do {
                        return try VarlinkReply(message: JSON.parse(message))
                    } catch {
                        throw ClientError(.protocolError, "bgtaskd sent a malformed reply: \(error)")
                    }
                }
            } catch let error as ClientError {
                throw error
            } catch {
                throw ClientError(.protocolError, "bgtaskd sent an oversized reply")
            }
            do {
                if timeoutMilliseconds == 0 {
                    // A look without waiting: one read that does not block (a zero-timeout poll
                    // and a read were two system calls for each event the library follows).
                    guard let bytes = try socket.receiveAvailable(upTo: 65536) else {
                        throw ClientError(.timedOut, "no reply from bgtaskd within 0 ms")
                    }
                    if bytes.isEmpty { throw ClientError(.protocolError, "bgtaskd closed the connection") }
                    framer.append(bytes)
                    continue
                }
                if timeoutMilliseconds >= 0, try !socket.waitReadable(timeoutMilliseconds: timeoutMilliseconds),
                   // The caller may have been stopped (its own call can suspend its app) and
                   // resumed after the deadline with the reply waiting: look once more.
                   try !socket.waitReadable(timeoutMilliseconds: 0) {
                    throw ClientError(.timedOut, "no reply from bgtaskd within \(timeoutMilliseconds) ms")
                }
                let bytes = try socket.read(upTo: 65536)
                if bytes.isEmpty { throw ClientError(.protocolError, "bgtaskd closed the connection") }
                framer.append(bytes)
            } catch let error as ClientError {
                throw error
            } catch {
                throw ClientError(.protocolError, "lost the connection to bgtaskd: \(error)")
            }
        }
    }

    /// Calls `method` and returns the first reply's parameters; a Varlink error is thrown
    /// as `callFailed`.
    @discardableResult
    public func call(_ method: String, _ parameters: [String: JSON] = [:], more: Bool = false,
                     timeoutMilliseconds: Int32 = -1) throws(ClientError) -> [String: JSON] {
        try send(VarlinkCall(method: method, parameters: parameters, more: more))
        return try Self.check(try receive(timeoutMilliseconds: timeoutMilliseconds))
    }

    /// Calls one of bgtaskd's methods.
    @discardableResult
    public func call(_ method: BGTaskProtocol.Method, _ parameters: [String: JSON] = [:], more: Bool = false,
                     timeoutMilliseconds: Int32 = -1) throws(ClientError) -> [String: JSON] {
        try call(method.qualified, parameters, more: more, timeoutMilliseconds: timeoutMilliseconds)
    }

    /// The reply's parameters, or its error thrown as `callFailed`.
    public static func check(_ reply: VarlinkReply) throws(ClientError) -> [String: JSON] {
        if let name = reply.error {
            let error = VarlinkError(name, parameters: reply.parameters)
            throw ClientError(.callFailed, "\(error)", varlinkError: error)
        }
        return reply.parameters
    }

    /// Closes the connection (tasks begun on it with `more` end).
    public func close() { socket.close() }
}

/// Calls made without waiting, for a thread that must never block on the daemon: each call
/// is queued with a tag, written as the socket takes it, and its reply is read when it
/// arrives (replies come in call order).
public final class PipelinedConnection<Tag> {
    private let connection: VarlinkConnection
    private var output: [UInt8] = []
    /// The calls sent or queued whose replies have not arrived, oldest first.
    public private(set) var unanswered: [Tag] = []

    public init(path: String) throws(ClientError) {
        connection = try VarlinkConnection(path: path, nonBlocking: true)
    }

    public var fileDescriptor: Int32 { connection.fileDescriptor }

    /// Whether bytes wait to be written (then wait for the socket to be writable too).
    public var wantsWrite: Bool { !output.isEmpty }

    /// Queues `call` and writes what the socket takes now (`flush: false`: queued only, so
    /// that many calls go out in one write, and the daemon reads them in one pass).
    public func send(_ call: VarlinkCall, tag: Tag, flush: Bool = true) throws(ClientError) {
        output += call.json.varlinkFrame
        unanswered.append(tag)
        if flush { try self.flush() }
    }

    /// Writes what the socket takes now.
    public func flush() throws(ClientError) {
        do {
            while !output.isEmpty, let written = try connection.socket.writeAvailable(output) {
                output.removeFirst(written)
            }
        } catch {
            throw ClientError(.protocolError, "lost the connection to bgtaskd: \(error)")
        }
    }

    /// The replies that have arrived, each with its call's tag. For a caller told by a
    /// level-triggered poll that the socket is readable: what arrives after the read is
    /// announced by the next poll.
    public func receiveAvailable() throws(ClientError) -> [(Tag, VarlinkReply)] {
        var replies: [(Tag, VarlinkReply)] = []
        do {
            while let bytes = try connection.socket.readAvailable(upTo: Self.readSize) {
                if bytes.isEmpty { throw ClientError(.protocolError, "bgtaskd closed the connection") }
                connection.framer.append(bytes)
                // A stream socket's read copies every byte queued, up to the size asked: a
                // shorter read took them all, and another would find nothing (it was one
                // more system call per batch of replies).
                if bytes.count < Self.readSize { break }
            }
        } catch let error as ClientError {
            throw error
        } catch {
            throw ClientError(.protocolError, "lost the connection to bgtaskd: \(error)")
        }
        while connection.hasBufferedReply {
            let reply = try connection.receive(timeoutMilliseconds: 0)
            guard !unanswered.isEmpty else { throw ClientError(.protocolError, "bgtaskd sent a reply to no call") }
            replies.append((unanswered.removeFirst(), reply))
        }
        return replies
    }

    public func close() { connection.close() }

    /// The most one read takes.
    static var readSize: Int { 65536 }
}
