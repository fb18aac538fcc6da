// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskSystem
import Foundation
import Glibc
import Testing
import TestSupport

/// The loop on real descriptors: pipes and `timerfd`s.
@Suite struct EventLoopTests {
    /// A pipe whose read end is ready once a byte was written.
    final class Pipe {
        let read: FileDescriptor
        let write: FileDescriptor
        init() throws { (read, write) = try Subprocess.pipe() }
        /// A pipe whose read end is descriptor `number` if it is free, else the lowest free
        /// number above it (moved there with `F_DUPFD_CLOEXEC` if the pipe took a lower one,
        /// which a test running beside this one may have just freed).
        init(readingAt number: Int32) throws {
            let (original, write) = try Subprocess.pipe()
            if original.rawValue < number {
                read = FileDescriptor(try systemCall("fcntl(F_DUPFD_CLOEXEC)") { fcntl(original.rawValue, F_DUPFD_CLOEXEC, number) })
            } else {
                read = original
            }
            self.write = write
        }
        func fill() { var byte: UInt8 = 1; _ = Glibc.write(write.rawValue, &byte, 1) }
    }

    /// What the members of a test noted when their handlers ran.
    final class Heard { var names: [String] = [] }

    /// Adds `pipe`'s read end as a member noting "second"; checks that nothing is heard for
    /// three turns (an event left pending by an earlier member included), then that its own
    /// byte is. Returns the member.
    func expectHeardAlone(_ pipe: Pipe, on loop: EventLoop, _ heard: Heard) throws -> EventSource {
        let source = try loop.addIO(pipe.read.rawValue, events: IOEvents.readable) { _ in
            heard.names.append("second")
            var byte: UInt8 = 0
            _ = read(pipe.read.rawValue, &byte, 1)
        }
        for _ in 0..<3 { try loop.runOnce(timeoutMilliseconds: 5) }
        #expect(heard.names.isEmpty)
        pipe.fill()
        try turn(loop, until: "the second member") { heard.names == ["second"] }
        return source
    }

    /// Turns the loop until `condition` holds, for at most `seconds`.
    func turn(_ loop: EventLoop, until what: String, seconds: Double = 5, _ condition: () -> Bool) throws {
        let deadline = Clock.monotonicNanoseconds() + Int64(seconds * 1e9)
        while !condition() {
            guard Clock.monotonicNanoseconds() < deadline else { throw TestFailure("timed out waiting for \(what)") }
            try loop.runOnce(timeoutMilliseconds: 10)
        }
    }

    @Test func aTimerFiresOnceAtItsInstantNeverBefore() throws {
        let loop = try EventLoop()
        var fired: [Int64] = []
        let timer = try loop.addTimer { fired.append(Clock.monotonicNanoseconds()) }
        let at = Clock.monotonicNanoseconds() + 30_000_000
        timer.arm(at: at)
        try turn(loop, until: "the timer") { !fired.isEmpty }
        #expect(fired[0] >= at)
        #expect(loop.now >= at)  // the pass's instant is the wake-up's
        for _ in 0..<5 { try loop.runOnce(timeoutMilliseconds: 5) }
        #expect(fired.count == 1)  // one-shot
        // Passed already: fires at the next turn.
        timer.arm(at: Clock.monotonicNanoseconds() - 1_000_000_000)
        try turn(loop, until: "a timer armed in the past") { fired.count == 2 }
    }

    /// A `CLOCK_BOOTTIME` timer fires at its instant on that clock (the daemon's for the
    /// machine's waking); the pass that woke reads the sleep with its `now`: the two clocks'
    /// difference, to the time between the reads.
    @Test func aBoottimeTimerFiresAtItsInstantOnThatClock() throws {
        let loop = try EventLoop()
        var fired: [Int64] = []
        let timer = try loop.addTimer(clock: .boottime) { fired.append(Clock.boottimeNanoseconds()) }
        let at = Clock.boottimeNanoseconds() + 30_000_000
        timer.arm(at: at)
        try turn(loop, until: "the timer") { !fired.isEmpty }
        #expect(fired[0] >= at)
        let slept = Clock.sleptNanoseconds()
        #expect(slept >= 0 && abs(loop.slept - slept) < 1_000_000, "the pass read \(loop.slept) ns slept, the clocks \(slept)")
    }

    @Test func aTimerMovedOrTurnedOffBeforeItsTurnDoesNotFire() throws {
        let loop = try EventLoop()
        var fired = 0
        let timer = try loop.addTimer { fired += 1 }
        let due = Clock.monotonicNanoseconds() + 5_000_000
        timer.arm(at: due)
        waitForInstant(due)  // the precondition: due, and not turned (the loop has not waited since)
        timer.arm(at: nil)
        for _ in 0..<5 { try loop.runOnce(timeoutMilliseconds: 5) }
        #expect(fired == 0)
        // Moved later after it became due: fires at the new instant, once.
        let soon = Clock.monotonicNanoseconds() + 1_000_000
        timer.arm(at: soon)
        waitForInstant(soon)
        let later = Clock.monotonicNanoseconds() + 40_000_000
        timer.arm(at: later)
        try turn(loop, until: "the moved timer") { fired == 1 }
        #expect(Clock.monotonicNanoseconds() >= later)
    }

    /// `runSoon()`: the work runs once, after the handlers of what was ready in the same
    /// iteration, and an iteration with it pending does not block (a connection's next turn
    /// costs no timer).
    @Test func workRunSoonGoesAfterWhatIsReadyAndTheWaitDoesNotBlock() throws {
        let loop = try EventLoop()
        let heard = Heard()
        loop.soon = { heard.names.append("soon") }
        let pipe = try Pipe()
        let source = try loop.addIO(pipe.read.rawValue, events: IOEvents.readable) { _ in
            heard.names.append("ready")
            var byte: UInt8 = 0
            _ = read(pipe.read.rawValue, &byte, 1)
            loop.runSoon()
        }
        pipe.fill()
        try turn(loop, until: "the ready member") { !heard.names.isEmpty }
        #expect(heard.names == ["ready", "soon"])  // in the iteration that found it ready, after it
        // From outside a handler: the next wait returns at once though nothing is ready.
        loop.runSoon()
        let started = Clock.monotonicNanoseconds()
        try loop.runOnce(timeoutMilliseconds: 4_000)
        #expect(Clock.monotonicNanoseconds() - started < 2_000_000_000)
        #expect(heard.names == ["ready", "soon", "soon"])
        // Once: nothing pending, nothing run.
        for _ in 0..<3 { try loop.runOnce(timeoutMilliseconds: 5) }
        #expect(heard.names.count == 3)
        withExtendedLifetime(source) {}
    }

    @Test func aGroupsReadyMembersAreHandledInOneDispatch() throws {
        let loop = try EventLoop()
        var dispatches = 0
        var handled: [Int] = []
        var group: IOGroup?
        group = try IOGroup(loop: loop) {
            dispatches += 1
            group?.dispatchReady()
        }
        let pipes = try (0..<3).map { _ in try Pipe() }
        var sources: [EventSource?] = []
        var removed: Int?
        for (index, pipe) in pipes.enumerated() {
            sources.append(try group!.add(pipe.read.rawValue, events: IOEvents.readable) { _ in
                handled.append(index)
                var byte: UInt8 = 0
                _ = read(pipe.read.rawValue, &byte, 1)
                // The first handler removes a member whose event the same wait collected.
                if handled.count == 1, let victim = (0..<3).first(where: { $0 != index }) {
                    removed = victim
                    sources[victim] = nil
                }
            })
        }
        for pipe in pipes { pipe.fill() }
        try turn(loop, until: "the group's dispatch") { dispatches > 0 }
        #expect(dispatches == 1)
        #expect(handled.count == 2)
        #expect(removed.map { !handled.contains($0) } == true)
        // The handlers hold `sources` and the group holds itself through `group`: let go, or
        // the loop leaks (LeakSanitizer).
        sources.removeAll()
        group = nil
    }

    /// With `membersPerPass`, a wait's ready members are handled a few per `onReady`, every
    /// one of them in the same iteration, and each `onReady` after the first sees the clock
    /// read anew (the daemon fires what fell due at the start of each pass).
    @Test func aGroupHandsItsReadyMembersOutAFewPerPass() throws {
        let loop = try EventLoop()
        var passes: [(now: Int64, handled: Int)] = []
        var handled = 0
        var group: IOGroup?
        group = try IOGroup(loop: loop) {
            let before = handled
            group?.dispatchReady()
            passes.append((loop.now, handled - before))
        }
        group!.membersPerPass = 2
        let pipes = try (0..<5).map { _ in try Pipe() }
        var sources = try pipes.map { pipe in
            try group!.add(pipe.read.rawValue, events: IOEvents.readable) { _ in
                handled += 1
                var byte: UInt8 = 0
                _ = read(pipe.read.rawValue, &byte, 1)
            }
        }
        for pipe in pipes { pipe.fill() }
        try turn(loop, until: "the group's passes") { !passes.isEmpty }
        #expect(passes.map(\.handled) == [2, 2, 1])
        #expect(zip(passes, passes.dropFirst()).allSatisfy { $0.now < $1.now })
        // The members hold the group, which holds itself through `group` and the loop: let
        // go, or the loop leaks (LeakSanitizer).
        sources.removeAll()
        group = nil
    }

    @Test func aRemovedMemberIsNotHeardAndItsSlotServesTheNext() throws {
        let loop = try EventLoop()
        let first = try Pipe(), second = try Pipe()
        let heard = Heard()
        var source: EventSource? = try loop.addIO(first.read.rawValue, events: IOEvents.readable) { _ in heard.names.append("first") }
        first.fill()
        source = nil  // gone before its event is collected
        source = try expectHeardAlone(second, on: loop, heard)
        withExtendedLifetime(source) {}
    }

    /// Whether descriptor `fd` is open in this process. `fcntl(2)`
    static func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) >= 0 }

    /// A member that leaves by closing its descriptor (no `EPOLL_CTL_DEL`) hands it to the
    /// loop's closer thread, which closes it after the loop's next turn: until then it is
    /// still open and its events (a writer going on) are not heard; then it is out of the
    /// kernel's set too, and the same descriptor number opened again is a new member that
    /// works. Tests run beside this one in the same process, and their opens take the lowest
    /// free number: a low one closed here was taken before its reuse three times running in a
    /// CI run. So the number is one near the top of the descriptor limit, which they do not
    /// reach; should one be taken anyway, the case is tried again, up to three times.
    @Test func aMemberClosedWithItsDescriptorIsNotHeardAndItsNumberServesTheNext() throws {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        let quiet = Int32(clamping: limit.rlim_cur) - 16
        for _ in 1...3 {
            let loop = try EventLoop()
            let first = try Pipe(readingAt: quiet)
            let heard = Heard()
            let number = first.read.rawValue
            var source: EventSource? = try loop.addIO(number, events: IOEvents.readable | IOEvents.edgeTriggered) { _ in
                heard.names.append("first")
            }
            first.fill()
            source?.close(first.read)
            #expect(first.read.rawValue == -1)
            #expect(Self.isOpen(number))  // the closer's now, closed after the loop's next turn
            source = nil
            first.fill()  // a new edge, for a member that left
            try turn(loop, until: "the closer closed descriptor \(number)") { !Self.isOpen(number) }
            #expect(heard.names.isEmpty)
            let second = try Pipe(readingAt: number)
            guard second.read.rawValue == number else { continue }  // taken by a test beside this one
            source = try expectHeardAlone(second, on: loop, heard)
            withExtendedLifetime(source) {}
            return
        }
        Issue.record("the closed descriptor's number was taken by other tests in three tries: nothing was tested")
    }

    /// A connected pair of stream sockets: whether one end was closed shows at the other
    /// (`POLLHUP`), whatever number the closed one's is given next by a test beside this one.
    static func socketPair() throws -> (Int32, FileDescriptor) {
        var ends: [Int32] = [-1, -1]
        try systemCall("socketpair") { socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &ends) }
        return (ends[0], FileDescriptor(ends[1]))
    }

    /// Whether the other end of `peer`'s pair is closed. `poll(2)`
    static func hungUp(_ peer: FileDescriptor) -> Bool {
        var entry = pollfd(fd: peer.rawValue, events: 0, revents: 0)
        return poll(&entry, 1, 0) == 1 && entry.revents & Int16(POLLHUP) != 0
    }

    /// A member closed with `now` is closed before `close` returns: its peer hangs up with
    /// the loop never turned (a descriptor given to the closer is handed over only after a
    /// turn). The hang-up is waited for, not expected at once: a process being spawned by a
    /// test beside this one holds a copy of every descriptor until its `exec` (CI met that).
    @Test func aMemberClosedNowIsClosedAtOnce() throws {
        let loop = try EventLoop()
        let (end, peer) = try Self.socketPair()
        let socket = FileDescriptor(end)
        let source = try loop.addIO(end, events: IOEvents.readable | IOEvents.edgeTriggered) { _ in }
        #expect(!Self.hungUp(peer))
        source.close(socket, now: true)
        #expect(socket.rawValue == -1)
        try waitUntil("the peer hung up, the loop never turned", timeout: 2) { Self.hungUp(peer) }
        withExtendedLifetime(loop) {}
    }

    /// The closer closes a batch it was handed on its thread, every signal blocked there (the
    /// loop takes them through sd-event's `signalfd`: one delivered to the closer's thread
    /// would kill the process); fewer than a batch it closes when they are handed over, on
    /// the caller's thread, without starting its own; what it gathered but was never handed
    /// over it closes as it goes away. (A peer's hang-up is waited for, not expected at once:
    /// a process being spawned by a test beside this one holds a copy of every descriptor
    /// until its `exec`.)
    @Test func theCloserClosesABatchOnAThreadThatTakesNoSignalAndFewHere() throws {
        var closer: DescriptorCloser? = DescriptorCloser()
        var few: [FileDescriptor] = []
        for _ in 1..<DescriptorCloser.batch {
            let (end, peer) = try Self.socketPair()
            closer!.close(end)
            few.append(peer)
        }
        #expect(!few.contains(where: Self.hungUp))  // gathered, not handed over
        closer!.handOver()
        #expect(!closer!.threadStarted)
        try waitUntil("\(few.count) descriptors closed") { few.allSatisfy(Self.hungUp) }

        var handed: [FileDescriptor] = [], kept: [FileDescriptor] = []
        for _ in 0..<100 {
            let (end, peer) = try Self.socketPair()
            closer!.close(end)
            handed.append(peer)
        }
        closer!.handOver()
        #expect(closer!.threadStarted)
        try waitUntil("the closer closed 100 descriptors") { handed.allSatisfy(Self.hungUp) }
        // Its thread, named "closer", blocks SIGTERM, SIGINT and SIGHUP (bits 14, 1 and 0).
        let own = "/proc/self/task"
        let closers = ProcessTree.directoryNames(own).filter { task in
            (try? readFile("\(own)/\(task)/comm")).map { String(decoding: $0, as: UTF8.self) == "closer\n" } ?? false
        }
        #expect(!closers.isEmpty)
        for task in closers {
            guard let status = try? readFile("\(own)/\(task)/status") else { continue }  // ended meanwhile (another test's)
            let line = String(decoding: status, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix("SigBlk:") }
            let mask = line.flatMap { UInt64($0.dropFirst(7).trimmingCharacters(in: .whitespaces), radix: 16) } ?? 0
            #expect(mask & (1 << 14 | 1 << 1 | 1 << 0) == 0b100_0000_0000_0011, "thread \(task): \(line ?? "no SigBlk")")
        }
        for _ in 0..<100 {
            let (end, peer) = try Self.socketPair()
            closer!.close(end)
            kept.append(peer)
        }
        closer = nil  // never handed over: closed as it goes
        try waitUntil("100 descriptors closed with the closer") { kept.allSatisfy(Self.hungUp) }
    }
}
