// SPDX-License-Identifier: Apache-2.0
/// A suspension, resumption or termination, with the wall-clock time it was carried out.
public struct HistoryEntry: Equatable, Sendable {
    /// Nanoseconds since the Unix epoch.
    public var realtimeNanoseconds: Int64
    public var record: AppActionRecord

    public init(realtimeNanoseconds: Int64, record: AppActionRecord) {
        self.realtimeNanoseconds = realtimeNanoseconds
        self.record = record
    }
}

/// The bounded history of rule 11, shared fairly between users: when it is full (in entries
/// or in bytes), the entry dropped is the oldest of the uid holding the most. A user who
/// fills it evicts only its own entries, never another's (root's included).
public struct History: Sendable {
    /// How many entries are kept in all.
    public let capacity: Int
    /// How many bytes of names (command, tasks, detail) are kept in all.
    public let maximumBytes: Int
    /// Task names kept per entry; the rest are counted (`bounded`).
    public static let maximumNamesPerEntry = 8
    /// Each uid's entries, oldest first, numbered in the order they were appended.
    private var byUID: [UInt32: Entries] = [:]
    private var bytesByUID: [UInt32: Int] = [:]
    private var nextSequence: UInt64 = 0
    public private(set) var count = 0
    public private(set) var bytes = 0

    public init(capacity: Int, maximumBytes: Int = 1 << 20) {
        precondition(capacity > 0)
        self.capacity = capacity
        self.maximumBytes = maximumBytes
    }

    /// The first `maximumNamesPerEntry` of `names`, and how many more there were: a
    /// termination of an app holding a thousand tasks is one short entry.
    public static func bounded(_ names: [String]) -> [String] {
        guard names.count > maximumNamesPerEntry else { return names }
        return Array(names.prefix(maximumNamesPerEntry)) + ["… and \(names.count - maximumNamesPerEntry) more"]
    }

    /// What an entry costs against `maximumBytes`: its strings, and a little for the rest.
    static func size(of entry: HistoryEntry) -> Int {
        let record = entry.record
        return 64 + record.command.utf8.count + (record.detail?.utf8.count ?? 0) + (record.unit?.utf8.count ?? 0)
            + record.taskNames.reduce(0) { $0 + $1.utf8.count + 8 }
    }

    public mutating func append(_ entry: HistoryEntry) {
        var entry = entry
        entry.record.taskNames = Self.bounded(entry.record.taskNames)
        let size = Self.size(of: entry)
        while count > 0, count >= capacity || bytes + size > maximumBytes {
            let byBytes = bytes + size > maximumBytes
            guard let largest = byBytes ? bytesByUID.max(by: { $0.value < $1.value })?.key
                : byUID.max(by: { $0.value.count < $1.value.count })?.key else { break }
            let dropped = byUID[largest]!.removeFirst()
            bytesByUID[largest, default: 0] -= Self.size(of: dropped.entry)
            bytes -= Self.size(of: dropped.entry)
            if byUID[largest]!.isEmpty {
                byUID[largest] = nil
                bytesByUID[largest] = nil
            }
            count -= 1
        }
        byUID[entry.record.uid, default: Entries()].append((nextSequence, entry))
        bytesByUID[entry.record.uid, default: 0] += size
        nextSequence += 1
        count += 1
        bytes += size
    }

    /// The entries, oldest first: all of them, or those of `uid`.
    public func entries(ownedBy uid: UInt32? = nil) -> [HistoryEntry] {
        if let uid { return (byUID[uid]?.all ?? []).map(\.entry) }
        return byUID.values.flatMap(\.all).sorted { $0.sequence < $1.sequence }.map(\.entry)
    }

    /// One uid's entries: a queue whose oldest is dropped in O(1) (an array's `removeFirst`
    /// moved every entry after it: with the history full, each action of a burst of 10,000
    /// moved a thousand entries).
    private struct Entries {
        private var items: [(sequence: UInt64, entry: HistoryEntry)] = []
        private var head = 0

        var count: Int { items.count - head }
        var isEmpty: Bool { count == 0 }
        var all: ArraySlice<(sequence: UInt64, entry: HistoryEntry)> { items[head...] }

        mutating func append(_ item: (sequence: UInt64, entry: HistoryEntry)) { items.append(item) }

        /// The oldest, gone; the dropped slots are given back once they are half the array.
        mutating func removeFirst() -> (sequence: UInt64, entry: HistoryEntry) {
            let first = items[head]
            head += 1
            if head >= 32, head * 2 >= items.count {
                items.removeFirst(head)
                head = 0
            }
            return first
        }
    }

    /// Every entry, oldest first.
    public var entries: [HistoryEntry] { entries() }
}

/// Who may do what (DESIGN.md §3), decided from kernel-reported credentials only.
public struct AccessPolicy: Sendable {
    /// The gid of `ManagerGroup`, if one is configured and exists.
    public var managerGID: UInt32?

    public init(managerGID: UInt32?) { self.managerGID = managerGID }

    /// Root and `ManagerGroup` members see and manage every app.
    public func isPrivileged(uid: UInt32, gid: UInt32, groups: [UInt32]) -> Bool {
        if uid == 0 { return true }
        guard let managerGID else { return false }
        return gid == managerGID || groups.contains(managerGID)
    }

    /// Whether the caller may change, terminate, or see the app owned by `appUID`.
    public func mayManage(appUID: UInt32, uid: UInt32, gid: UInt32, groups: [UInt32]) -> Bool {
        appUID == uid || isPrivileged(uid: uid, gid: gid, groups: groups)
    }
}
