// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

@Suite struct HostTests {
    /// A look at a blocking socket without waiting (the client library's zero-timeout
    /// receive): nothing is `nil`, not a wait; bytes as they came; the end is empty.
    @Test func receiveAvailableNeverBlocksABlockingSocket() throws {
        let directory = try temporaryDirectory("bgtask-receive")
        defer { unlink(directory + "/s"); rmdir(directory) }
        let listener = try UnixSocket.listen(path: directory + "/s")
        defer { listener.close() }
        let client = try UnixSocket.connect(path: directory + "/s")  // blocking
        defer { client.close() }
        #expect(try listener.waitReadable(timeoutMilliseconds: 5000))
        let server = try #require(try UnixSocket.accept(listener))
        #expect(try client.receiveAvailable(upTo: 16) == nil)
        try server.writeAll(Array("abc".utf8))
        #expect(try client.waitReadable(timeoutMilliseconds: 5000))
        #expect(try client.receiveAvailable(upTo: 16) == Array("abc".utf8))
        #expect(try client.receiveAvailable(upTo: 16) == nil)
        server.close()
        // The end is seen once every copy of the server's end is closed (a child another test
        // is spawning may hold one until its exec).
        #expect(try client.waitReadable(timeoutMilliseconds: 5000))
        #expect(try client.receiveAvailable(upTo: 16) == [])
    }

    /// History entries' times: UTC, milliseconds, always 24 bytes, before 1970 too.
    @Test func rfc3339IsUTCToTheMillisecond() {
        #expect(Host.rfc3339(0) == "1970-01-01T00:00:00.000Z")
        #expect(Host.rfc3339(1_796_000_000_123_456_789) == "2026-11-30T00:53:20.123Z")
        #expect(Host.rfc3339(951_782_400_999_999_999) == "2000-02-29T00:00:00.999Z")
        #expect(Host.rfc3339(-1) == "1969-12-31T23:59:59.999Z")
    }
}
