// SPDX-License-Identifier: Apache-2.0
import BGTaskCore

/// The `Monitor` streams, kept by whose events each may have: a privileged caller's (root,
/// `ManagerGroup`) every app's, another caller's its own uid's. An event is offered to
/// the monitors that may have it and no others, and the model lists task changes only for
/// the owners they may see (`owners`), so one user's monitors cost nothing to another
/// user's calls: uid 65534's one monitor had every user's calls list their task changes
/// (~2,800 instructions a call more, callgrind), and its 256 (its connection limit) were
/// each checked for every event of every app (root's Begin+End pair ~20% slower, by hand).
struct Monitors {
    /// Monitors of every app's events, in the order they began.
    private var everyone: [ConnectionID] = []
    /// Monitors of one uid's events, in the order they began.
    private var byUID: [UInt32: [ConnectionID]] = [:]

    var isEmpty: Bool { everyone.isEmpty && byUID.isEmpty }

    /// Whose tasks' changes the model lists for these monitors.
    var owners: MonitoredOwners {
        !everyone.isEmpty ? .everyone : byUID.isEmpty ? .nobody : .some(Set(byUID.keys))
    }

    /// Adds a monitor of `uid`'s events, or of everyone's (`nil`).
    mutating func add(_ id: ConnectionID, seeing uid: UInt32?) {
        if let uid { byUID[uid, default: []].append(id) } else { everyone.append(id) }
    }

    /// Removes the monitor of a caller of `uid`, whichever events it had.
    mutating func remove(_ id: ConnectionID, uid: UInt32) {
        everyone.removeAll { $0 == id }
        byUID[uid]?.removeAll { $0 == id }
        if byUID[uid]?.isEmpty == true { byUID[uid] = nil }
    }

    /// Every monitor, in the order they began.
    var all: [ConnectionID] { (everyone + byUID.values.joined()).sorted { $0.rawValue < $1.rawValue } }

    /// The monitors that may have an event of an app owned by `uid`.
    func seeing(_ uid: UInt32, _ body: (ConnectionID) -> Void) {
        for id in everyone { body(id) }
        if let own = byUID[uid] { for id in own { body(id) } }
    }
}
