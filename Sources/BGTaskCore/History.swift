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

/// The bounded history of rule 11: the oldest entries are dropped first.
public struct History: Sendable {
    /// How many entries are kept.
    public let capacity: Int
    private var ring: [HistoryEntry] = []
    private var head = 0

    public init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    public mutating func append(_ entry: HistoryEntry) {
        if ring.count < capacity {
            ring.append(entry)
        } else {
            ring[head] = entry
            head = (head + 1) % capacity
        }
    }

    /// The entries, oldest first.
    public var entries: [HistoryEntry] { Array(ring[head...] + ring[..<head]) }
    public var count: Int { ring.count }
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
