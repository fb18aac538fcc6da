// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import Testing

/// `ProcessIdentity` hashes itself (`_rawHashValue(seed:)`), not through a `Hasher`.
struct ProcessIdentityTests {
    /// Identities that differ in one field only (a recycled pid, a pid reused within one
    /// tick, the same pid and time on another inode) are told apart, equal ones found, in
    /// a table that grows through many reseeded sizes.
    @Test func identitiesAreFoundAndToldApartThroughEveryResize() {
        var table: [ProcessIdentity: Int] = [:]
        var identities: [ProcessIdentity] = []
        for n in 0..<3000 {
            let pid = Int32(2 + n % 1000)
            identities.append(ProcessIdentity(pid: pid, startTime: UInt64(n / 1000), inode: UInt64(n)))
            identities.append(ProcessIdentity(pid: pid, startTime: UInt64(n / 1000), inode: UInt64(n) + 1_000_000))
        }
        for (index, identity) in identities.enumerated() { table[identity] = index }
        #expect(table.count == identities.count)
        #expect(identities.enumerated().allSatisfy { table[$1] == $0 })
        #expect(table[ProcessIdentity(pid: 2, startTime: 9, inode: 0)] == nil)
        let set = Set(identities)
        #expect(set.count == identities.count && identities.allSatisfy(set.contains))
        // Equal identities, equal hashes, also through a `Hasher`.
        let copy = ProcessIdentity(pid: identities[7].pid, startTime: identities[7].startTime, inode: identities[7].inode)
        #expect(copy.hashValue == identities[7].hashValue)
    }

    /// `Wait` hashes itself the same way (looked up after every pass): every case, the same
    /// app's waits of different cases, and different apps' of one case are told apart.
    @Test func waitsAreFoundAndToldApart() {
        let apps = (0..<500).map { ProcessIdentity(pid: Int32(2 + $0), startTime: UInt64($0), inode: UInt64($0)) }
        let waits: [Wait] = apps.flatMap { [.freeze($0), .isolation($0), .thawCheck($0)] }
            + [.stopCheck, .terminationStops, .stateRetry, .stateQuiet, .status, .processEvents, .keepAwake]
        var table: [Wait: Int] = [:]
        for (index, wait) in waits.enumerated() { table[wait] = index }
        #expect(table.count == waits.count)
        #expect(waits.enumerated().allSatisfy { table[$1] == $0 })
        #expect(Wait.freeze(apps[0]).hashValue == Wait.freeze(ProcessIdentity(pid: 2, startTime: 0, inode: 0)).hashValue)
    }
}
