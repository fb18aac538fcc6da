// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Dispatch
import Glibc

/// A child process the test started, held by the pidfd `Subprocess.spawn` took at once.
/// Stdin and stdout are pipes; stderr is inherited, merged into stdout, or sent to a file.
/// Dropping it kills (through the pidfd) and reaps the child.
public final class Spawned {
    public enum StandardError {
        case inherit
        case mergeIntoOutput
        case file(String)
    }

    public let pidfd: Pidfd
    public var pid: Int32 { pidfd.pid }
    private let stdinFD: FileDescriptor
    private let stdoutFD: FileDescriptor
    private var buffered: [UInt8] = []
    public private(set) var exitStatus: Int32?

    /// Starts `path` with `arguments` and the given environment (default: this process's).
    public init(_ path: String, _ arguments: [String], environment: [String]? = nil,
                standardError: StandardError = .inherit) throws {
        let (childIn, toChild) = try Subprocess.pipe()
        let (fromChild, childOut) = try Subprocess.pipe()
        let stderr: Subprocess.Stream
        switch standardError {
        case .inherit: stderr = .inherit
        case .mergeIntoOutput: stderr = .descriptor(childOut.rawValue)
        case let .file(path): stderr = .file(path)
        }
        pidfd = try Subprocess.spawn([path] + arguments, environment: environment,
                                     stdin: .descriptor(childIn.rawValue), stdout: .descriptor(childOut.rawValue),
                                     stderr: stderr)
        childIn.close()
        childOut.close()
        stdinFD = toChild
        stdoutFD = fromChild
        try stdoutFD.setNonBlocking()
    }

    deinit {
        if exitStatus == nil {
            killTree()
            _ = try? wait(timeout: 5)
        }
    }

    /// Kills the child and every descendant, so no orphan outlives the test holding its
    /// output pipes: walks that stop each process before reading its children
    /// (`ProcessTree.members`' `visit`), each after every process the last one found has
    /// stopped, until one finds no process more; then `SIGKILL` to each. A process stopped
    /// (state `T`) is past any fork it was in, its child on its list; one merely sent
    /// `SIGSTOP` is not: this kernel lets a fork under way finish (a signal to the one
    /// process no longer restarts it), and a child forked so lived on as an orphan.
    public func killTree() { Self.killTree(of: pidfd) }

    /// `killTree` of any process a test holds: one re-parented out of a `Spawned`'s tree.
    public static func killTree(of root: Pidfd) {
        var members: [Int32: Pidfd] = [:]
        for _ in 0..<64 {
            var excluded: [Int32] = [], unreached: [Int32] = []
            let found = ProcessTree.members(of: root, owner: nil, excluded: &excluded, unreached: &unreached) {
                members[$0.pid] != nil || $0.trySend(signal: SIGSTOP)
            }.filter { members[$0.pid] == nil }
            if found.isEmpty { break }
            for member in found { members[member.pid] = member }
            try? waitUntil("the processes stopped", timeout: 2) { found.allSatisfy(Self.settled) }
        }
        for member in members.values { try? member.send(signal: SIGKILL) }
        try? root.send(signal: SIGKILL)
    }

    /// Past any fork: stopped, gone, or frozen by its cgroup (which a stop does not change).
    private static func settled(_ process: Pidfd) -> Bool {
        guard !process.hasExited, let state = processState(process.pid), !"TtZX".contains(state) else { return true }
        return (try? Cgroup.of(pid: process.pid)?.isFrozen()) == true
    }

    /// Sends a line to the child's stdin.
    public func send(_ line: String) throws {
        try stdinFD.writeAll(Array((line + "\n").utf8))
    }

    /// Closes the child's stdin.
    public func closeInput() { stdinFD.close() }

    /// The next line of stdout, waiting at most `timeout` seconds; `nil` at end of output.
    public func readLine(timeout: Double) throws -> String? {
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

    /// The next line equal to `expected`, skipping others, within `timeout` seconds.
    public func expectLine(_ expected: String, timeout: Double = 5) throws {
        while let line = try readLine(timeout: timeout) {
            if line == expected { return }
        }
        throw TestFailure("output of pid \(pid) ended before '\(expected)'")
    }

    /// All remaining stdout until the child closes it, within `timeout` seconds.
    public func readAll(timeout: Double) throws -> String {
        var lines: [String] = []
        while let line = try readLine(timeout: timeout) { lines.append(line) }
        return lines.joined(separator: "\n")
    }

    /// Sends `signal` through the pidfd.
    public func signal(_ signal: Int32) throws { try pidfd.send(signal: signal) }

    /// Waits for the child to exit (through its pidfd) and reaps it; returns the wait status.
    @discardableResult
    public func wait(timeout: Double) throws -> Int32 {
        if let exitStatus { return exitStatus }
        guard try pidfd.descriptor.waitReadable(timeoutMilliseconds: Int32(timeout * 1000)) else {
            throw TestFailure("pid \(pid) did not exit within \(timeout)s")
        }
        let status = try Subprocess.wait(pid: pid) ?? 0
        exitStatus = status
        return status
    }

    /// Whether it has exited (without reaping).
    public var hasExited: Bool { exitStatus != nil || pidfd.hasExited }

    /// The signal that killed it, or `nil` if it exited normally.
    public static func terminatingSignal(_ status: Int32) -> Int32? { Subprocess.terminatingSignal(status) }

    /// Its exit code, or 128 + the signal that ended it.
    public static func exitCode(_ status: Int32) -> Int32? { Subprocess.exitCode(status) }
}

public struct TestFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Polls `condition` until it holds or `timeout` seconds pass (then throws, naming `what`).
/// The wait is bounded by a deadline; it never sleeps "long enough".
public func waitUntil(_ what: @autoclosure () -> String, timeout: Double = 5, _ condition: () throws -> Bool) throws {
    let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
    while true {
        if try condition() { return }
        if Clock.monotonicNanoseconds() > deadline { throw TestFailure("timed out after \(timeout)s waiting for \(what())") }
        var pause = timespec(tv_sec: 0, tv_nsec: 2_000_000)  // poll interval of the deadline wait
        nanosleep(&pause, nil)
    }
}

/// Returns once the monotonic clock has reached `instant` (nanoseconds): for a test whose
/// precondition is that time has passed (a deadline fallen due while nothing may answer),
/// not a wait for an event. One absolute wait, `clock_nanosleep(TIMER_ABSTIME)`, resumed
/// after a signal.
public func waitForInstant(_ instant: Int64) {
    var at = timespec(tv_sec: Int(instant / 1_000_000_000), tv_nsec: Int(instant % 1_000_000_000))
    while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nil) == EINTR {}
}

/// The `read(2)`-family calls a thread has made (`syscr` of its `io` file, e.g.
/// `/proc/thread-self/io` or `/proc/PID/task/TID/io`), as the kernel counts them.
public func readCalls(_ ioFile: String) throws -> Int {
    let text = String(decoding: try readFile(ioFile), as: UTF8.self)
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("syscr:") }),
          let count = Int(line.split(separator: " ").last ?? "") else { throw TestFailure("no syscr in \(ioFile)") }
    return count
}

/// The one-letter state of `/proc/PID/stat` (`T` when stopped), `nil` once gone.
public func processState(_ pid: Int32) -> Character? {
    (try? ProcStat.read(pid: pid))?.state
}

/// How many of `pid`'s descriptors link to `target` in `/proc/PID/fd` (a file's path, or
/// `anon_inode:[pidfd]`).
public func descriptorCount(of pid: Int32, linkingTo target: String) -> Int {
    let directory = "/proc/\(pid)/fd"
    return ProcessTree.directoryNames(directory).filter { name in
        var buffer = [CChar](repeating: 0, count: 4096)
        let length = readlink(directory + "/" + name, &buffer, buffer.count - 1)
        return length >= 0 && String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) == target
    }.count
}

/// Every process whose command line names `path` (in a test's own temporary directory), by
/// pidfd: what a test's script double-forked is in no process tree once its parent exits,
/// and a worker stopped before it reported its pid is in no list either. Each command line
/// is read again once its pidfd is open, so the pidfd is of the process that named `path`
/// (signalled through it, a process gone since is never another).
public func processesNaming(_ path: String) -> [Pidfd] {
    let needle = Array(path.utf8)
    func names(_ pid: Int32) -> Bool {
        guard let line = try? readFile("/proc/\(pid)/cmdline") else { return false }
        return line.count >= needle.count && (0...(line.count - needle.count)).contains { line[$0..<$0 + needle.count].elementsEqual(needle) }
    }
    return ProcessTree.directoryNames("/proc").compactMap { Int32($0) }.filter { $0 > 1 && $0 != getpid() && names($0) }.compactMap { pid in
        guard let pidfd = try? Pidfd.open(pid: pid), names(pid) else { return nil }
        return pidfd
    }
}

/// Every process of the tree rooted at `root` (by pidfd), as the test sees it now.
public func processTree(of root: Pidfd) -> [ProcStat] {
    ProcessTree.members(of: root).compactMap { try? ProcStat.read(pid: $0.pid) }
}

/// The live processes (zombies left out) of process group `group`, wherever they were
/// re-parented to: a group outlives its leader while it has members, and its id is not
/// given to another process meanwhile. Each held by a pidfd opened, then checked to be in
/// the group still.
public func processes(inGroup group: Int32) -> [Pidfd] {
    func member(_ pid: Int32) -> Bool {
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 1024)
        let count = read(fd, &bytes, bytes.count)
        let text = String(decoding: bytes.prefix(max(0, count)), as: UTF8.self)
        guard let end = text.lastIndex(of: ")") else { return false }
        // After the command: state, parent, process group.
        let fields = text[text.index(after: end)...].split(separator: " ")
        return fields.count > 2 && fields[0] != "Z" && fields[0] != "X" && Int32(fields[2]) == group
    }
    return ProcessTree.directoryNames("/proc").compactMap { Int32($0) }.filter { $0 > 1 && $0 != getpid() && member($0) }
        .compactMap { pid in (try? Pidfd.open(pid: pid)).flatMap { member(pid) ? $0 : nil } }
}

/// How many live processes of process group `group` are left once `timeout` has passed
/// (or none is), each then killed: what outlived a termination of the group's leader.
public func killedLeftovers(inGroup group: Int32, timeout: Double) -> Int {
    try? waitUntil("process group \(group) gone", timeout: timeout) { processes(inGroup: group).isEmpty }
    let left = processes(inGroup: group)
    for process in left { try? process.send(signal: SIGKILL) }
    return left.count
}

/// A python program (`python3 -c`) that says "ready", then forks flat out, each child
/// (pausing for ever) killed and reaped at once: a signal to it often comes in a fork.
/// Each fork copies the page tables of the 128 MiB it holds touched, so a fork lasts: the
/// tests of a fork under way as a walk stops its parent missed one within 10 rounds also
/// under load (up to 100 without).
public let forkingFlatOut = """
    import os, signal
    ballast = bytearray(128 << 20)
    print("ready", flush=True)
    while True:
        child = os.fork()
        if child == 0:
            while True: signal.pause()
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    """

/// `forkingFlatOut` in a process group of its own, after forking 100 children that pause
/// for ever: a walk visits those after it read their parent's list, so a fork under way as
/// it stopped the parent has long to finish before the walk's end (a termination signalled
/// at once left its child living after 23 of 30).
public let forkingBesideIdleChildren = """
    import os, signal
    os.setpgid(0, 0)
    for _ in range(100):
        if os.fork() == 0:
            while True: signal.pause()
    """ + "\n" + forkingFlatOut

/// What this machine lets a test do, checked once.
public enum Capabilities {
    /// Built with a sanitizer: `make sanitize` (scripts/sanitize) sets these for the run.
    public static let sanitized = getenv("ASAN_OPTIONS") != nil || getenv("TSAN_OPTIONS") != nil

    /// A cgroup v2 hierarchy the test may create cgroups in (root).
    public static let cgroupsWritable: Bool = {
        guard let root = Cgroup.mountPoint else { return false }
        let probe = root + "/bgtaskd-probe-\(getpid())"
        guard mkdir(probe, 0o755) == 0 else { return false }
        rmdir(probe)
        return true
    }()

    /// `/proc/sys/kernel/ns_last_pid` is writable (CAP_SYS_ADMIN), so pids can be recycled.
    public static let canRecyclePids: Bool = {
        guard let bytes = try? readFile("/proc/sys/kernel/ns_last_pid") else { return false }
        return (try? writeLastPID(String(decoding: bytes, as: UTF8.self).filter(\.isNumber))) != nil
    }()

    /// `AF_UNIX` streams take out-of-band bytes (`MSG_OOB`, Linux 5.15+ with AF_UNIX_OOB).
    public static let unixOutOfBand: Bool = {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else { return false }
        defer { close(fds[0]); close(fds[1]) }
        var byte = UInt8(ascii: "X")
        return send(fds[0], &byte, 1, Int32(MSG_OOB)) == 1
    }()

    /// Sets the last pid handed out, so the next process gets the one after it.
    public static func writeLastPID(_ value: String) throws {
        let fd = FileDescriptor(try systemCall("open ns_last_pid") { open("/proc/sys/kernel/ns_last_pid", O_WRONLY) })
        _ = try fd.write(Array(value.utf8))
    }

    /// Starts `path` (`sleep 60` unless told) with `pid` again (via `ns_last_pid`), retrying for up to 10 s while
    /// other processes take it first. A CI run gave up after 200 tries (~60 ms: "could not get
    /// pid 22084 back") while other suites forked beside it, one of them a hundred processes
    /// at once; and two tests recycling side by side, each writing `ns_last_pid` for its own
    /// pid, would take each other's: one at a time in the whole test process.
    ///
    /// `ns_last_pid` is the whole pid namespace's: a fork elsewhere between its write and
    /// ours lands on the pid instead, and while that process (or thread) lives the pid cannot
    /// be had — `PidTaken`, for the caller to run its scenario again (`retryingWhilePidTaken`;
    /// a CI run spent the 10 s on pid 471, taken so, at `8f45ee0`).
    public static func spawn(reusing pid: Int32, _ path: String = "/bin/sleep", _ arguments: [String] = ["60"]) throws -> Spawned {
        recycling.wait()
        defer { recycling.signal() }
        let deadline = Clock.monotonicNanoseconds() + 10_000_000_000
        while Clock.monotonicNanoseconds() < deadline {
            try writeLastPID(String(pid - 1))
            let child = try Spawned(path, arguments)
            if child.pid == pid { return child }
            if access("/proc/\(pid)", F_OK) == 0 { throw PidTaken(pid: pid) }
        }
        throw TestFailure("could not get pid \(pid) back")
    }

    /// Runs `scenario` again while its `spawn(reusing:)` finds the pid taken by a process
    /// not its own, at most `attempts` times in all (under ASan, 5 were all lost once, to
    /// threads and other suites' forks).
    public static func retryingWhilePidTaken<T>(attempts: Int = 20, _ scenario: () throws -> T) throws -> T {
        var attempt = 1
        while true {
            do {
                return try scenario()
            } catch is PidTaken where attempt < attempts {
                attempt += 1
            }
        }
    }

    private static let recycling = DispatchSemaphore(value: 1)
}

/// A pid to be recycled went to another process first (`Capabilities.spawn(reusing:)`).
public struct PidTaken: Error, CustomStringConvertible {
    public let pid: Int32
    public init(pid: Int32) { self.pid = pid }
    public var description: String { "pid \(pid) was taken by another process before this test could recycle it" }
}

/// A new directory `/tmp/PREFIX-XXXXXX` (mkdtemp(3)), mode 0700; the caller removes it.
public func temporaryDirectory(_ prefix: String) throws -> String {
    var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
    return String(cString: made)
}

/// Removes `path` and all below it, following no symbolic link: a directory a test made,
/// with whatever the test and its daemon left in it.
public func removeTree(_ path: String) {
    var info = stat()
    guard lstat(path, &info) == 0 else { return }
    guard info.st_mode & S_IFMT == S_IFDIR, let directory = opendir(path) else {
        unlink(path)
        return
    }
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
        if name != "." && name != ".." { removeTree(path + "/" + name) }
    }
    closedir(directory)
    rmdir(path)
}
