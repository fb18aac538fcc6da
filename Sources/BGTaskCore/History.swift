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

/// The bounded history of rule 11, shared fairly between users: when it is full, the entry
/// dropped is the oldest of the uid holding the most entries. A user who fills it evicts only
/// its own entries, never another's (root's included).
public struct History: Sendable {
    /// How many entries are kept in all.
    public let capacity: Int
    /// Each uid's entries, oldest first, numbered in the order they were appended.
    private var byUID: [UInt32: [(sequence: UInt64, entry: HistoryEntry)]] = [:]
    private var nextSequence: UInt64 = 0
    public private(set) var count = 0

    public init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    public mutating func append(_ entry: HistoryEntry) {
        if count == capacity, let largest = byUID.max(by: { $0.value.count < $1.value.count })?.key {
            byUID[largest]!.removeFirst()
            if byUID[largest]!.isEmpty { byUID[largest] = nil }
            count -= 1
        }
        byUID[entry.record.uid, default: []].append((nextSequence, entry))
        nextSequence += 1
        count += 1
    }

    /// The entries, oldest first: all of them, or those of `uid`.
    public func entries(ownedBy uid: UInt32? = nil) -> [HistoryEntry] {
        if let uid { return (byUID[uid] ?? []).map(\.entry) }
        return byUID.values.joined().sorted { $0.sequence < $1.sequence }.map(\.entry)
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
