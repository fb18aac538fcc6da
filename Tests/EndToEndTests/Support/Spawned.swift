import BGTaskSystem
import CSystemd
import Glibc
import Testing

/// A child process the test started, held by a pidfd taken right after spawning (the child
/// is unreaped until `wait`, so its pid cannot be recycled before that). Stdin and stdout
/// are pipes; stderr is inherited, merged into stdout, or written to a file.
final class Spawned {
    enum StandardError {
        case inherit
        case mergeIntoOutput
        case file(String)
    }

    let pid: Int32
    let pidfd: Pidfd
    private let stdinFD: FileDescriptor
    private let stdoutFD: FileDescriptor
    private var buffered: [UInt8] = []
    private(set) var exitStatus: Int32?

    /// Starts `path` with `arguments` and the given environment (default: this process's).
    init(_ path: String, _ arguments: [String], environment: [String]? = nil,
         standardError: StandardError = .inherit) throws {
        var toChild: [Int32] = [0, 0], fromChild: [Int32] = [0, 0]
        try systemCall("pipe2") { pipe2(&toChild, O_CLOEXEC) }
        try systemCall("pipe2") { pipe2(&fromChild, O_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, toChild[0], 0)
        posix_spawn_file_actions_adddup2(&actions, fromChild[1], 1)
        switch standardError {
        case .inherit: break
        case .mergeIntoOutput: posix_spawn_file_actions_adddup2(&actions, fromChild[1], 2)
        case let .file(path): posix_spawn_file_actions_addopen(&actions, 2, path, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        }
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let env = (environment ?? Self.currentEnvironment()).map { strdup($0) } + [nil]
        defer { (argv + env).forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, path, &actions, nil, argv, env)
        close(toChild[0])
        close(fromChild[1])
        guard result == 0 else {
            close(toChild[1]); close(fromChild[0])
            throw Errno(result, "posix_spawn(\(path))")
        }
        self.pid = pid
        self.pidfd = try Pidfd.open(pid: pid)
        self.stdinFD = FileDescriptor(toChild[1])
        self.stdoutFD = FileDescriptor(fromChild[0])
        try stdoutFD.setNonBlocking()
    }

    deinit {
        if exitStatus == nil {
            try? pidfd.send(signal: SIGKILL)
            _ = try? wait(timeout: 5)
        }
    }

    static func currentEnvironment() -> [String] {
        let bytes = (try? readFile("/proc/self/environ")) ?? []
        return bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Sends a line to the child's stdin.
    func send(_ line: String) throws {
        try stdinFD.writeAll(Array((line + "\n").utf8))
    }

    /// Closes the child's stdin.
    func closeInput() { stdinFD.close() }

    /// The next line of stdout, waiting at most `timeout` seconds; `nil` at end of output.
    func readLine(timeout: Double) throws -> String? {
        let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
        while true {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[..<newline], as: UTF8.self)
                buffered.removeSubrange(...newline)
                return line
            }
            let left = deadline - Clock.monotonicNanoseconds()
            guard left > 0 else { throw TestFailure("no output from pid \(pid) within \(timeout)s") }
            _ = try stdoutFD.waitReadable(timeoutMilliseconds: Int32(max(1, left / 1_000_000)))
            guard let chunk = try stdoutFD.readAvailable(upTo: 65536) else { continue }
            if chunk.isEmpty { return nil }
            buffered += chunk
        }
    }

    /// All remaining stdout until the child closes it, within `timeout` seconds.
    func readAll(timeout: Double) throws -> String {
        var lines: [String] = []
        while let line = try readLine(timeout: timeout) { lines.append(line) }
        return lines.joined(separator: "\n")
    }

    /// Sends `signal` through the pidfd.
    func signal(_ signal: Int32) throws { try pidfd.send(signal: signal) }

    /// Waits for the child to exit (through its pidfd) and reaps it; returns the wait status.
    @discardableResult
    func wait(timeout: Double) throws -> Int32 {
        if let exitStatus { return exitStatus }
        guard try pidfd.descriptor.waitReadable(timeoutMilliseconds: Int32(timeout * 1000)) else {
            throw TestFailure("pid \(pid) did not exit within \(timeout)s")
        }
        var status: Int32 = 0
        try systemCall("waitpid(\(pid))") { waitpid(pid, &status, 0) }
        exitStatus = status
        return status
    }

    /// Whether it has exited (without reaping).
    var hasExited: Bool { exitStatus != nil || pidfd.hasExited }

    /// The signal that killed it, or `nil` if it exited normally.
    static func terminatingSignal(_ status: Int32) -> Int32? {
        bgtask_wifsignaled(status) != 0 ? bgtask_wtermsig(status) : nil
    }

    static func exitCode(_ status: Int32) -> Int32? {
        bgtask_wifexited(status) != 0 ? bgtask_wexitstatus(status) : nil
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Polls `condition` until it holds or `timeout` seconds pass (then throws, naming `what`).
/// The wait is bounded by a deadline; it never sleeps "long enough".
func waitUntil(_ what: @autoclosure () -> String, timeout: Double = 5, _ condition: () throws -> Bool) throws {
    let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
    while true {
        if try condition() { return }
        if Clock.monotonicNanoseconds() > deadline { throw TestFailure("timed out after \(timeout)s waiting for \(what())") }
        var pause = timespec(tv_sec: 0, tv_nsec: 2_000_000)  // poll interval of the deadline wait
        nanosleep(&pause, nil)
    }
}

/// The one-letter state of `/proc/PID/stat` (`T` when stopped).
func processState(_ pid: Int32) -> Character? {
    (try? ProcStat.read(pid: pid))?.state
}
