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
        for name in [StateFile.fileName, "bgtaskd.lock"] { unlink(path + "/" + name) }
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
}
