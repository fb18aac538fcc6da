// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
@testable import BGTaskDaemon
@testable import BGTaskSystem
import Glibc
import Testing
import Varlink

/// A connection's output on a real socket pair: what was queued arrives whole and in order,
/// however it was queued and joined.
@Suite struct ConnectionTests {
    static func pair(peeking: Bool = true) throws -> (Connection, FileDescriptor) {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0 else {
            throw Errno(errno, "socketpair")
        }
        let connection = Connection(id: ConnectionID(1), socket: FileDescriptor(fds[0]),
                                    credentials: PeerCredentials(pid: getpid(), uid: getuid(), gid: getgid(), groups: []),
                                    peerPidfd: nil, maximumMessageBytes: 1 << 16, account: UserAccount(), peeking: peeking)
        return (connection, FileDescriptor(fds[1]))
    }

    static func readAll(_ peer: FileDescriptor) -> [UInt8] {
        var bytes: [UInt8] = []
        while let chunk = try? peer.readAvailable(upTo: 1 << 20), !chunk.isEmpty { bytes += chunk }
        return bytes
    }

    /// Input is peeked, and stays in the socket (`FIONREAD`) until taken; each
    /// read returns what follows the last; the take removes exactly what was read, not what
    /// came after it; the end of the stream reads as 0 once everything is read.
    @Test func inputIsReadInOrderAndTakenOnlyWhenAsked() throws {
        let (connection, peer) = try Self.pair()
        #expect(connection.peeks)
        func unread() -> Int32 {
            var count: Int32 = -1
            _ = ioctl(connection.socket.rawValue, UInt(FIONREAD), &count)
            return count
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4, alignment: 1)
        defer { buffer.deallocate() }
        func read() throws -> [UInt8]? {
            try connection.readInput(into: buffer).map { Array(buffer[..<$0]) }
        }
        #expect(try read() == nil)
        try peer.writeAll(Array("abcdef".utf8))
        #expect(try read() == Array("abcd".utf8))
        #expect(try read() == Array("ef".utf8))
        #expect(try read() == nil)
        #expect(connection.peeked == 6 && unread() == 6)
        try peer.writeAll(Array("gh".utf8))
        #expect(connection.takeInput(through: buffer))  // through a buffer smaller than what it takes
        #expect(connection.peeked == 0 && unread() == 2)
        #expect(try read() == Array("gh".utf8))
        #expect(connection.takeInput(through: buffer) && unread() == 0)
        peer.close()
        // The end comes once the peer's socket is released: a child forked meanwhile by a
        // test running beside this one may hold it until it execs.
        #expect(try connection.socket.waitReadable(timeoutMilliseconds: 5000))
        #expect(try read() == [])
    }

    /// Input answered may be left in the socket while it is a few small writes: up to eight
    /// peeks and 2 KiB; a ninth peek, or more bytes, must be taken (`Daemon.settleInput`). A
    /// read that fills the buffer says more may wait (the socket is edge-triggered).
    @Test func answeredInputMayStayWhileItIsAFewSmallWrites() throws {
        let (connection, peer) = try Self.pair()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 1)
        defer { buffer.deallocate() }
        for peeks in 1...9 {
            try peer.writeAll(Array(repeating: UInt8(ascii: "a"), count: 100))
            #expect(try connection.readInput(into: buffer) == 100)
            #expect(connection.mayLeaveInput == (peeks <= 8) && !connection.inputMayWait, "after \(peeks) peeks")
        }
        #expect(connection.takeInput(through: buffer) && connection.mayLeaveInput)
        try peer.writeAll(Array(repeating: UInt8(ascii: "b"), count: 2049))
        #expect(try connection.readInput(into: buffer) == 2049)
        #expect(!connection.mayLeaveInput)
        #expect(connection.takeInput(through: buffer))
        try peer.writeAll(Array(repeating: UInt8(ascii: "c"), count: 4097))
        #expect(try connection.readInput(into: buffer) == 4096)
        #expect(connection.inputMayWait)
        #expect(try connection.readInput(into: buffer) == 1)
        #expect(!connection.inputMayWait)
    }

    /// Where the kernel has no peek offset, input is read as it comes and there is nothing
    /// to take.
    @Test func withoutPeekingInputIsReadAsItComes() throws {
        let (connection, peer) = try Self.pair(peeking: false)
        #expect(!connection.peeks)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16, alignment: 1)
        defer { buffer.deallocate() }
        try peer.writeAll(Array("abc".utf8))
        #expect(try connection.readInput(into: buffer) == 3)
        var waiting: Int32 = -1
        _ = ioctl(connection.socket.rawValue, UInt(FIONREAD), &waiting)
        #expect(waiting == 0 && connection.peeked == 0)
        #expect(connection.takeInput(through: buffer))
        #expect(try connection.readInput(into: buffer) == nil)
    }

    /// Shared events and the connection's own replies, interleaved, go out joined in the
    /// order queued; a reply queued after a flush that joined them follows them.
    @Test func queuedChunksArriveInOrderJoinedOrNot() throws {
        let (connection, peer) = try Self.pair()
        var expected: [UInt8] = []
        for index in 0..<40 {
            let frame = Array("{\"event\":\(index)}".utf8) + [0]
            #expect(connection.send(shared: frame))
            expected += frame
            if index % 7 == 0 {
                #expect(connection.send(writing: { $0.append(contentsOf: Array("{\"reply\":\(index)}".utf8)) }))
                expected += Array("{\"reply\":\(index)}".utf8) + [0]
            }
        }
        #expect(connection.flush())
        #expect(connection.pendingOutputBytes == 0)
        #expect(connection.send(writing: { $0.append(contentsOf: Array("{\"last\":true}".utf8)) }))
        expected += Array("{\"last\":true}".utf8) + [0]
        #expect(connection.flush())
        let received = Self.readAll(peer)
        #expect(received.count == expected.count)
        let same = received == expected  // not printed whole when they differ
        #expect(same)
    }

    /// A peer that reads slowly: what does not fit is kept, partly written chunks resume
    /// where they stopped, and a chunk over the join limit goes as it is.
    @Test func whatDoesNotFitWaitsAndResumesWhereItStopped() throws {
        let (connection, peer) = try Self.pair()
        var small: Int32 = 4096  // the kernel's least: every flush below stops part-way
        setsockopt(connection.socket.rawValue, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        var expected: [UInt8] = [], received: [UInt8] = []
        let large = [UInt8](repeating: UInt8(ascii: "x"), count: Connection.joinLimit + 1) + [0]
        var partial = 0
        for index in 0..<600 {
            let frame = index == 300 ? large : Array("{\"event\":\(index),\"padding\":\"\(String(repeating: "p", count: index % 50))\"}".utf8) + [0]
            #expect(connection.send(shared: frame))
            expected += frame
            if index % 50 == 49 {
                // Queued behind a chunk written in part: joined with the rest of it.
                #expect(connection.flush())
                if connection.pendingOutputBytes > 0 { partial += 1 }
                received += Self.readAll(peer)
            }
        }
        #expect(partial > 0)
        for _ in 0..<10_000 where connection.pendingOutputBytes > 0 {
            #expect(connection.flush())
            received += Self.readAll(peer)
        }
        received += Self.readAll(peer)
        #expect(connection.pendingOutputBytes == 0)
        #expect(received.count == expected.count)
        let same = received == expected  // not printed whole when they differ
        #expect(same)
    }

    /// Replies go out from the connection's own buffer; written in part to a slow peer, what
    /// is left of them still goes before an event queued after them, and replies after the
    /// event go after it. Every byte arrives once, in order, and the pending counts (the
    /// connection's and its user's) come back to zero.
    @Test func repliesWrittenInPartKeepTheirPlaceBeforeWhatFollows() throws {
        let (connection, peer) = try Self.pair()
        var small: Int32 = 4096  // the kernel's least: a write of more than ~8 KiB stops part-way
        setsockopt(connection.socket.rawValue, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        var expected: [UInt8] = [], received: [UInt8] = []
        var index = 0
        func reply() {
            let text = Array("{\"reply\":\(index),\"padding\":\"\(String(repeating: "r", count: 100 + index * 37 % 900))\"}".utf8)
            #expect(connection.send(writing: { $0.append(contentsOf: text) }))
            expected += text + [0]
            index += 1
        }
        var writtenInPart = 0
        for round in 0..<5 {
            // The socket full, replies wait; the peer reads, and one flush writes some of them.
            while connection.pendingOutputBytes == 0 {
                reply()
                #expect(connection.flush())
            }
            while connection.pendingOutputBytes < 32 << 10 { reply() }
            received += Self.readAll(peer)
            let before = connection.pendingOutputBytes
            #expect(connection.flush())
            if connection.pendingOutputBytes > 0, connection.pendingOutputBytes < before { writtenInPart += 1 }
            let frame = Array("{\"event\":\(round)}".utf8) + [0]
            #expect(connection.send(shared: frame))
            expected += frame
            for _ in 0..<10 { reply() }
        }
        #expect(writtenInPart == 5)
        for _ in 0..<10_000 where connection.pendingOutputBytes > 0 {
            #expect(connection.flush())
            received += Self.readAll(peer)
        }
        received += Self.readAll(peer)
        #expect(connection.pendingOutputBytes == 0)
        #expect(connection.account.outputBytes == 0)
        #expect(received.count == expected.count)
        let same = received == expected  // not printed whole when they differ
        #expect(same)
    }
}
