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
        let call = Array("{\"method\":\"io.bgtaskd.Manager.GetStatus\"}\0".utf8)
        var reply = [UInt8](repeating: 0, count: 65536)
        func roundTrip() throws {
            try socket.writeAll(call)
            var received = 0
            repeat {
                let count = reply.withUnsafeMutableBytes { read(socket.rawValue, $0.baseAddress! + received, $0.count - received) }
                guard count > 0 else { throw TestFailure("the daemon closed the connection (\(errno))") }
                received += count
            } while reply[received - 1] != 0
        }
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

    /// What the daemon took from the socket is gone from the client's send queue
    /// (`SIOCOUTQ`) once the reply is out: input peeked is taken, not left to poll ready
    /// for ever.
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

    static func voluntarySwitches() -> Int {
        let status = (try? String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") }
        return line.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? -1
    }

    /// Bytes this end sent that the peer has not taken. `ioctl(SIOCOUTQ)`
    static func unread(_ socket: FileDescriptor) -> Int {
        var count: Int32 = 0
        return ioctl(socket.rawValue, UInt(TIOCOUTQ), &count) == 0 ? Int(count) : -1
    }
}
