// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

@Suite struct HistoryAndAccessTests {
    func entry(_ n: Int) -> HistoryEntry {
        HistoryEntry(realtimeNanoseconds: Int64(n), record: AppActionRecord(
            app: ProcessIdentity(pid: Int32(n), startTime: 1), uid: 0, command: "c", action: .suspended,
            reason: .tasksEnded, taskNames: []))
    }

    @Test func historyDropsTheOldestAtTheBound() {
        var history = History(capacity: 3)
        for n in 1...2 { history.append(entry(n)) }
        #expect(history.entries.map(\.realtimeNanoseconds) == [1, 2])
        for n in 3...7 { history.append(entry(n)) }
        #expect(history.entries.map(\.realtimeNanoseconds) == [5, 6, 7])
        #expect(history.count == 3)
    }

    /// Finding 8 of the second review: an entry keeps 8 task names and a count, and the
    /// history is bounded in bytes too; a user filling it with long names evicts only its own.
    @Test func historyIsBoundedInNamesPerEntryAndInBytes() {
        var history = History(capacity: 1024, maximumBytes: 64 << 10)
        history.append(entry(0))  // root's
        let names = (0..<1000).map { String(repeating: "n", count: 250) + "\($0)" }
        for n in 1...700 {
            history.append(HistoryEntry(realtimeNanoseconds: Int64(n), record: AppActionRecord(
                app: ProcessIdentity(pid: Int32(n), startTime: 1), uid: 65534, command: "hog", action: .terminated,
                reason: .manager, taskNames: names)))
        }
        let last = history.entries.last!.record.taskNames
        #expect(last.count == History.maximumNamesPerEntry + 1 && last.last == "… and 992 more")
        #expect(history.bytes <= 64 << 10)
        #expect(history.entries.first?.record.uid == 0)
    }

    @Test mutating func aTerminationNamesAtMostEightTasks() throws {
        var harness = ModelHarness()
        let app = try harness.app()
        for n in 0..<1000 { try harness.begin(app, "task \(n)") }
        harness.at(1)
        try harness.model.terminate(app, at: harness.now, effects: &harness.effects)
        let names = harness.take().compactMap { if case let .act(record, _) = $0 { record.taskNames } else { nil } }.first
        #expect(names?.count == 9 && names?.first == "task 0" && names?.last == "… and 992 more")
    }

    @Test func accessFollowsUidAndManagerGroup() {
        let none = AccessPolicy(managerGID: nil)
        #expect(none.mayManage(appUID: 1000, uid: 0, gid: 0, groups: []))
        #expect(none.mayManage(appUID: 1000, uid: 1000, gid: 1000, groups: []))
        #expect(!none.mayManage(appUID: 1000, uid: 1001, gid: 1001, groups: [50]))
        let group = AccessPolicy(managerGID: 50)
        #expect(group.mayManage(appUID: 1000, uid: 1001, gid: 1001, groups: [50]))
        #expect(group.mayManage(appUID: 1000, uid: 1001, gid: 50, groups: []))
        #expect(!group.isPrivileged(uid: 1001, gid: 1001, groups: [51]))
    }
}
