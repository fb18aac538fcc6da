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
}
