// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// The model's tables (`ChangeTracked`) hash their keys as one word (`WordKey`).
struct ChangeTrackedTests {
    /// Task ids as the daemon gives them (counted up, ended from the front), and negative
    /// ones: each found, changed, removed and noted once through every resize.
    @Test func taskIDsAreFoundAndNotedThroughEveryResize() {
        var table = ChangeTracked<TaskID, Int>()
        for id in 1...5000 { table[id] = id * 2 }
        table[-7] = 1
        #expect(table.count == 5001 && table.changedCount == 5001)
        #expect((1...5000).allSatisfy { table[$0] == $0 * 2 } && table[-7] == 1 && table[0] == nil && table[5001] == nil)
        table.clearChanges()
        for id in 1...2500 { table[id] = nil }
        table.update(4000) { $0 += 1 }
        #expect(table.peek(4000) { $0 } == 8001)
        #expect(Set(table.changedKeys) == Set(1...2500).union([4000]))
        #expect(table.count == 2501 && Set(table.keys) == Set(2501...5000).union([-7]))
        let before = table.snapshot
        table[4001] = 0
        #expect(before[4001] == 8002 && table[4001] == 0)
    }

    /// Keys written again and again, fewer and more than are looked for along the list
    /// (`scannedChanges`), touched or updated as well as set: each noted once, in the order
    /// first written, and none after `clearChanges()`.
    @Test(arguments: [1, 7, 8, 9, 30])
    func eachKeyWrittenIsNotedOnceInTheOrderFirstWritten(keys: Int) {
        var table = ChangeTracked<TaskID, Int>()
        for round in 0..<3 {
            // Written back to front, so the order noted is not the keys' own.
            for id in (1...keys).reversed() {
                table[id] = round
                table.update(id) { $0 += 1 }
                table.touch(id)
                table.update(id, saved: false) { $0 += 1 }
            }
            for id in 1...keys { table[id] = nil }
            #expect(Array(table.changedKeys) == Array((1...keys).reversed()))
            #expect(table.changedCount == keys && table.hasChanges)
            table.clearChanges()
            #expect(table.changedKeys.isEmpty && !table.hasChanges)
        }
        // Reads and unsaved writes note nothing.
        table[unsaved: 5] = 1
        _ = table.peek(5) { $0 }
        _ = table[5]
        #expect(!table.hasChanges)
    }
}

