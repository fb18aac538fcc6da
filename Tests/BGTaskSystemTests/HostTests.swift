// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
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

    /// A listening socket's file is open to everyone (mode 0666: access is decided per call),
    /// and binding it leaves the process's umask alone: other threads create files all the
    /// while (a test process compiling and spawning programs while another test listened got
    /// them without their execute bits — `posix_spawn` refused them, `EACCES`, under ASan).
    /// One thread binds 300 sockets while this one reads the process's umask from the kernel.
    @Test func listeningLeavesTheProcessUmaskAlone() throws {
        let directory = try temporaryDirectory("bgtask-umask")
        defer { rmdir(directory) }
        let before = try Self.processUmask()
        let done = Locked(false)
        let bound = Locked<[String]>([])
        let binder = Thread {
            for index in 0..<300 {
                let path = directory + "/s\(index)"
                if let listener = try? UnixSocket.listen(path: path) {
                    listener.close()
                    bound.withLock { $0.append(path) }
                }
            }
            done.withLock { $0 = true }
        }
        binder.start()
        var seen: Set<UInt32> = []
        while !done.withLock({ $0 }) { seen.insert(try Self.processUmask()) }
        let paths = bound.withLock { $0 }
        defer { for path in paths { unlink(path) } }
        #expect(paths.count == 300)
        #expect(seen == [before], "the process's umask changed while sockets were bound")
        var status = stat()
        #expect(stat(paths[0], &status) == 0)
        #expect(status.st_mode & 0o777 == 0o666)
    }

    /// A client that connects the moment the socket file appears is accepted, never refused:
    /// the file is there only once the socket listens, or within a moment of it (a bind on a
    /// thread of its own, then `listen` on the caller's after joining it, left a window a
    /// client saw as `ECONNREFUSED`: `make bench`'s daemon under callgrind, at `8f45ee0`).
    @Test func aSocketFileThatAppearsIsListenedOn() throws {
        let directory = try temporaryDirectory("bgtask-listen")
        defer { rmdir(directory) }
        var refused = 0
        for index in 0..<200 {
            let path = directory + "/s\(index)"
            let listening = Locked<FileDescriptor?>(nil)
            let listener = Thread { listening.withLock { $0 = try? UnixSocket.listen(path: path) } }
            listener.start()
            let deadline = Clock.monotonicNanoseconds() + 5_000_000_000
            while Clock.monotonicNanoseconds() < deadline {
                do {
                    _ = try UnixSocket.connect(path: path)
                    break
                } catch {
                    if error.code == ECONNREFUSED { refused += 1 }
                    if error.code != ENOENT && error.code != ECONNREFUSED { throw error }
                }
            }
            while listening.withLock({ $0 }) == nil, Clock.monotonicNanoseconds() < deadline {}
            listening.withLock { $0?.close() }
            unlink(path)
        }
        #expect(refused == 0, "a connection refused by a socket whose file was there, \(refused) times")
    }

    /// Sockets made on several threads at once in one directory each get a name of their own
    /// to be bound under before the rename: every one listens at its path.
    @Test func socketsMadeOnSeveralThreadsAtOnceAllListen() throws {
        let directory = try temporaryDirectory("bgtask-listeners")
        defer { rmdir(directory) }
        let failures = Locked<[String]>([]), finished = Locked(0)
        for thread in 0..<4 {
            Thread {
                for index in 0..<300 {
                    let path = directory + "/t\(thread)-\(index)"
                    do {
                        let listener = try UnixSocket.listen(path: path)
                        _ = try UnixSocket.connect(path: path)
                        listener.close()
                    } catch {
                        failures.withLock { $0.append("\(path): \(error)") }
                    }
                    unlink(path)
                }
                finished.withLock { $0 += 1 }
            }.start()
        }
        try waitUntil("the four threads done", timeout: 30) { finished.withLock { $0 } == 4 }
        #expect(failures.withLock { $0 }.isEmpty)
        #expect(ProcessTree.directoryNames(directory).isEmpty, "names left behind")
    }

    /// A path that fits in a socket address while the name it would be staged under beside it
    /// (`.bgtaskd-PID-N`, longer than `s`) does not is bound in place: listening, open to
    /// everyone, nothing left beside it, and a second socket at the path refused as `bind`
    /// refuses one.
    @Test func aPathTooLongToStageBesideIsBoundInPlace() throws {
        let top = try temporaryDirectory("bgtask-long")
        // The directory's path sized so that "/s" just fits (107 bytes at most) and the
        // staging name beside it does not.
        let directory = top + "/" + String(repeating: "d", count: UnixSocket.maximumPathLength - 3 - top.utf8.count)
        #expect(mkdir(directory, 0o700) == 0)
        let path = directory + "/s"
        defer { unlink(path); rmdir(directory); rmdir(top) }
        #expect(path.utf8.count == UnixSocket.maximumPathLength)
        #expect((directory + "/.bgtaskd-\(getpid())-1").utf8.count > UnixSocket.maximumPathLength)
        let listener = try UnixSocket.listen(path: path)
        defer { listener.close() }
        let client = try UnixSocket.connect(path: path)
        client.close()
        var status = stat()
        #expect(stat(path, &status) == 0)
        #expect(status.st_mode & 0o777 == 0o666)
        #expect(ProcessTree.directoryNames(directory) == ["s"], "names left beside the socket")
        do {
            try UnixSocket.listen(path: path).close()
            Issue.record("a second socket was bound at \(path)")
        } catch {
            #expect(error.code == EADDRINUSE)
        }
    }

    /// A pid that was a process's and is no more: a child run and reaped (pids are handed
    /// out in turn up to `pid_max`: not another's again within the test). Spawned as the
    /// daemon spawns, not by Foundation's `Process`, whose weak reference to its task leaked
    /// under ASan once.
    static func deadPid() throws -> Int32 {
        let child = try Subprocess.spawn(["/bin/true"])
        _ = try Subprocess.wait(pid: child.pid)
        return child.pid
    }

    /// What a process killed between its bind and its rename left (a socket under its
    /// staging name) is removed, and nothing else: not a live process's name (it may be
    /// binding now), not a file that is no socket, not a name of another shape.
    @Test func aStagingSocketOfAProcessGoneIsRemovedAndNothingElse() throws {
        let directory = try temporaryDirectory("bgtask-staging")
        let dead = try Self.deadPid()
        let stale = ".bgtaskd-\(dead)-1", live = ".bgtaskd-\(getpid())-77", notSocket = ".bgtaskd-\(dead)-2",
            odd = ".bgtaskd-\(dead)-x", other = "io.bgtaskd"
        for name in [stale, live, odd, other] { try UnixSocket.listen(path: directory + "/" + name).close() }
        let file = creat(directory + "/" + notSocket, 0o600)
        #expect(file >= 0)
        close(file)
        defer {
            for name in [stale, live, notSocket, odd, other] { unlink(directory + "/" + name) }
            rmdir(directory)
        }
        #expect(UnixSocket.removeStaleStagingNames(in: directory) == [stale])
        #expect(ProcessTree.directoryNames(directory).sorted() == [live, notSocket, odd, other].sorted())
        #expect(UnixSocket.removeStaleStagingNames(in: directory).isEmpty)
    }

    /// The process's umask (`/proc/self/status`, which reads it without setting it).
    static func processUmask() throws -> UInt32 {
        let text = String(decoding: try readFile("/proc/self/status"), as: UTF8.self)
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Umask:") }),
              let value = UInt32(line.dropFirst("Umask:".count).trimmingCharacters(in: .whitespaces), radix: 8)
        else { throw TestFailure("no Umask in /proc/self/status") }
        return value
    }
}
