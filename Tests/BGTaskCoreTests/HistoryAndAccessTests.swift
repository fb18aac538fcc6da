import BGTaskCore
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
