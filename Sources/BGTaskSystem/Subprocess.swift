// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// Starting child processes with `posix_spawn`, held by a pidfd taken at once (the child
/// stays unreaped until `wait`, so its pid cannot be recycled before that).
public enum Subprocess {
    /// Where a child's standard stream comes from.
    public enum Stream {
        case inherit
        /// Duplicate this descriptor onto the stream.
        case descriptor(Int32)
        /// Open this file (for writing: create and append).
        case file(String)
    }

    /// Starts `arguments[0]` (searched in `PATH` when it has no slash) with a cleared signal
    /// mask and default dispositions, whatever the parent blocks. `posix_spawnp(3)`
    public static func spawn(_ arguments: [String], environment: [String]? = nil, stdin: Stream = .inherit,
                             stdout: Stream = .inherit, stderr: Stream = .inherit) throws(Errno) -> Pidfd {
        precondition(!arguments.isEmpty)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, stream) in [(Int32(0), stdin), (1, stdout), (2, stderr)] {
            switch stream {
            case .inherit: break
            case let .descriptor(fd): posix_spawn_file_actions_adddup2(&actions, fd, target)
            case let .file(path):
                let flags = target == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_APPEND
                posix_spawn_file_actions_addopen(&actions, target, path, flags, 0o644)
            }
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let argv = arguments.map { strdup($0) } + [nil]
        let env = (environment ?? currentEnvironment()).map { strdup($0) } + [nil]
        defer { (argv + env).forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawnp(&pid, arguments[0], &actions, &attributes, argv, env)
        guard result == 0 else { throw Errno(result, "posix_spawnp(\(arguments[0]))") }
        return try Pidfd.open(child: pid)
    }

    /// This process's environment, from `/proc/self/environ`.
    public static func currentEnvironment() -> [String] {
        let bytes = (try? readFile("/proc/self/environ")) ?? []
        return bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Reaps the child `pid`; returns its wait status. `waitpid(2)`
    public static func wait(pid: Int32, block: Bool = true) throws(Errno) -> Int32? {
        var status: Int32 = 0
        let reaped = try systemCall("waitpid(\(pid))") { waitpid(pid, &status, block ? 0 : WNOHANG) }
        return reaped == pid ? status : nil
    }

    /// A shell-style exit code for a wait status: the code, or 128 + the signal.
    public static func exitCode(_ status: Int32) -> Int32 {
        bgtask_wifexited(status) != 0 ? bgtask_wexitstatus(status) : 128 + bgtask_wtermsig(status)
    }

    /// The signal that ended the child, or `nil` if it exited.
    public static func terminatingSignal(_ status: Int32) -> Int32? {
        bgtask_wifsignaled(status) != 0 ? bgtask_wtermsig(status) : nil
    }

    /// A pipe, both ends close-on-exec: (read, write). `pipe2(2)`
    public static func pipe() throws(Errno) -> (FileDescriptor, FileDescriptor) {
        var fds: [Int32] = [0, 0]
        try systemCall("pipe2") { pipe2(&fds, O_CLOEXEC) }
        return (FileDescriptor(fds[0]), FileDescriptor(fds[1]))
    }
}

/// Signals received as readable data instead of handlers. `signalfd(2)`
public final class SignalDescriptor {
    public let descriptor: FileDescriptor

    /// Blocks `signals` for this thread and reads them from a descriptor.
    public init(_ signals: [Int32]) throws(Errno) {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
        descriptor = FileDescriptor(try systemCall("signalfd") { signalfd(-1, &set, Int32(SFD_CLOEXEC)) })
    }

    /// The next pending signal's number (blocks if none is pending).
    public func next() throws(Errno) -> Int32 {
        let bytes = try descriptor.read(upTo: MemoryLayout<signalfd_siginfo>.size)
        guard bytes.count == MemoryLayout<signalfd_siginfo>.size else { throw Errno(EIO, "signalfd read") }
        return bytes.withUnsafeBytes { Int32(bitPattern: $0.load(as: signalfd_siginfo.self).ssi_signo) }
    }
}

/// Waits until one of `descriptors` is readable (or `timeoutMilliseconds` pass; -1 forever);
/// returns the indices of the readable ones. `poll(2)`
public func waitReadable(_ descriptors: [Int32], timeoutMilliseconds: Int32 = -1) throws(Errno) -> [Int] {
    try waitReady(descriptors.map { ($0, false) }, timeoutMilliseconds: timeoutMilliseconds)
}

/// Waits until one of `descriptors` is readable, or writable where `writable` asks for it,
/// or hung up (or `timeoutMilliseconds` pass; -1 forever); returns the indices of the ready
/// ones. `poll(2)`
public func waitReady(_ descriptors: [(descriptor: Int32, writable: Bool)],
                      timeoutMilliseconds: Int32 = -1) throws(Errno) -> [Int] {
    var entries = descriptors.map {
        pollfd(fd: $0.descriptor, events: Int16(POLLIN) | ($0.writable ? Int16(POLLOUT) : 0), revents: 0)
    }
    try systemCall("poll") { poll(&entries, nfds_t(entries.count), timeoutMilliseconds) }
    return entries.indices.filter { entries[$0].revents != 0 }
}
