// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// The library's own calls (`PipelinedConnection`): their replies are read as they come,
/// with as few system calls as the bytes need.
@Suite struct PipelinedConnectionTests {
    /// A connection to a server of the test's own, whose end the test writes replies to.
    static func connected(_ body: (PipelinedConnection<Int>, FileDescriptor) throws -> Void) throws {
        let directory = try temporaryDirectory("bgtask-pipelined")
        defer { unlink(directory + "/s"); rmdir(directory) }
        let listener = try UnixSocket.listen(path: directory + "/s")
        defer { listener.close() }
        let connection = try PipelinedConnection<Int>(path: directory + "/s")
        defer { connection.close() }
        #expect(try listener.waitReadable(timeoutMilliseconds: 5000))
        let server = try #require(try UnixSocket.accept(listener))
        defer { server.close() }
        try body(connection, server)
    }

    /// The `read(2)`s this thread makes in `body` (`syscr`; each look at the count costs
    /// reads of its own, measured first and taken off).
    static func reads(_ body: () throws -> Void) throws -> Int {
        let io = "/proc/thread-self/io"
        let look = try readCalls(io)
        let before = try readCalls(io)
        try body()
        let after = try readCalls(io)
        return after - before - (before - look)
    }

    @Test func repliesThatArrivedTogetherAreOneRead() throws {
        try Self.connected { connection, server in
            for tag in 1...3 { try connection.send(VarlinkCall(method: "io.bgtaskd.App.GetTimeRemaining"), tag: tag) }
            try server.writeAll(Array(repeating: Array(#"{"parameters":{"remaining":1}}"#.utf8) + [0], count: 3).joined())
            #expect(try waitReadable([connection.fileDescriptor], timeoutMilliseconds: 5000) == [0])
            var replies: [(Int, VarlinkReply)] = []
            // One read took every byte queued; a second found nothing (two with the loop
            // that read until EAGAIN).
            #expect(try Self.reads { replies = try connection.receiveAvailable() } == 1)
            #expect(replies.map(\.0) == [1, 2, 3])
            #expect(connection.unanswered.isEmpty)
        }
    }

    @Test func aReplyLongerThanOneReadIsReadWhole() throws {
        try Self.connected { connection, server in
            try connection.send(VarlinkCall(method: "io.bgtaskd.App.ListTasks"), tag: 7)
            let name = String(repeating: "n", count: 150_000)
            try server.writeAll(Array(#"{"parameters":{"name":"\#(name)"}}"#.utf8) + [0])
            #expect(try waitReadable([connection.fileDescriptor], timeoutMilliseconds: 5000) == [0])
            var replies: [(Int, VarlinkReply)] = []
            // 64 KiB, 64 KiB, then the rest: a read that fills its buffer is followed by
            // another, one that does not ends it.
            #expect(try Self.reads { replies = try connection.receiveAvailable() } == 3)
            #expect(replies.count == 1 && replies.first?.0 == 7)
            #expect(replies.first?.1.parameters["name"]?.stringValue == name)
        }
    }
}
