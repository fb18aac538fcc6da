// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// Real syscalls on real child processes the test started.
@Suite(.serialized) struct ProcessTests {
    @Test func procStatParsesCommandsWithSpacesAndParentheses() throws {
        var text = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 100"
        text += " 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
        let stat = try #require(ProcStat.parse(Array(text.utf8)))
        #expect(stat.pid == 1234 && stat.command == "a (b) c" && stat.state == "S")
        #expect(stat.parentPID == 1 && stat.flags == 4_194_560 && stat.startTime == 987_654)
        #expect(!stat.isKernelThread)
        #expect(ProcStat.parse(Array("garbage".utf8)) == nil)
        #expect(try ProcStat.read(pid: 2).isKernelThread)  // kthreadd
        // Nothing wanted may be missing or malformed; the text may end without its newline.
        let fields = text.split(separator: " ", omittingEmptySubsequences: false)
        #expect(ProcStat.parse(Array(fields.prefix(23).joined(separator: " ").utf8)) == nil)  // starttime missing
        #expect(try #require(ProcStat.parse(Array(fields.prefix(24).joined(separator: " ").utf8))).startTime == 987_654)
        #expect(ProcStat.parse(Array(text.replacing(") S 1 ", with: ") SS 1 ").utf8)) == nil)
        #expect(ProcStat.parse(Array(text.replacing(") S 1 ", with: ") S x ").utf8)) == nil)
        #expect(ProcStat.parse(Array(text.replacing("1234 (", with: " (").utf8)) == nil)
        #expect(ProcStat.parse(Array(text.replacing("987654", with: "99999999999999999999999").utf8)) == nil)
        let own = try ProcStat.read(pid: getpid())
        #expect(own.pid == getpid() && own.parentPID == getppid() && !own.command.isEmpty)
    }

    /// Every name of a directory, of every length from 1 to 255 bytes, read whole: a name is
    /// read from its own record, which is only as long as it (copying `d_name` whole read past
    /// the last record of glibc's buffer; `make sanitize` caught it in a unit lookup by name).
    /// The signals to stop pending on a process: its own `SigPnd:` and its group's `ShdPnd:`,
    /// `SIGTERM` first; a real child that blocks `SIGTERM` and is sent it has it pending.
    @Test func pendingStopSignalsAreReadFromStatus() throws {
        let status = Array("Name:\tx\nSigQ:\t0/1\nSigPnd:\t0000000000000004\nShdPnd:\t0000000000004000\nSigBlk:\t0000000000004000\n".utf8)
        #expect(ProcStatus.parsePending(status) == 0x4004)
        #expect(ProcStatus.parsePending(Array("SigPnd:\tzz\n".utf8)) == 0)
        let child = try Spawned("/usr/bin/python3", ["-c", """
            import signal, sys, time
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
            print("blocked", flush=True)
            time.sleep(60)
            """])
        #expect(try child.readLine(timeout: 10) == "blocked")
        #expect(ProcStatus.pendingStopSignal(pid: child.pid) == nil)
        try child.signal(SIGINT)
        try waitUntil("SIGINT pending") { ProcStatus.pendingStopSignal(pid: child.pid) == SIGINT }
        try child.signal(SIGTERM)
        try waitUntil("SIGTERM pending, before SIGINT") { ProcStatus.pendingStopSignal(pid: child.pid) == SIGTERM }
        try child.signal(SIGKILL)
    }

    @Test func directoryNamesOfEveryLengthAreReadWhole() throws {
        var template = Array("/tmp/bgtaskd-names-XXXXXX".utf8CString)
        let directory = try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }.map { String(cString: $0) })
        let names = (1...255).map { String(repeating: Character(UnicodeScalar(UInt8(97 + $0 % 26))), count: $0) }
        defer {
            for name in names { unlink(directory + "/" + name) }
            rmdir(directory)
        }
        for name in names {
            let fd = open(directory + "/" + name, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            #expect(fd >= 0)
            close(fd)
        }
        #expect(ProcessTree.directoryNames(directory).sorted() == names.sorted())
    }

    @Test func pidfdSignalsStopAndContinueTheChild() throws {
        let child = try Spawned("/bin/sleep", ["60"])
        #expect(child.pidfd.startTime == (try ProcStat.read(pid: child.pid)).startTime)
        try child.pidfd.send(signal: SIGSTOP)
        try waitUntil("stopped") { processState(child.pid) == "T" }
        try child.pidfd.send(signal: SIGCONT)
        try waitUntil("running") { processState(child.pid) != "T" }
        try child.pidfd.send(signal: SIGKILL)
        #expect(Spawned.terminatingSignal(try child.wait(timeout: 5)) == SIGKILL)
    }

    /// `trySend` says what a poll of the pidfd would, by the signal alone: a live process
    /// takes it; one that has exited and been reaped is gone (`ESRCH`). A zombie still takes
    /// signals, so it counts as there until reaped (its pidfd reports the exit meanwhile).
    @Test func trySendTellsAProcessGoneByItsSignal() throws {
        let child = try Spawned("/bin/sleep", ["60"])
        #expect(child.pidfd.trySend(signal: SIGSTOP))
        try waitUntil("stopped") { processState(child.pid) == "T" }
        #expect(child.pidfd.trySend(signal: SIGKILL))
        try waitUntil("exited") { child.pidfd.hasExited }
        #expect(child.pidfd.trySend(signal: SIGCONT))  // a zombie, not yet reaped
        _ = try child.wait(timeout: 5)
        #expect(!child.pidfd.trySend(signal: SIGCONT))
        #expect(child.pidfd.hasExited)
    }

    @Test func pidfdRefusesInitAndNonsense() {
        for pid: Int32 in [1, 0, -1] {
            #expect(throws: Errno.self) { try Pidfd.open(pid: pid) }
        }
    }

    /// A pidfd keeps naming the process it was opened for: once that process is gone, a new
    /// process with the same pid cannot be signalled through it.
    @Test(.enabled(if: Capabilities.canRecyclePids, "needs CAP_SYS_ADMIN to write /proc/sys/kernel/ns_last_pid"))
    func signalsThroughAStalePidfdNeverReachARecycledPid() throws {
        let (stale, pid, recycled) = try Capabilities.retryingWhilePidTaken {
            let old = try Spawned("/bin/sleep", ["60"])
            let pid = old.pid
            try old.signal(SIGKILL)
            try old.wait(timeout: 5)
            return (old.pidfd, pid, try Capabilities.spawn(reusing: pid))
        }
        #expect(recycled.pid == pid)
        #expect(throws: Errno.self) { try stale.send(signal: SIGSTOP) }
        #expect(stale.hasExited)
        #expect(processState(pid) != "T")
        // A tree walk anchored on the stale pidfd finds nothing (by pid and start time alone it
        // could: start times tick at 10 ms, and the new process may share the old one's).
        #expect(ProcessTree.members(of: stale).isEmpty)
        #expect(ProcessTree.members(of: recycled.pidfd).map(\.pid) == [pid])
        // And the daemon never names the new process as the old one: their pidfs inodes differ.
        #expect(stale.inode != 0 && recycled.pidfd.inode != stale.inode)
    }

    /// A pidfd from the kernel is named by `PIDFD_GET_INFO` and, on older kernels, by
    /// `/proc/self/fdinfo`, alike: the socket peer's (`SO_PEERPIDFD`: this process) and a
    /// child's; once the child is reaped both say `ESRCH`, and `adopt` refuses it.
    @Test func aPidfdsPidIsReadByItsInfoAndByFdinfoAlike() throws {
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        let ends = (FileDescriptor(fds[0]), FileDescriptor(fds[1]))
        var peer: Int32 = -1
        var size = socklen_t(MemoryLayout<Int32>.size)
        #expect(getsockopt(ends.0.rawValue, SOL_SOCKET, 77 /* SO_PEERPIDFD */, &peer, &size) == 0)
        let peerPidfd = FileDescriptor(peer)
        #expect(try Pidfd.pid(of: peerPidfd) == getpid())
        #expect(try Pidfd.pidFromFdinfo(peerPidfd) == getpid())
        let child = try Spawned("/bin/sleep", ["60"])
        let raw = child.pidfd.descriptor  // a pidfd from pidfd_open(2)
        #expect(try Pidfd.pid(of: raw) == child.pid)
        #expect(try Pidfd.pidFromFdinfo(raw) == child.pid)
        #expect(try Pidfd.adopt(raw).startTime == child.pidfd.startTime)
        try child.signal(SIGKILL)
        try child.wait(timeout: 5)
        #expect(throws: Errno.self) { try Pidfd.pid(of: raw) }
        #expect(throws: Errno.self) { try Pidfd.pidFromFdinfo(raw) }
        #expect(throws: Errno.self) { try Pidfd.adopt(raw) }
    }

    /// A held `/proc/PID/stat` (`Pidfd.openStat`, the stray check's) reads its process's
    /// state again with no open, the zombie too, and fails once the process is reaped: the
    /// file is bound to that process, not its pid, so it never reads a new process that
    /// takes the pid, as a read by path would. (Not shown by recycling the pid here: with a
    /// fourth test moving `ns_last_pid` back, another's recycling lost its pid to the suite's
    /// forks five times running under the thread sanitizer, once.)
    @Test func aHeldStatReadsItsProcessUntilItIsReaped() throws {
        let child = try Spawned("/bin/sleep", ["60"])
        guard let held = child.pidfd.openStat() else { throw TestFailure("openStat of a live process failed") }
        try waitUntil("asleep") { (try? ProcStat.read(held: held))?.state == "S" }
        #expect(try ProcStat.read(held: held).pid == child.pid)
        try child.signal(SIGSTOP)
        try waitUntil("stopped") { (try? ProcStat.read(held: held))?.state == "T" }
        try child.signal(SIGKILL)
        try waitUntil("a zombie") { (try? ProcStat.read(held: held))?.state == "Z" }
        try child.wait(timeout: 5)
        #expect(throws: Errno.self) { try ProcStat.read(held: held) }
        #expect(child.pidfd.openStat() == nil)  // exited: nothing to hold
    }

    /// A member that exits while the walk is at it, its pid taken by a new process with a
    /// child of its own before the member's children are read: that child is no member. Its
    /// parent pid is the member's, and the list was read by that pid — another process's; the
    /// member's pidfd says it is gone (the poll after each child's parent is read).
    @Test(.enabled(if: Capabilities.canRecyclePids, "needs CAP_SYS_ADMIN to write /proc/sys/kernel/ns_last_pid"))
    func aChildListedUnderARecycledMembersPidIsNoMember() throws {
        func children(_ pid: Int32) -> [Int32] {
            String(decoding: (try? readFile("/proc/\(pid)/task/\(pid)/children")) ?? [], as: UTF8.self)
                .split(separator: " ").compactMap { Int32($0) }
        }
        try Capabilities.retryingWhilePidTaken {
            // The shell reaps its child once it is killed (`wait`), then becomes `sleep`.
            let root = try Spawned("/bin/sh", ["-c", "sleep 60 & echo ready; wait; exec sleep 60"])
            defer { root.killTree() }
            try root.expectLine("ready")
            var member: Int32 = 0
            try waitUntil("the shell's child") {
                member = children(root.pid).first ?? 0
                return member > 0
            }
            var successor: Spawned?, successorsChild: Int32 = 0, failure: Error?
            defer { successor?.killTree() }
            var excluded: [Int32] = [], unreached: [Int32] = []
            let members = ProcessTree.members(of: root.pidfd, owner: nil, excluded: &excluded, unreached: &unreached) { pidfd in
                guard pidfd.pid == member else { return true }
                do {
                    try pidfd.send(signal: SIGKILL)
                    try waitUntil("the member reaped") { access("/proc/\(member)", F_OK) != 0 }
                    successor = try Capabilities.spawn(reusing: member, "/bin/sh", ["-c", "sleep 60 & wait"])
                    try waitUntil("the successor's child") {
                        successorsChild = children(member).first ?? 0
                        return successorsChild > 0
                    }
                } catch {
                    failure = error
                }
                return true  // as if still there: what follows must find out itself
            }
            if let failure { throw failure }
            #expect(successor?.pid == member)
            #expect(members.map(\.pid) == [root.pid, member], "the successor's child \(successorsChild) taken for a member")
            #expect(excluded.isEmpty && unreached.isEmpty)
        }
    }

    /// The recycling tests' helper: a pid another process holds is reported taken at the
    /// first try (not after its 10 s of retries), and the scenario runs again.
    @Test(.enabled(if: Capabilities.canRecyclePids, "needs CAP_SYS_ADMIN to write /proc/sys/kernel/ns_last_pid"))
    func aPidAnotherProcessHoldsIsReportedTakenAndTheScenarioRunsAgain() throws {
        let holder = try Spawned("/bin/sleep", ["60"])
        let started = Clock.monotonicNanoseconds()
        #expect(throws: PidTaken.self) { try Capabilities.spawn(reusing: holder.pid) }
        #expect(Clock.monotonicNanoseconds() - started < 5_000_000_000)
        var runs = 0
        let result = try Capabilities.retryingWhilePidTaken {
            runs += 1
            if runs < 3 { throw PidTaken(pid: holder.pid) }
            return runs
        }
        #expect(result == 3)
        #expect(throws: PidTaken.self) { try Capabilities.retryingWhilePidTaken(attempts: 2) { throw PidTaken(pid: holder.pid) } }
    }

    /// pidfs (Linux ≥ 6.9, these machines run 6.18): one inode per process, whatever pidfd
    /// refers to it, and none shared between two processes.
    @Test func aPidfdsInodeNamesItsProcess() throws {
        let first = try Spawned("/bin/sleep", ["60"]), second = try Spawned("/bin/sleep", ["60"])
        let again = try Pidfd.open(pid: first.pid)
        #expect(first.pidfd.inode != 0, "no pidfs: the kernel is older than 6.9")
        #expect(again.inode == first.pidfd.inode && second.pidfd.inode != first.pidfd.inode)
    }

    /// PIDFD_GET_INFO is Linux 6.13; where the kernel has it, the pidfd names the parent and
    /// the uids /proc does (the tree walk and the owner check read them from there).
    @Test(.enabled(if: kernelAtLeast(6, 13), "PIDFD_GET_INFO needs Linux 6.13"))
    func aPidfdsInfoIsWhatProcSays() throws {
        let child = try Spawned("/bin/sleep", ["30"])
        defer { child.killTree() }
        let pidfd = try Pidfd.open(pid: child.pid)
        let info = try #require(pidfd.info)
        #expect(info.parentPID == getpid())
        #expect(info.uids == (try ProcStatus.uids(pid: child.pid)))
        try child.signal(SIGKILL)
        try child.wait(timeout: 5)
        #expect(pidfd.info == nil, "a reaped process has no info")
    }

    /// A walk reads each member's list of children and nothing else of it: its start time is
    /// read only if asked (`Pidfd.open(member:)`). Counted by the kernel (`syscr` of this
    /// thread's `/proc/thread-self/io`): 21 reads for a shell and its 20 children, where
    /// reading each child's /proc stat at opening made 41.
    @Test func aTreeWalkReadsOnlyTheListsOfChildren() throws {
        let root = try Spawned("/bin/sh", ["-c", "for i in $(seq 20); do sleep 60 & done; echo ready; wait"])
        defer { root.killTree() }
        try root.expectLine("ready")
        try waitUntil("21 processes") { processTree(of: root.pidfd).count == 21 }
        func reads() throws -> Int { try readCalls("/proc/thread-self/io") }
        let looking = try reads()
        let overhead = try reads() - looking  // what a look at /proc/thread-self/io reads itself
        let before = try reads()
        let members = ProcessTree.members(of: root.pidfd)
        let walked = try reads() - before - overhead
        #expect(members.count == 21)
        #expect(walked <= members.count, "\(walked) reads to walk \(members.count) processes")
        // Asked afterwards, a member's start time is its own.
        let child = try #require(members.first { $0.pid != root.pid })
        #expect(child.startTime == (try ProcStat.read(pid: child.pid)).startTime && child.inode != 0)
    }

    /// A list of children is read a piece at a time until a read comes back short: a pid
    /// split between two reads is still one pid (read 7 bytes at a time here; 4 KiB, some
    /// 680 children, in the daemon).
    @Test func aListOfChildrenSplitBetweenReadsIsWhole() throws {
        let root = try Spawned("/bin/sh", ["-c", "for i in $(seq 20); do sleep 60 & done; echo ready; wait"])
        defer { root.killTree() }
        try root.expectLine("ready")
        try waitUntil("20 children") { processTree(of: root.pidfd).count == 21 }
        let expected = processTree(of: root.pidfd).map(\.pid).filter { $0 != root.pid }.sorted()
        for size in [1, 2, 7, 4096] {
            #expect(ProcessTree.children(of: root.pid, readSize: size)?.sorted() == expected, "read \(size) bytes at a time")
        }
    }

    /// A list of children longer than a page is read to its end: the kernel's reads of it
    /// come short of a page with more to come (a record that does not fit ends a read), and
    /// a walk that took a short read for the end saw the first ~580 of 1,500 children only.
    @Test func aListOfChildrenLongerThanAPageIsReadWhole() throws {
        let script = """
            import os, signal
            for _ in range(1500):
                if os.fork() == 0:
                    signal.pause()
                    os._exit(0)
            print("ready", flush=True)
            signal.pause()
            """
        let root = try Spawned("/usr/bin/python3", ["-c", script])
        defer { root.killTree() }
        try root.expectLine("ready", timeout: 30)
        let listed = try #require(ProcessTree.children(of: root.pid))
        #expect(listed.count == 1500)
        #expect(String(decoding: try readFile("/proc/\(root.pid)/task/\(root.pid)/children"), as: UTF8.self).utf8.count > 4096)  // more than one read
        var excluded: [Int32] = [], unreached: [Int32] = []
        let stopped = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached) {
            $0.trySend(signal: SIGSTOP)
        }
        #expect(stopped.count == 1501 && excluded.isEmpty && unreached.isEmpty)
        try waitUntil("every child stopped") { listed.allSatisfy { processState($0) == "T" } }
    }

    /// A process of one thread has its children read from that thread's list alone (the
    /// thread count first: `/proc/PID/task`'s link count); one of more threads from every
    /// thread's. A child forked by a thread other than the main one is on that thread's list
    /// only, and is a member, stopped by the walk like any other; so are the main thread's.
    @Test func aChildForkedByAnotherThreadIsAMember() throws {
        // Both threads stay until the test kills the tree (an event never set, a pause).
        let script = "import signal, subprocess, threading\n"
            + "main = subprocess.Popen(['/bin/sleep', '60'])\n"
            + "def fork():\n"
            + "    child = subprocess.Popen(['/bin/sleep', '60'])\n"
            + "    print(main.pid, child.pid, flush=True)\n"
            + "    threading.Event().wait()\n"
            + "threading.Thread(target=fork, daemon=True).start()\n"
            + "signal.pause()\n"
        let root = try Spawned("/usr/bin/python3", ["-c", script])
        defer { root.killTree() }
        let pids = try #require(try root.readLine(timeout: 10)).split(separator: " ").compactMap { Int32($0) }
        try #require(pids.count == 2)
        let (fromMain, fromThread) = (pids[0], pids[1])
        #expect(ProcessTree.threads(of: root.pid) == 2 && ProcessTree.threads(of: fromMain) == 1)
        #expect(ProcessTree.children(of: root.pid)?.sorted() == [fromMain, fromThread].sorted())
        #expect(ProcessTree.children(of: fromMain) == [])
        var excluded: [Int32] = [], unreached: [Int32] = []
        let members = ProcessTree.members(of: root.pidfd, owner: nil, excluded: &excluded, unreached: &unreached) {
            $0.trySend(signal: SIGSTOP)
        }
        #expect(members.map(\.pid).sorted() == [root.pid, fromMain, fromThread].sorted())
        try waitUntil("all three stopped") { [root.pid, fromMain, fromThread].allSatisfy { processState($0) == "T" } }
        for pidfd in members { try pidfd.send(signal: SIGCONT) }
    }

    /// A walk with a memory (`ProcessTree.Memory`: the pidfds, `/proc/PID/task` and lists of
    /// children the last walk held) finds what a walk without one finds, whatever the tree
    /// became between the two: a child forked since (its parent's held list read again from
    /// its start), a thread started since and its child (the held directory's count, then its
    /// threads listed again), a child gone (its remembered pidfd let go). And it holds its
    /// files: the second walk opens no list that the first held.
    @Test func aWalkWithAMemoryFindsWhatTheTreeBecameSince() throws {
        // Line 1: one child forked. Then, at each line read: the first child killed, a second
        // forked, a thread started that forks a third; each step printed.
        let script = "import os, signal, subprocess, sys, threading\n"
            + "first = subprocess.Popen(['/bin/sleep', '60'])\n"
            + "print(first.pid, flush=True)\n"
            + "sys.stdin.readline()\n"
            + "first.kill(); first.wait()\n"
            + "second = subprocess.Popen(['/bin/sleep', '60'])\n"
            + "def fork():\n"
            + "    third = subprocess.Popen(['/bin/sleep', '60'])\n"
            + "    print(second.pid, third.pid, flush=True)\n"
            + "    threading.Event().wait()\n"
            + "threading.Thread(target=fork, daemon=True).start()\n"
            + "signal.pause()\n"
        let root = try Spawned("/usr/bin/python3", ["-c", script])
        defer { root.killTree() }
        let line = try #require(try root.readLine(timeout: 10))
        let first = try #require(Int32(line))
        let memory = ProcessTree.Memory(holdBelow: Int(Int32.max))
        var excluded: [Int32] = [], unreached: [Int32] = []
        let before = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached,
                                         memory: memory)
        #expect(before.map(\.pid).sorted() == [root.pid, first].sorted())
        // Two processes of one thread each: a directory and a list each.
        #expect(memory.count == 2 && memory.heldFiles == 4)
        let firstPidfd = try #require(before.first { $0.pid == first })

        try root.send("go")
        let pids = try #require(try root.readLine(timeout: 10)).split(separator: " ").compactMap { Int32($0) }
        try #require(pids.count == 2)
        let (second, third) = (pids[0], pids[1])
        #expect(firstPidfd.hasExited)
        let fresh = ProcessTree.members(of: root.pidfd).map(\.pid).sorted()
        #expect(fresh == [root.pid, second, third].sorted())
        let after = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached,
                                        memory: memory)
        #expect(after.map(\.pid).sorted() == fresh)
        #expect(after.first { $0.pid == root.pid } === root.pidfd)
        // The root's two threads' lists and its directory, each sleep's list and directory.
        #expect(memory.count == 3 && memory.heldFiles == 7)
        #expect(excluded.isEmpty && unreached.isEmpty)
        // A third walk reuses the pidfds the second opened.
        let again = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached,
                                        memory: memory)
        #expect(again.map(\.pid).sorted() == fresh)
        for pidfd in again { #expect(after.contains { $0 === pidfd }, "pid \(pidfd.pid) opened again") }
    }

    /// A memory holds the files of at most `processesAtMost` processes of a walk: a tree of
    /// more is found whole all the same, the rest's lists read and closed (a walk of a large
    /// tree does not hold more than its owner's share until the caller lets it go).
    @Test func aWalksMemoryHoldsTheFilesOfAtMostItsProcesses() throws {
        let root = try Spawned("/bin/sh", ["-c", "sleep 60 & sleep 60 & echo ready; wait"])
        defer { root.killTree() }
        try root.expectLine("ready")
        try waitUntil("both sleeps") { processTree(of: root.pidfd).count == 3 }
        let memory = ProcessTree.Memory(holdBelow: Int(Int32.max), processesAtMost: 1)
        var excluded: [Int32] = [], unreached: [Int32] = []
        for _ in 0..<2 {
            let members = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached,
                                              memory: memory)
            #expect(members.count == 3)
            #expect(memory.count == 3 && memory.heldFiles == 2)  // the shell's directory and list only
        }
    }

    /// A walk that visits each member learns from the visit whether it is still there (a
    /// signal through its pidfd: `ESRCH` once reaped): a root gone is no app, and is neither
    /// a member nor left out for its owner; a child gone is no member, and its children (none
    /// now) are not read.
    @Test func aVisitThatFindsAProcessGoneLeavesItOut() throws {
        let root = try Spawned("/bin/sh", ["-c", "sleep 60 & sleep 60 & echo ready; wait"])
        defer { root.killTree() }
        try root.expectLine("ready")
        try waitUntil("two children") { processTree(of: root.pidfd).count == 3 }
        var excluded: [Int32] = [], unreached: [Int32] = []
        let none = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached) { _ in false }
        #expect(none.isEmpty && excluded.isEmpty && unreached.isEmpty)
        let child = try #require(processTree(of: root.pidfd).first { $0.pid != root.pid }?.pid)
        var visited: [Int32] = []
        let members = ProcessTree.members(of: root.pidfd, owner: getuid(), excluded: &excluded, unreached: &unreached) {
            visited.append($0.pid)
            return $0.pid != child
        }
        #expect(members.count == 2 && !members.contains { $0.pid == child } && members.first?.pid == root.pid)
        #expect(visited.count == 3 && excluded.isEmpty)
    }

    /// A child that has exited and not been reaped (a zombie) is no member.
    @Test func aZombieIsNoMember() throws {
        // The shell's child exits once the shell has become `sleep`, which never reaps it.
        let root = try Spawned("/bin/sh", ["-c", "sleep 0.1 & echo ready; exec sleep 60"])
        defer { root.killTree() }
        try root.expectLine("ready")
        var zombie: Int32 = 0
        try waitUntil("a zombie under the sleep") {
            guard (try? ProcStat.read(pid: root.pid))?.command == "sleep" else { return false }
            let listed = String(decoding: try readFile("/proc/\(root.pid)/task/\(root.pid)/children"), as: UTF8.self)
            guard let pid = listed.split(separator: " ").compactMap({ Int32($0) }).first,
                  (try? ProcStat.read(pid: pid))?.state == "Z" else { return false }
            zombie = pid
            return true
        }
        #expect(ProcessTree.members(of: root.pidfd).map(\.pid) == [root.pid], "zombie \(zombie) taken for a member")
    }

    /// `Spawned.killTree` leaves no process of the tree behind, even one forked while it
    /// kills: a shell forking `sleep` as fast as it can, killed fifty times over (the old walk left one behind in about half of such runs). (Walking
    /// first and stopping after missed the child of a fork in flight: it lived on as an
    /// orphan holding `swift test`'s output, `make sanitize` caught one.)
    @Test func killingATreeLeavesNothingOfAForkingShell() throws {
        let marker = "61.\(UInt32.random(in: 100_000...999_999))"
        func survivors() -> [Int32] {
            ProcessTree.directoryNames("/proc").compactMap(Int32.init).filter { pid in
                let command = (try? readFile("/proc/\(pid)/cmdline")) ?? []
                return String(decoding: command, as: UTF8.self).contains(marker)
            }
        }
        defer {
            for pid in survivors() {
                guard let pidfd = try? Pidfd.open(pid: pid) else { continue }
                if (try? readFile("/proc/\(pid)/cmdline")).map({ String(decoding: $0, as: UTF8.self).contains(marker) }) == true {
                    try? pidfd.send(signal: SIGKILL)
                }
            }
        }
        for _ in 0..<50 {
            let shell = try Spawned("/bin/sh", ["-c", "while :; do sleep \(marker) & done"])
            try waitUntil("the shell forking") { processTree(of: shell.pidfd).count > 20 }
            shell.killTree()
            _ = try shell.wait(timeout: 5)
        }
        try waitUntil("every sleep of the shells killed, left: \(survivors().map { ($0, processState($0) ?? "?") })") {
            survivors().isEmpty
        }
    }

    @Test func processTreeFindsChildrenAndGrandchildren() throws {
        let root = try Spawned("/bin/sh", ["-c", "sleep 60 & sh -c 'sleep 60 & sleep 60 & wait' & echo ready; wait"])
        try root.expectLine("ready")
        // Five processes, three of which have exec'd sleep (a fork is "sh" until then).
        try waitUntil("five processes, three sleeping") {
            let tree = processTree(of: root.pidfd)
            return tree.count == 5 && tree.filter { $0.command == "sleep" }.count == 3
        }
        let tree = processTree(of: root.pidfd)
        #expect(tree.first?.pid == root.pid)
        #expect(tree.filter { $0.command == "sleep" }.count == 3)
        #expect(ProcessTree.members(of: root.pidfd).map(\.pid).sorted() == tree.map(\.pid).sorted())
    }
}

/// The cgroup v2 freezer on a cgroup the test creates.
@Suite(.serialized) struct CgroupTests {
    @Test func frozenIsALineOfCgroupEvents() {
        let yes = ["populated 1\nfrozen 1\n", "frozen 1", "frozen 1\npopulated 0\n", "\n\nfrozen 1\n\n"]
        let no = ["populated 1\nfrozen 0\n", "frozen 10\n", "xfrozen 1\n", "frozen 1 \n", "", "\n", "frozen"]
        for text in yes { #expect(Cgroup.isFrozen(events: Array(text.utf8)), "\(text)") }
        for text in no { #expect(!Cgroup.isFrozen(events: Array(text.utf8)), "\(text)") }
    }

    /// The `0::` line of `/proc/PID/cgroup`, wherever it stands among a hybrid host's v1
    /// lines; no line of its own is no cgroup v2.
    @Test func theUnifiedLineIsFoundAmongTheHierarchies() throws {
        let hybrid = "12:cpuset:/\n11:memory:/user.slice\n1:name=systemd:/user.slice/x.scope\n0::/user.slice/app-1.scope\n"
        #expect(Cgroup.unifiedPath(in: Array(hybrid.utf8)) == "/user.slice/app-1.scope")
        #expect(Cgroup.unifiedPath(in: Array("0::/\n".utf8)) == "/")
        #expect(Cgroup.unifiedPath(in: Array("0::/a b/c".utf8)) == "/a b/c")  // no final newline
        #expect(Cgroup.unifiedPath(in: Array("\n\n0::/x\n1:name=systemd:/y\n".utf8)) == "/x")
        for text in ["", "\n", "1:name=systemd:/user.slice\n", "10::/x\n", "0:", "0:cpu:/x\n", " 0::/x\n"] {
            #expect(Cgroup.unifiedPath(in: Array(text.utf8)) == nil, "\(text)")
        }
        let own = try #require(Cgroup.of(pid: getpid()))
        let listed = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        #expect(listed.contains("0::" + own.path + "\n"))
    }

    @Test func mountPointIsFoundInMountinfo() throws {
        let root = try #require(Cgroup.mountPoint)
        #expect(access(root + "/cgroup.procs", F_OK) == 0)
    }

    /// Files of a cgroup opened from its parent's descriptor, held: the same files as by
    /// path; a parent removed and made again is opened again; a missing file is an error.
    @Test(.enabled(if: Capabilities.cgroupsWritable, "needs a writable cgroup v2 hierarchy (root)"))
    func aCgroupsFilesOpenFromItsParentHeld() throws {
        let parent = Cgroup.mountPoint! + "/bgtaskd-test-\(getpid())-parents"
        let cgroup = Cgroup(directory: parent + "/app-1.scope")
        func make() throws {
            try systemCall("mkdir") { mkdir(parent, 0o755) }
            try systemCall("mkdir") { mkdir(cgroup.directory, 0o755) }
        }
        try make()
        defer {
            rmdir(cgroup.directory)
            rmdir(parent)
        }
        let parents = CgroupParents(limit: 2)
        try cgroup.setFrozen(true, parents: parents)
        try waitUntil("frozen 1") { try cgroup.isFrozen() }  // an empty cgroup freezes at once
        #expect(try cgroup.freezeRequested())
        #expect(parents.count == 1)
        #expect(try cgroup.freezeOwner(parents: parents) == cgroup.freezeOwner())
        let events = try cgroup.openEvents(parents: parents)
        #expect(Cgroup.isFrozen(events: try events.readFromStart(upTo: 4096)))
        try cgroup.setFrozen(false, parents: parents)
        try waitUntil("frozen 0") { try !cgroup.isFrozen() }

        // Removed and made again under the same names: the held descriptor finds nothing.
        rmdir(cgroup.directory)
        rmdir(parent)
        try make()
        try cgroup.setFrozen(true, parents: parents)
        #expect(try cgroup.freezeRequested())
        try cgroup.setFrozen(false, parents: parents)

        #expect(throws: Errno.self) { try Cgroup(directory: parent + "/app-2.scope").setFrozen(true, parents: parents) }
        #expect(throws: Errno.self) { try Cgroup(directory: parent + "-none/app-1.scope").setFrozen(true, parents: parents) }
        #expect(parents.count <= 2)
    }

    /// A cgroup's processes and those of the cgroups below it, read whole or up to the first
    /// that matches, a few lines at a time (pids cut between two reads are read whole), in at
    /// most so many cgroups.
    @Test(.enabled(if: Capabilities.cgroupsWritable, "needs a writable cgroup v2 hierarchy (root)"))
    func aCgroupsProcessesAreReadUpToTheFirstThatMatches() throws {
        let cgroup = Cgroup(directory: Cgroup.mountPoint! + "/bgtaskd-test-\(getpid())-procs")
        let below = Cgroup(directory: cgroup.directory + "/below")
        try systemCall("mkdir") { mkdir(cgroup.directory, 0o755) }
        try systemCall("mkdir") { mkdir(below.directory, 0o755) }
        defer {
            try? cgroup.kill()
            try? waitUntil("the cgroup empty") { try cgroup.processes().isEmpty }
            rmdir(below.directory)
            rmdir(cgroup.directory)
        }
        // 40 processes in the cgroup (their list is longer than a read), one below it.
        let shell = try Spawned("/bin/sh", ["-c", "echo $$ > \(cgroup.directory)/cgroup.procs; for i in $(seq 40); do sleep 60 & done; "
            + "sleep 60 & echo $! > \(below.directory)/cgroup.procs; echo $!; wait"])
        let lowest = try #require(shell.readLine(timeout: 5).flatMap { Int32($0) })
        let all = try cgroup.processes()
        #expect(all.count == 42)
        #expect(all.last == lowest)
        #expect(try below.processes() == [lowest])
        #expect(all.map(String.init).joined(separator: "\n").utf8.count > 128)
        for pid in all { #expect(try cgroup.firstProcess(where: { $0 == pid }) == .found(pid)) }
        #expect(try cgroup.firstProcess(where: { _ in true }) == .found(all[0]))
        var seen: [Int32] = []
        #expect(try cgroup.firstProcess(where: { seen.append($0); return false }) == .none)
        #expect(seen == all)
        // Bounded: the cgroup itself counts as one.
        #expect(try cgroup.firstProcess(where: { $0 == lowest }, cgroupsAtMost: 2) == .found(lowest))
        #expect(try cgroup.firstProcess(where: { $0 == lowest }, cgroupsAtMost: 1) == .tooManyCgroups)
        #expect(try cgroup.firstProcess(where: { _ in false }, cgroupsAtMost: 1) == .tooManyCgroups)
        #expect(try below.firstProcess(where: { _ in false }, cgroupsAtMost: 1) == .none)
        #expect(throws: Errno.self) { try Cgroup(directory: cgroup.directory + "/none").firstProcess(where: { _ in true }) }
        // A whole list, bounded the same way; the kernel counts the cgroups below.
        let one = try cgroup.processes(cgroupsAtMost: 1), two = try cgroup.processes(cgroupsAtMost: 2)
        #expect(one.pids == Array(all.dropLast()) && !one.complete)
        #expect(two.pids == all && two.complete)
        #expect(try cgroup.descendantCount() == 1)
        #expect(try below.descendantCount() == 0)
    }

    @Test(.enabled(if: Capabilities.cgroupsWritable, "needs a writable cgroup v2 hierarchy (root)"))
    func freezeThawAndKillACgroup() throws {
        let cgroup = Cgroup(directory: Cgroup.mountPoint! + "/bgtaskd-test-\(getpid())-freeze")
        try systemCall("mkdir") { mkdir(cgroup.directory, 0o755) }
        defer { rmdir(cgroup.directory) }
        let child = try Spawned("/bin/sh", ["-c", "echo $$ > \(cgroup.directory)/cgroup.procs; sleep 60 & echo ready; wait"])
        try child.expectLine("ready")
        #expect(Cgroup.of(pid: child.pid) == cgroup)
        #expect(try cgroup.processes().count == 2)
        try cgroup.setFrozen(true)
        try waitUntil("frozen 1") { try cgroup.isFrozen() }
        try child.signal(SIGCONT)  // does not thaw a frozen cgroup
        #expect(try cgroup.isFrozen())
        try cgroup.setFrozen(false)
        try waitUntil("frozen 0") { try !cgroup.isFrozen() }
        try cgroup.kill()
        #expect(Spawned.terminatingSignal(try child.wait(timeout: 5)) == SIGKILL)
        try waitUntil("the cgroup empty") { try cgroup.processes().isEmpty }
    }
}

/// The process-events connector, on processes the test starts.
@Suite struct ProcessEventsTests {
    @Test(.enabled(if: getuid() == 0, "needs CAP_NET_ADMIN (root) to subscribe to the process-events connector"))
    func aDoubleForkIsSeenAsItHappens() throws {
        let events = try ProcessEvents.open()
        defer { events.close() }
        // The grandchild re-parents at once: no tree walk could find it from `shell`.
        let shell = try Spawned("/bin/sh", ["-c", "(sh -c 'echo $$; exec sleep 60' &); wait"])
        let line = try shell.readLine(timeout: 5)
        let grandchild = try #require(line.flatMap { Int32($0) })
        let held = try Pidfd.open(pid: grandchild)
        var seen: [ProcessEvents.Event] = []
        try waitUntil("the double fork reported") {
            seen += try events.read()
            let middle = seen.compactMap { if case let .fork(parent, child) = $0, parent == shell.pid { child } else { nil } }
            return middle.contains { middle in seen.contains(.fork(parent: middle, child: grandchild)) }
        }
        try held.send(signal: SIGKILL)
        try waitUntil("its exit reported") {
            seen += try events.read()
            return seen.contains(.exit(grandchild))
        }
    }
}

extension ProcessEventsTests {
    /// Only what the tracker reads reaches the socket: a process that starts threads, renames
    /// itself and execs makes thread creations and exits, a comm and an exec event, and none
    /// of them is read; its own fork and exit are.
    @Test(.enabled(if: getuid() == 0, "needs CAP_NET_ADMIN (root) to subscribe to the process-events connector"))
    func threadsExecsAndRenamesAreDroppedBeforeTheyAreRead() throws {
        let events = try ProcessEvents.open()
        defer { events.close() }
        let script = "import os, threading\n"
            + "ts = [threading.Thread(target=lambda: None) for _ in range(8)]\n"
            + "[t.start() for t in ts]; [t.join() for t in ts]\n"
            + "open('/proc/self/comm', 'w').write('renamed')\n"
            + "os.execv('/bin/true', ['true'])\n"
        let child = try Spawned("/usr/bin/python3", ["-c", script])
        var seen: [ProcessEvents.Event] = []
        try waitUntil("the exec'ing process's exit reported") {
            seen += try events.read()
            return seen.contains(.exit(child.pid))
        }
        #expect(events.skipped == 0, "\(events.skipped) datagrams other than a process's fork or exit were read")
    }
}

/// Whether the running kernel is at least `major.minor` (uname's release).
func kernelAtLeast(_ major: Int, _ minor: Int) -> Bool {
    var name = utsname()
    uname(&name)
    let release = withUnsafeBytes(of: name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    let parts = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
    guard parts.count == 2 else { return false }
    return (parts[0], parts[1]) >= (major, minor)
}
