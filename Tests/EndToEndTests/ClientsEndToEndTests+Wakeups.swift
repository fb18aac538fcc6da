// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// A client blocked in `read(2)` for its reply. The kernel wakes every sleeper on an
/// `AF_UNIX` stream when its peer takes what it sent (`unix_write_space`), whatever it waits
/// for: a daemon that took a call's bytes and answered a pass later woke such a client twice
/// per call, once for nothing. It takes them as the reply goes out (`Connection.readInput`).
extension ClientsEndToEndTests {
    /// Round trips of a call on a blocking socket, from this thread, counting how often the
    /// thread went to sleep (`voluntary_ctxt_switches` of /proc/thread-self/status): once
    /// per call when only the reply wakes it, up to twice when taking the call woke it first.
    /// The thread and the daemon are pinned to two CPUs: on one, the reply's wake-up may
    /// preempt the daemon before it takes the call (the client then runs its next call and
    /// sleeps again first), which is the scheduler's choice, not the daemon's.
    @Test(.enabled(if: Self.allowedCPUs().count >= 2, "needs two CPUs: on one the scheduler decides"))
    func aClientBlockedInReadIsWokenByItsReplyAlone() throws {
        let daemon = try TestDaemon()
        let cpus = Self.allowedCPUs()
        try setCPUAffinity(pid: 0, cpus: [cpus[0]])
        defer { try? setCPUAffinity(pid: 0, cpus: cpus) }
        try setCPUAffinity(pid: daemon.process.pid, cpus: [cpus[1]])
        let socket = try UnixSocket.connect(path: daemon.socketPath)
        // GetStatus: a pass long enough (a status built and encoded) for a wake-up taken
        // at the start of it to find the client asleep again before the reply.
        let call = Self.getStatus
        var reply = [UInt8](repeating: 0, count: 65536)
        func roundTrip() throws { try Self.roundTrip(socket, call, reply: &reply) }
        for _ in 0..<20 { try roundTrip() }  // the daemon's first calls allocate
        let calls = 300
        let before = Self.voluntarySwitches()
        for _ in 0..<calls { try roundTrip() }
        let sleeps = Self.voluntarySwitches() - before
        // Room for sleeps that are not the socket's (the daemon preempted between its reply
        // and its take by the suite's other processes, a page fault); reading each call at
        // the start of its pass made it 600 sleeps in 300 round trips here, five runs of five.
        #expect(sleeps <= calls * 6 / 5, "\(sleeps) sleeps in \(calls) round trips")
    }

    /// What the daemon answered is gone from the client's send queue (`SIOCOUTQ`) in the end,
    /// without another call: input peeked is taken, not left in the socket for ever.
    @Test func aCallsBytesAreTakenOnceItIsAnswered() throws {
        let daemon = try TestDaemon(["MaxMessageBytes=256K"])
        let socket = try UnixSocket.connect(path: daemon.socketPath)
        // Several calls in one write, and one larger than a read, to be taken in pieces.
        let status = "{\"method\":\"io.bgtaskd.Manager.GetStatus\"}\0"
        let large = "{\"method\":\"io.bgtaskd.Manager.GetStatus\",\"parameters\":{},\"oneway\":false,\"x\":\""
            + String(repeating: "a", count: 100_000) + "\"}\0"
        try socket.writeAll(Array((String(repeating: status, count: 5) + large + status).utf8))
        var replies = 0
        while replies < 7 {
            guard try socket.waitReadable(timeoutMilliseconds: 5000) else { throw TestFailure("\(replies) replies of 7") }
            let chunk = try socket.read(upTo: 65536)
            if chunk.isEmpty { throw TestFailure("closed after \(replies) replies") }
            replies += chunk.count { $0 == 0 }
        }
        try waitUntil("the calls taken from the socket") { Self.unread(socket) == 0 }
        // A small call answered alone is left, then taken too once the connection is idle
        // (`Daemon.takeDelay`).
        try socket.writeAll(Array(status.utf8))
        guard try socket.waitReadable(timeoutMilliseconds: 5000) else { throw TestFailure("no reply") }
        _ = try socket.read(upTo: 65536)
        try waitUntil("the last call taken from the socket") { Self.unread(socket) == 0 }
    }

    /// A client calling one call at a time has its calls left in the socket after their
    /// replies, eight of them, and taken with the ninth's reply (`Daemon.settleInput`): a take
    /// wakes a client asleep in `read(2)` for nothing. (Taken after every reply, at most one
    /// call's bytes would be waiting after each.) An idle connection's are taken by a timer.
    @Test func answeredCallsAreLeftInTheSocketAndTakenWithTheNinth() throws {
        let daemon = try TestDaemon()
        let socket = try UnixSocket.connect(path: daemon.socketPath)
        let call = Self.getStatus
        var reply = [UInt8](repeating: 0, count: 65536)
        func roundTrip() throws { try Self.roundTrip(socket, call, reply: &reply) }
        // The timer takes a connection's calls once it was idle for `Daemon.takeDelay` (10 ms):
        // each call is left between the check before and the check after it, so while no two
        // checks are 5 ms apart, none was taken by the timer. A slower run checks less.
        var slow = false
        var last = Clock.monotonicNanoseconds()
        func quick() -> Bool {
            let now = Clock.monotonicNanoseconds()
            if now - last >= 5_000_000 { slow = true }
            last = now
            return !slow
        }
        // What one write costs its sender until taken (`SIOCOUTQ` counts buffers: 768 bytes
        // for this call here).
        try roundTrip()
        let perCall = Self.unread(socket)
        #expect(perCall >= call.count || !quick(), "after the first call, \(perCall) bytes waiting")
        for calls in 2...8 {
            try roundTrip()
            let waiting = Self.unread(socket)
            #expect(waiting == calls * perCall || !quick(), "after \(calls) calls, \(waiting) bytes waiting")
        }
        try roundTrip()
        try waitUntil("the nine calls taken with the ninth's reply") { Self.unread(socket) == 0 }
        (slow, last) = (false, Clock.monotonicNanoseconds())
        try roundTrip()
        let waiting = Self.unread(socket)
        #expect(waiting == perCall || !quick(), "after the tenth call, \(waiting) bytes waiting")
        if slow { print("answeredCallsAreLeftInTheSocketAndTakenWithTheNinth: a run slower than the timer, checked less") }
    }

    /// The socket is edge-triggered (`Connection.updateEvents`): a peer that sends its call
    /// and hangs up is reported once, with both; the daemon answers, then sees the end of
    /// its input and closes. A call cut short by the hang-up is closed on too.
    @Test func aPeerThatHangsUpAfterItsCallIsAnsweredThenClosed() throws {
        let daemon = try TestDaemon()
        let call = Self.getStatus
        for bytes in [call, call + call, Array(call.dropLast(5))] {
            let socket = try UnixSocket.connect(path: daemon.socketPath)
            try socket.writeAll(bytes)
            #expect(shutdown(socket.rawValue, Int32(SHUT_WR)) == 0)
            var received: [UInt8] = []
            while true {
                guard try socket.waitReadable(timeoutMilliseconds: 5000) else {
                    throw TestFailure("the daemon kept the connection open after \(received.count { $0 == 0 }) replies")
                }
                let chunk = try socket.read(upTo: 65536)
                if chunk.isEmpty { break }
                received += chunk
            }
            #expect(received.count { $0 == 0 } == bytes.count { $0 == 0 })
        }
    }

    static let getStatus = Array("{\"method\":\"io.bgtaskd.Manager.GetStatus\"}\0".utf8)

    /// Sends `call` and reads its reply into `reply`, blocked in `read(2)` (not polling first:
    /// what the wake-ups above are about).
    static func roundTrip(_ socket: FileDescriptor, _ call: [UInt8], reply: inout [UInt8]) throws {
        try socket.writeAll(call)
        var received = 0
        repeat {
            let count = reply.withUnsafeMutableBytes { read(socket.rawValue, $0.baseAddress! + received, $0.count - received) }
            guard count > 0 else { throw TestFailure("the daemon closed the connection (\(errno))") }
            received += count
        } while reply[received - 1] != 0
    }

    /// The CPUs this thread may run on (`Cpus_allowed_list`).
    static func allowedCPUs() -> [Int] {
        let status = (try? String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)) ?? ""
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Cpus_allowed_list:") }),
              let list = line.split(separator: "\t").last else { return [] }
        return list.split(separator: ",").flatMap { range -> [Int] in
            let ends = range.split(separator: "-").compactMap { Int($0) }
            guard let first = ends.first, first < 64 else { return [] }
            return Array(first...min(ends.last ?? first, 63))
        }
    }

    static func voluntarySwitches() -> Int { (try? EndToEndTests.voluntarySwitches("/proc/thread-self/status")) ?? -1 }

    /// Bytes this end sent that the peer has not taken. `ioctl(SIOCOUTQ)`
    static func unread(_ socket: FileDescriptor) -> Int {
        var count: Int32 = 0
        return ioctl(socket.rawValue, UInt(TIOCOUTQ), &count) == 0 ? Int(count) : -1
    }
}
