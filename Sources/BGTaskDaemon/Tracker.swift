import BGTaskCore
import BGTaskSystem

/// Process apps whose forks are followed as they happen (containment `tracked`): a process
/// forked by a member is a member, wherever it re-parents afterwards — a double fork or
/// `setsid` does not take it out of the app. Fed by the kernel's process-events connector.
///
/// Pids only: by the time the daemon acts, the enforcer holds each member by pidfd and
/// checks it as it does a tree's. A pid leaves at its exit event, which the kernel sends
/// before the pid can be reused, and events are read in order.
final class Tracker {
    let events: ProcessEvents
    private var appOf: [Int32: ProcessIdentity] = [:]
    private var members: [ProcessIdentity: Set<Int32>] = [:]
    /// Called once when the kernel dropped events (a burst beyond the socket buffer).
    let lost: () -> Void
    private var reportedLoss = false

    init(events: ProcessEvents, lost: @escaping () -> Void) {
        self.events = events
        self.lost = lost
    }

    /// Opens the connector (`ProcessEvents.open()`: root or `CAP_NET_ADMIN`, outside containers).
    static func open(lost: @escaping () -> Void) throws(Errno) -> Tracker {
        Tracker(events: try ProcessEvents.open(), lost: lost)
    }

    /// Starts following `app`, whose processes are `current` now.
    func follow(_ app: ProcessIdentity, current: [Int32]) {
        drain()
        for pid in current where appOf[pid] == nil {
            appOf[pid] = app
            members[app, default: []].insert(pid)
        }
    }

    /// Stops following `app` (it is gone).
    func stop(_ app: ProcessIdentity) {
        for pid in members.removeValue(forKey: app) ?? [] where appOf[pid] == app { appOf[pid] = nil }
    }

    /// The app's members known now (every fork up to this instant read first).
    func members(of app: ProcessIdentity) -> Set<Int32> {
        drain()
        return members[app] ?? []
    }

    /// Reads every event waiting.
    func drain() {
        let batch: [ProcessEvents.Event]
        do {
            batch = try events.read()
        } catch {
            if !reportedLoss { lost() }
            reportedLoss = true
            return
        }
        for event in batch {
            switch event {
            case let .fork(parent, child):
                guard let app = appOf[parent] else { continue }
                appOf[child] = app
                members[app, default: []].insert(child)
            case let .exit(pid):
                guard let app = appOf.removeValue(forKey: pid) else { continue }
                members[app]?.remove(pid)
            }
        }
    }
}
