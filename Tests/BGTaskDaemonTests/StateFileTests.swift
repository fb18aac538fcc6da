// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
@testable import BGTaskDaemon
import BGTaskSystem
import Glibc
import TestSupport
import Varlink
import Testing

/// `StateFile.prepareRoom(slice:)`: the room past the log's text prepared a slice per call,
/// the room wanted fixed when a preparation begins.
@Suite struct StateFileTests {
    /// A state file with its first log written (the whole, empty state: the least room
    /// wanted, 256 KiB), in a fresh directory on /dev/shm (a tmpfs, as /run is).
    private func freshStateFile() throws -> (StateFile, String) {
        let path = "/dev/shm/bgtaskd-statefile-test-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        let file = StateFile(directory: try StateDirectory(path: path))
        try file.rewrite(SavedState(), history: [])
        return (file, path)
    }

    private func remove(_ path: String) {
        for name in [StateFile.fileName, StateFile.fileName + ".unreadable", "bgtaskd.lock"] { unlink(path + "/" + name) }
        rmdir(path)
    }

    @Test func theRoomIsPreparedASliceAtATimeUntilItIsAllThere() throws {
        let (file, path) = try freshStateFile()
        defer { remove(path) }
        #expect(file.needsRoom)
        var more: [Bool] = []
        while more.last != false {
            more.append(file.prepareRoom(slice: 64 << 10))
            #expect(file.needsRoom == more.last)
            try #require(more.count <= 8, "still preparing after \(more.count) slices")
        }
        // 256 KiB (the least room) in 64 KiB slices; the log's header shares the first page.
        #expect(more == [true, true, true, true, false] || more == [true, true, true, false])
        #expect(!file.prepareRoom(slice: 64 << 10))
    }

    @Test func aRewriteEndsAPreparationUnderWay() throws {
        let (file, path) = try freshStateFile()
        defer { remove(path) }
        #expect(file.prepareRoom(slice: 64 << 10))
        try file.rewrite(SavedState(), history: [])
        // A new file: its room is wanted afresh (none of it is prepared), and prepared whole.
        #expect(file.needsRoom)
        #expect(!file.prepareRoom())
        #expect(!file.needsRoom)
    }

    /// A termination's grace (a catchable signal's, which runs from the signal), its signal
    /// not sent yet and the processes it was sent to are read back as written; a `SIGKILL`
    /// termination has none of them.
    @Test func aTerminationsGraceIsReadBack() throws {
        let (file, path) = try freshStateFile()
        defer { remove(path) }
        let caught = ProcessIdentity(pid: 100, startTime: 1), killed = ProcessIdentity(pid: 101, startTime: 2)
        let waiting = ProcessIdentity(pid: 102, startTime: 3)
        let child = ProcessIdentity(pid: 4_000_000, startTime: 9_876_543_210, inode: 1 << 40)
        // As many as the model saves, each as long as it gets: within a line's limit.
        let tree = ProcessIdentity(pid: 103, startTime: 4)
        let most = (0..<BackgroundModel.signalledSavedAtMost).map {
            ProcessIdentity(pid: Int32.max - Int32($0), startTime: UInt64(Int64.max), inode: UInt64(Int64.max) - UInt64($0))
        }
        let unit = TerminatedCgroup(path: "/system.slice/app.service", inode: UInt64.max - 1,
                                    invocation: Array("0123456789abcdef0123456789abcdef".utf8) + [0, 255])
        let own = TerminatedCgroup(path: "/user.slice/user-65534.slice/bgtask test", inode: 1 << 40)
        let terminations = [caught: Termination(killAt: .seconds(3), uid: 1000, grace: .milliseconds(2500), signalled: [caught, child],
                                                cgroup: unit),
                            killed: Termination(killAt: .seconds(1), uid: 65534),
                            ProcessIdentity(pid: 104, startTime: 5): Termination(killAt: .seconds(6), uid: 65534, grace: .seconds(6), cgroup: own),
                            waiting: Termination(killAt: .seconds(4), uid: 65534, grace: .seconds(4), unsent: TerminateSignal(parsing: "USR1")),
                            tree: Termination(killAt: .seconds(5), uid: 65534, grace: .seconds(5), signalled: most)]
        for (process, termination) in terminations { file.record(.terminating(process, termination)) }
        _ = try file.flush(liveRecords: 5)
        let loaded = file.load()
        #expect(loaded.problems.isEmpty)
        #expect(loaded.state.terminating == terminations)
    }

    /// A crash can cut the log's last line short (the daemon killed in the middle of an
    /// append's copy): wherever the cut, the file reads back as the whole lines before it —
    /// a line cut short ignored with one problem, never read as another record, never a
    /// trap; a last whole line without its newline read as written. Every kind of record,
    /// with every field a termination saves, cut at every byte.
    @Test func aLogCutAtAnyByteReadsBackAsTheWholeLinesBeforeTheCut() throws {
        let (file, path) = try freshStateFile()
        defer { remove(path) }
        let app = ProcessIdentity(pid: 100, startTime: 1, inode: 7), dying = ProcessIdentity(pid: 101, startTime: 2)
        file.record(.app(SavedApp(identity: app, uid: 1000, command: "a\tb", unit: "/app.service", containment: .unit,
                                  state: .foreground, phase: nil, deadline: nil, transitionDeadline: nil, warned: false)))
        file.record(.task(SavedTask(id: 3, app: app, owner: app, name: "upload \u{1F4E6}", expirationHandler: true,
                                    connectionBound: false, created: .seconds(1), state: .granted, grantAt: .seconds(1), ageWarned: false)))
        file.record(.terminating(dying, Termination(killAt: .seconds(5), uid: 65534, grace: .seconds(4), unsent: TerminateSignal(parsing: "TERM"),
                                                    signalled: [dying, ProcessIdentity(pid: 300, startTime: 9, inode: 1 << 40)],
                                                    cgroup: TerminatedCgroup(path: "/u.slice/a.scope", inode: 42, invocation: [0xab, 0xcd]))))
        file.record(.gone(ProcessIdentity(pid: 102, startTime: 3)))
        file.record(.task(SavedTask(id: 4, app: app, owner: app, name: "x", expirationHandler: false, connectionBound: true,
                                    created: .seconds(2), state: .pending, grantAt: .seconds(3), ageWarned: false)))
        file.record(SavedTaskChange.gone(4))
        file.record(nextTaskID: 5)
        file.record(quota: [(key: "/usr/bin/app", intervals: [QuotaInterval(start: .seconds(1), end: .seconds(2))])])
        file.record(sleep: .seconds(3600))
        file.record(HistoryEntry(realtimeNanoseconds: 1_796_000_000_123_456_789, record: AppActionRecord(
            app: dying, uid: 65534, command: "d", action: .terminated, reason: .tasksEnded, taskNames: ["sync"])))
        _ = try file.flush(liveRecords: 3)
        let whole = file.load()
        try #require(whole.problems.isEmpty, "\(whole.problems)")
        #expect(whole.state.terminating[dying]?.cgroup?.invocation == [0xab, 0xcd] && whole.history.count == 1)
        #expect(whole.state.sleep == .seconds(3600))
        let text = Array(try readFile(path + "/" + StateFile.fileName, limit: 1 << 20).prefix { $0 != 0 })
        try #require(text.count > 600 && text.last == UInt8(ascii: "\n"))

        let cutPath = path + "-cut"
        let cut = StateFile(directory: try StateDirectory(path: cutPath))
        defer { remove(cutPath) }
        func load(_ bytes: ArraySlice<UInt8>) throws -> StateFile.Loaded {
            let descriptor = FileDescriptor(try systemCall("open") { open(cutPath + "/" + StateFile.fileName, O_WRONLY | O_CREAT | O_TRUNC, 0o600) })
            defer { descriptor.close() }
            try descriptor.writeAll(Array(bytes))
            return cut.load()
        }
        let newline = UInt8(ascii: "\n")
        for length in 0...text.count {
            let lineStart = text[..<length].lastIndex(of: newline).map { $0 + 1 } ?? 0
            let lineEnd = text[lineStart...].firstIndex(of: newline) ?? text.count
            let torn = length > lineStart && length < lineEnd
            let read = try load(text[..<length])
            // What it must equal: the whole lines before a torn one; a whole last line with its newline.
            let expected = try load(text[..<(torn ? lineStart : length == lineEnd ? min(lineEnd + 1, text.count) : length)])
            #expect(read.state == expected.state && read.history == expected.history, "cut at \(length) of \(text.count)")
            let extra = torn && lineStart > 0 ? 1 : 0  // a header cut short is the file's one problem, as none
            #expect(read.problems.count == expected.problems.count + extra, "cut at \(length): \(read.problems)")
        }
    }

    /// How long the machine had slept (what the saved requests' and quota's instants count)
    /// is written whole with the state and read back; a negative one is refused.
    @Test func theSleepCountedIsReadBackAndANegativeOneRefused() throws {
        let (file, path) = try freshStateFile()
        defer { remove(path) }
        var state = SavedState()
        state.sleep = .nanoseconds(7_200_000_000_123)
        try file.rewrite(state, history: [])
        #expect(file.load().state.sleep == .nanoseconds(7_200_000_000_123))
        var loaded = StateFile.Loaded()
        #expect(throws: StateFile.Malformed.self) { try StateFile.apply(try JSON.parse(#"{"sleep": -1}"#), to: &loaded) }
        #expect(throws: StateFile.Malformed.self) { try StateFile.apply(try JSON.parse(#"{"sleep": "1h"}"#), to: &loaded) }
        #expect(loaded.state.sleep == nil)
    }

    /// A termination's cgroup is where the daemon writes `cgroup.kill`: a path that leaves
    /// the hierarchy, or is its root, or an invocation not in hex, makes the line malformed.
    @Test(arguments: [
        #"{"path": "/a/../../etc", "ino": 7}"#, #"{"path": "/", "ino": 7}"#, #"{"path": "a/b", "ino": 7}"#,
        #"{"path": "/a//b", "ino": 7}"#, #"{"path": "/a/./b", "ino": 7}"#, #"{"path": "/a\nb", "ino": 7}"#,
        #"{"path": "/a", "ino": "7"}"#, #"{"path": "/a"}"#, #"{"ino": 7}"#,
        #"{"path": "/a", "ino": 7, "invocation": "0g"}"#, #"{"path": "/a", "ino": 7, "invocation": "abc"}"#,
        #"{"path": "/a", "ino": 7, "invocation": "AB"}"#, #"{"path": "/a", "ino": 7, "invocation": 12}"#,
    ])
    func aTerminationsCgroupThatIsNotOneIsMalformed(_ cgroup: String) throws {
        let line = #"{"killAt": 1, "uid": 1000, "grace": 1, "cgroup": "# + cgroup + "}"
        #expect(throws: StateFile.Malformed.self) { try StateFile.termination(try JSON.parse(line)) }
        let good = #"{"killAt": 1, "uid": 1000, "grace": 1, "cgroup": {"path": "/a/b.service", "ino": 7, "invocation": "00ff"}}"#
        #expect(try StateFile.termination(try JSON.parse(good)).cgroup
            == TerminatedCgroup(path: "/a/b.service", inode: 7, invocation: [0, 255]))
    }

    /// A scheduled request's interval is bounded as a submission's is (366 days): one beyond
    /// makes the line malformed — written back, an interval of 2^63 ns trapped the daemon
    /// (`Int64(seconds * 1e9)`) at every start. The bound itself is read and written back exactly.
    @Test(arguments: [Int64.max, -1, 31_622_400_000_000_001])
    func aRequestsIntervalBeyondWhatASubmissionMayAskIsMalformed(_ interval: Int64) throws {
        func line(_ interval: Int64) throws -> JSON {
            try JSON.parse(#"{"key": "u1000:app", "uid": 1000, "lastSeen": 5, "launches": [], "requests": [{"identifier": "r", "kind": "refresh", "earliestBegin": 9, "interval": \#(interval)}]}"#)
        }
        #expect(throws: StateFile.Malformed.self) { try StateFile.requests(try line(interval)) }
        let bound = Int64(TaskRequest.maximumSeconds) * 1_000_000_000
        let (key, book) = try StateFile.requests(try line(bound))
        #expect(book?.requests.first?.interval == .seconds(TaskRequest.maximumSeconds))
        #expect(StateFile.encode(book, key: key)["requests"]?.arrayValue?.first?["interval"]?.intValue == bound)
    }

    /// A command with control characters (the daemon writes none) is escaped again, within
    /// the 64 bytes a command may have: written back, it reads back the same. (Escaped whole,
    /// 64 tabs became 128 bytes, kept at this start and refused — the app with it — at the next.)
    @Test(arguments: [String(repeating: "\t", count: 64), "a\u{1}b", String(repeating: "é\u{7}", count: 21)])
    func aCommandWithControlCharactersReadsBackTheSameOnceWritten(_ command: String) throws {
        let read = try StateFile.command(.string(command))
        #expect(read.utf8.count <= 64 && !read.containsControlCharacters)
        #expect(try StateFile.command(.string(read)) == read)
    }
}

extension StateFileTests {
    /// An app line refused as a whole (a state this daemon does not know, a bad deadline)
    /// keeps its app, in the foreground, when whose process it is reads: dropped, a process
    /// the last daemon stopped stayed stopped with nobody to resume it. One whose process or
    /// uid does not read is dropped, as before; a good line is read whole.
    @Test func anAppLineRefusedKeepsItsAppInTheForegroundIfItsProcessReads() throws {
        func load(_ app: String) -> StateFile.Loaded {
            var loaded = StateFile.Loaded()
            do {
                try StateFile.apply(try JSON.parse(#"{"app": "# + app + "}"), to: &loaded)
            } catch {
                loaded.problems.append("\(error)")
            }
            return loaded
        }
        let process = #""pid": 4242, "start": 77, "ino": 9, "uid": 1000"#
        for bad in [#""command": "app", "state": "hibernating""#, #""command": "app", "state": "suspended", "deadline": "soon""#,
                    #""state": "suspended", "containment": "tracked", "unit": "/a/../b""#] {
            let loaded = load("{" + process + ", " + bad + "}")
            let app = try #require(loaded.state.apps.values.first, "\(bad)")
            #expect(app.identity == ProcessIdentity(pid: 4242, startTime: 77, inode: 9) && app.uid == 1000)
            #expect(app.state == .foreground && app.deadline == nil && app.unit == nil)
            #expect(app.command == (bad.contains("app") ? "app" : "?"))
            #expect(app.containment == (bad.contains("tracked") ? .tracked : .tree))
            #expect(loaded.problems.count == 1 && loaded.problems[0].hasSuffix("app pid 4242 kept, in the foreground"), "\(loaded.problems)")
        }
        for unread in [#"{"pid": 1, "start": 77, "uid": 1000, "state": "x"}"#, #"{"pid": 4242, "start": 77, "state": "x"}"#] {
            let loaded = load(unread)
            #expect(loaded.state.apps.isEmpty && loaded.problems.count == 1 && !loaded.problems[0].contains("kept"))
        }
        let good = load("{" + process + #", "command": "app", "state": "suspended"}"#)
        #expect(good.state.apps.values.first?.state == .suspended && good.problems.isEmpty)
    }
}
