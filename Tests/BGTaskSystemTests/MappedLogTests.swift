// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import TestSupport
import Testing

/// `MappedLog.prepare(ahead:)`: the page faults of the appends to come, taken at once.
/// Page faults are counted only without a sanitizer: its shadow memory takes faults of its
/// own beside every page first touched.
@Suite struct MappedLogTests {
    /// A log in a fresh file on /dev/shm (a tmpfs, as /run is), and the file's path (the
    /// caller unlinks it).
    private func freshLog() throws -> (MappedLog, String) {
        let path = "/dev/shm/bgtaskd-mappedlog-test-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        try #require(fd >= 0, "open(\(path)): errno \(errno)")
        return (try MappedLog(file: FileDescriptor(fd), length: 0), path)
    }

    /// The faults a run of appends into prepared room may take that are not the room's: the
    /// thread's count is the kernel's, and once in a CI run of the whole suite a run of 512
    /// appends into prepared room counted 1 (the room's own would be a fault a page: 128).
    static let strayFaults = 1

    /// Page faults this thread has taken (`getrusage(RUSAGE_THREAD)`).
    private func faults() -> Int {
        var usage = rusage()
        getrusage(__rusage_who_t(1), &usage)  // RUSAGE_THREAD (a GNU name Glibc does not import)
        return usage.ru_minflt + usage.ru_majflt
    }

    /// Appends 1 KiB at a time, `bytes` in all; returns the faults taken meanwhile.
    private func faultsAppending(_ bytes: Int, to log: MappedLog) throws -> Int {
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1024)
        try chunk.withUnsafeBytes { try log.append($0) }  // the chunk's own pages, and the first append's
        let before = faults()
        for _ in 0..<(bytes / 1024 - 1) { try chunk.withUnsafeBytes { try log.append($0) } }
        return faults() - before
    }

    @Test(.disabled(if: Capabilities.sanitized, "a sanitizer's shadow memory faults beside the log's pages"))
    func appendsIntoPreparedRoomTakeNoPageFault() throws {
        let (unprepared, first) = try freshLog()
        defer { unlink(first) }
        let (prepared, second) = try freshLog()
        defer { unlink(second) }
        try prepared.prepare(ahead: 48 << 10)
        #expect(prepared.prepared >= 48 << 10)
        // 12 pages: each one a fault unprepared (the room reserved at first is 64 KiB).
        #expect(try faultsAppending(48 << 10, to: unprepared) >= 11)
        #expect(try faultsAppending(48 << 10, to: prepared) <= Self.strayFaults)
        #expect(prepared.prepared < 1024)
    }

    @Test func preparingBeyondTheRoomReservedGrowsItAndKeepsTheText() throws {
        let (log, path) = try freshLog()
        defer { unlink(path) }
        let text = Array("one line\n".utf8)
        try text.withUnsafeBytes { try log.append($0) }
        try log.prepare(ahead: 1 << 20)  // past the 64 KiB reserved at first: reserved and mapped anew
        #expect(log.prepared >= 1 << 20)
        #expect(log.length == text.count)
        let faults = try faultsAppending(512 << 10, to: log)
        if !Capabilities.sanitized { #expect(faults <= Self.strayFaults) }  // 128 pages unprepared
        #expect(log.length == text.count + 512 << 10)
        // The file: the text, the appends, then zeros (the room prepared holds nothing).
        let bytes = try readFile(path, limit: 4 << 20)
        #expect(Array(bytes.prefix(text.count)) == text)
        #expect(bytes[text.count..<log.length].allSatisfy { $0 == UInt8(ascii: "x") })
        #expect(bytes.count >= log.length + 512 << 10)
        #expect(bytes[log.length...].allSatisfy { $0 == 0 })
    }

    @Test func aPreparationInSlicesTakesAtMostASliceAtATime() throws {
        let (log, path) = try freshLog()
        defer { unlink(path) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        var slices = 0
        while log.prepared < 1 << 20 {
            let before = log.prepared
            try log.prepare(ahead: 1 << 20, atMost: 256 << 10)
            #expect(log.prepared > before)
            #expect(log.prepared - before <= 256 << 10)
            slices += 1
            try #require(slices <= 8, "\(log.prepared) bytes prepared after \(slices) slices")
        }
        #expect(slices == 4)
        // Less than a page is still a page's progress; done is done.
        try log.prepare(ahead: (1 << 20) + 1, atMost: 1)
        #expect(log.prepared == (1 << 20) + page)
        try log.prepare(ahead: 1 << 20, atMost: 256 << 10)
        #expect(log.prepared == (1 << 20) + page)
        if !Capabilities.sanitized { #expect(try faultsAppending(1 << 20, to: log) == 0) }
    }

    /// Past the window of address space first mapped (64 MiB), the log is mapped anew: the
    /// text is kept, and appends go on into the room.
    @Test func growingPastTheWindowMapsTheLogAnew() throws {
        let (log, path) = try freshLog()
        defer { unlink(path) }
        let text = Array("one line\n".utf8)
        try text.withUnsafeBytes { try log.append($0) }
        try log.prepare(ahead: 72 << 20)
        #expect(log.prepared >= 72 << 20)
        try text.withUnsafeBytes { try log.append($0) }
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_size >= 72 << 20)
        let bytes = try readFile(path, limit: 64 << 10)
        #expect(Array(bytes.prefix(2 * text.count)) == text + text)
        #expect(bytes[(2 * text.count)...].allSatisfy { $0 == 0 })
    }
}
