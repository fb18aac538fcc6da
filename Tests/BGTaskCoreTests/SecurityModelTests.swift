// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// What an unprivileged user can make the model do, proved with explicit instants.
@Suite struct SecurityModelTests {
    /// Issue item 6: events about an app the model has already removed still name its owner.
    @Test func eventsOfARemovedAppCarryItsOwner() throws {
        var h = ModelHarness()
        let app = try h.model.register(h.process(pid: 100, uid: 0), at: h.now, effects: &h.effects)
        let id = try h.begin(app)
        h.at(0.1)
        _ = h.take()
        try h.model.terminate(app, at: h.now, effects: &h.effects)
        let effects = h.take()
        #expect(h.model.snapshot(of: app, at: h.now) == nil)
        let ended = effects.compactMap { if case let .taskChanged(task) = $0 { task } else { nil } }
        #expect(ended.map(\.id) == [id] && ended.allSatisfy { $0.uid == 0 })
        let owners = effects.compactMap { if case let .act(record, _) = $0 { record.uid } else { nil } }
        #expect(owners == [0])

        // The same for a user's app: never a default uid, never "everyone".
        var u = ModelHarness()
        let userApp = try u.app()
        u.at(0)
        _ = try u.begin(userApp)
        u.at(0.1)
        try u.background(userApp)
        u.at(25.1)  // warned
        u.at(40)  // the task is held past the deadline: terminated, its task expired
        let events = u.take()
        #expect(events.contains { if case .lifecycle(_, 1000, .taskExpired) = $0 { true } else { false } })
        #expect(events.allSatisfy { if case let .lifecycle(_, uid, _) = $0 { uid == 1000 } else { true } })
        #expect(events.allSatisfy { if case let .taskChanged(task) = $0 { task.uid == 1000 } else { true } })
    }

    /// Item 5: a process of another uid is never part of an app, even below its process.
    @Test func aProcessOfAnotherUIDIsAnAppOfItsOwn() throws {
        var h = ModelHarness()
        let rootApp = try h.model.register(h.process(pid: 100, uid: 0), at: h.now, effects: &h.effects)
        let child = h.process(pid: 101, ancestors: [rootApp], uid: 65534)
        #expect(h.model.app(containing: child) == nil)
        let childApp = try h.model.register(child, at: h.now, effects: &h.effects)
        #expect(childApp == child.identity && childApp != rootApp)
        let id = try h.begin(childApp)
        #expect(throws: BGTaskError.noSuchTask(id)) { try h.end(id, in: rootApp) }
        #expect(h.model.listTasks(of: rootApp, at: h.now).isEmpty)
        // A same-uid child still belongs to its parent's app.
        #expect(h.model.app(containing: h.process(pid: 102, ancestors: [rootApp], uid: 0)) == rootApp)
    }

    /// Item 3: per-user limits, with root and managers still able to act.
    @Test func perUserLimitsLeaveRoomForRootAndManagers() throws {
        var h = ModelHarness { $0.maxApps = 32; $0.maxAppsPerUser = 2; $0.maxTasksPerUser = 3 }
        let first = try h.model.register(h.process(pid: 100), at: h.now, effects: &h.effects)
        _ = try h.model.register(h.process(pid: 101), at: h.now, effects: &h.effects)
        #expect(throws: BGTaskError.limitExceeded("MaxAppsPerUser=2 reached for uid 1000")) {
            _ = try h.model.register(h.process(pid: 102), at: h.now, effects: &h.effects)
        }
        // Root's own apps and a privileged manager's requests are not held to it.
        _ = try h.model.register(h.process(pid: 103, uid: 0), at: h.now, effects: &h.effects)
        _ = try h.model.register(h.process(pid: 104), privileged: true, at: h.now, effects: &h.effects)
        for _ in 0..<3 { try h.begin(first) }
        #expect(throws: BGTaskError.limitExceeded("MaxTasksPerUser=3 reached for uid 1000")) { try h.begin(first) }
        #expect(h.model.taskCount(ownedBy: 1000) == 3 && h.model.appCount(ownedBy: 1000) == 3)

        // MaxApps less the reserve for users; the reserve for root and ManagerGroup.
        var g = ModelHarness { $0.maxApps = 32; $0.maxAppsPerUser = 100 }
        for pid in Int32(200)..<230 { _ = try g.model.register(g.process(pid: pid, uid: UInt32(pid)), at: g.now, effects: &g.effects) }
        #expect(throws: BGTaskError.self) { _ = try g.model.register(g.process(pid: 300, uid: 5), at: g.now, effects: &g.effects) }
        _ = try g.model.register(g.process(pid: 301, uid: 0), at: g.now, effects: &g.effects)
        _ = try g.model.register(g.process(pid: 302, uid: 5), privileged: true, at: g.now, effects: &g.effects)
        #expect(throws: BGTaskError.limitExceeded("MaxApps=32 reached")) {
            _ = try g.model.register(g.process(pid: 303, uid: 0), at: g.now, effects: &g.effects)
        }
    }

    /// Item 3: one user filling the history evicts only its own entries.
    @Test func historyKeepsEveryUsersShare() {
        var history = History(capacity: 8)
        func entry(_ uid: UInt32, _ n: Int64) -> HistoryEntry {
            HistoryEntry(realtimeNanoseconds: n, record: AppActionRecord(app: ProcessIdentity(pid: 10, startTime: 1), uid: uid,
                                                                        command: "x", action: .suspended, reason: .tasksEnded, taskNames: []))
        }
        history.append(entry(0, 1))
        history.append(entry(42, 2))
        for n in 3...1000 { history.append(entry(65534, Int64(n))) }
        #expect(history.count == 8)
        #expect(history.entries(ownedBy: 0).map(\.realtimeNanoseconds) == [1])
        #expect(history.entries(ownedBy: 42).map(\.realtimeNanoseconds) == [2])
        #expect(history.entries(ownedBy: 65534).map(\.realtimeNanoseconds) == Array(995...1000))
        #expect(history.entries.map(\.realtimeNanoseconds) == [1, 2] + Array(995...1000))
    }

    /// Item 2: listings are filtered by owner before they are built.
    @Test func listingsShowACallerItsOwnOnly() throws {
        var h = ModelHarness()
        let mine = try h.model.register(h.process(pid: 100, uid: 65534), at: h.now, effects: &h.effects)
        let root = try h.model.register(h.process(pid: 101, uid: 0), at: h.now, effects: &h.effects)
        try h.begin(mine)
        try h.begin(root)
        #expect(h.model.listTasks(ownedBy: 65534, at: h.now).map(\.app) == [mine])
        #expect(h.model.listTasks(of: root, ownedBy: 65534, at: h.now).isEmpty)
        #expect(h.model.listApps(ownedBy: 65534, at: h.now).map(\.identity) == [mine])
        #expect(h.model.stateCounts(ownedBy: 65534) == [.foreground: 1])
    }

    /// Item 9: names are printed escaped, like systemd's cescape().
    @Test(arguments: [
        ("plain name", "plain name"), ("\u{1b}[2J", "\\x1b[2J"), ("x\n<0>FAKE", "x\\n<0>FAKE"),
        ("tab\there", "tab\\there"), ("back\\slash", "back\\\\slash"), ("\u{7f}\u{85}", "\\x7f\\x85"),
        ("ünïcödé", "ünïcödé"), ("line\u{2028}sep", "line\\u2028sep"),
    ])
    func namesAreEscaped(_ raw: String, _ escaped: String) {
        #expect(raw.cEscaped == escaped)
        #expect(!raw.cEscaped.unicodeScalars.contains { $0.value < 0x20 })
    }
}

/// Journal MESSAGE_IDs are a contract: `journalctl MESSAGE_ID=` queries must keep working.
@Suite struct LogMessageIDTests {
    @Test func theTableIsPinned() {
        let pinned: [LogKind: String] = [
            .appRegistered: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a01", .appBackgrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a02",
            .appForegrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a03", .appExited: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a04",
            .appSuspended: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a05", .appResumed: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a06",
            .appTerminated: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a07", .taskGranted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a08",
            .taskDenied: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a09", .taskWarned: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0a",
            .taskExpired: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0b", .taskEnded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0c",
            .taskAgeWarning: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0d", .appExpired: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0e",
            .appIsolated: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0f", .appWoken: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a10",
            .requestSubmitted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a11", .requestLaunched: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a12",
            .requestCompleted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a13",
        ]
        #expect(LogKind.allCases.count == pinned.count, "a new kind needs a new, fixed ID here")
        for kind in LogKind.allCases {
            #expect(kind.messageID == pinned[kind], "\(kind)")
            #expect(kind.messageID.count == 32 && kind.messageID.allSatisfy(\.isHexDigit))
        }
        #expect(Set(LogKind.allCases.map(\.messageID)).count == LogKind.allCases.count)
    }
}

/// The log lines a burst writes one of per app (written in place, `TextAssembly`), pinned
/// as a reader of the journal sees them.
@Suite struct LogLineTests {
    @Test func backgroundAndWarningLinesReadAsSentences() throws {
        var harness = ModelHarness()
        let app = try harness.app(pid: 4_194_304)
        let name = "sync \"émoji 😀\" " + String(repeating: "x", count: 200)
        let id = try harness.begin(app, name)
        let bare = try harness.model.beginTask(in: app, owner: app, name: "bare", expirationHandler: false, connection: nil,
                                               at: harness.now, effects: &harness.effects).id
        harness.at(0.1)  // granted after its 50 ms latency
        try harness.background(app)
        harness.finishTransition(app)
        harness.at(25.1)  // backgrounded at 0.1 s, 30 s budget, warned 5 s before
        let lines = harness.take().compactMap { if case let .log(entry) = $0 { entry.message } else { nil } }
        #expect(lines.contains("App pid 4194304 (app4194304) entered the background with 30s of background time"))
        #expect(lines.contains("Task \(id) (\(name)) of pid 4194304 expires in 5s"))
        #expect(lines.contains("Task \(bare) (bare) of pid 4194304 expires in 5s; it has no expiration handler"))
    }
}
