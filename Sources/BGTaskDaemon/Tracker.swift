import BGTaskCore
import BGTaskSystem

/// Process apps whose forks are followed as they happen (containment `tracked`): a process
/// forked by a member is a member, wherever it re-parents afterwards — a double fork or
/// `setsid` does not take it out of the app. Fed by the kernel's process-events connector.
///
/// Events are read in order, and the kernel sends a process's exit before its pid can be
/// reused: a member's pid leaves at its exit, before it can name another process. Each
/// member is kept as the process it was when its fork was read (its pidfd's inode and start
/// time), and only that process is ever handed out. If the kernel drops events (a burst
/// beyond the socket buffer), an exit may be missed and a pid may come to name another
/// process — another user's, another daemon: then every app is followed afresh from its tree
/// (what re-parented meanwhile is lost, and logged), never a stranger signalled.
final class Tracker {
    let events: ProcessEvents
    private var appOf: [Int32: ProcessIdentity] = [:]
    /// Each app's members by pid: the process as named when its fork was read, or `nil` for
    /// one gone by then (a double fork's middle process), kept only so that its own forks,
    /// read after, are followed; its exit, read after those, removes it.
    private var members: [ProcessIdentity: [Int32: ProcessIdentity?]] = [:]
    /// Each followed app's own process, to follow it afresh after a loss.
    private var roots: [ProcessIdentity: Pidfd] = [:]
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

    /// Starts following `app`, whose own process is held by `root`. Events are read first
    /// and the tree walked after: a process that exits between the two is not in the walk,
    /// and one forked meanwhile is in the walk or in an event still to read.
    func follow(_ app: ProcessIdentity, root: Pidfd) {
        drain()
        roots[app] = root
        for pidfd in ProcessTree.members(of: root) { add(pidfd, to: app) }
    }

    /// Stops following `app` (it is gone).
    func stop(_ app: ProcessIdentity) {
        roots[app] = nil
        for pid in (members.removeValue(forKey: app) ?? [:]).keys where appOf[pid] == app { appOf[pid] = nil }
    }

    /// The app's members now (every fork up to this instant read first), each held by a
    /// pidfd just opened and checked to be the process that was forked.
    func members(of app: ProcessIdentity) -> [Pidfd] {
        drain()
        var result: [Pidfd] = []
        for case let (pid, identity?) in members[app] ?? [:] {
            guard let pidfd = try? Pidfd.open(pid: pid), pidfd.startTime == identity.startTime,
                  pidfd.inode == identity.inode else {
                forget(pid)  // exited, its exit event lost: not the process that was forked
                continue
            }
            result.append(pidfd)
        }
        return result
    }

    /// Reads every event waiting.
    func drain() {
        while true {
            let batch: [ProcessEvents.Event]
            do {
                batch = try events.read()
            } catch {
                restart()
                continue  // what is queued after the loss is read on a clean slate
            }
            for event in batch {
                switch event {
                case let .fork(parent, child):
                    // Named now: the child, or, if it is gone and its pid reused, a process whose
                    // pid leaves again at the child's exit, read after this.
                    guard let app = appOf[parent], appOf[child] == nil else { continue }
                    appOf[child] = app
                    members[app, default: [:]][child] = (try? Pidfd.open(pid: child)).map(Self.identity)
                case let .exit(pid):
                    forget(pid)
                }
            }
            return
        }
    }

    /// Events were lost: nothing known can be vouched for. Every app is followed afresh from
    /// its tree.
    private func restart() {
        if !reportedLoss { lost() }
        reportedLoss = true
        appOf = [:]
        members = [:]
        for (app, root) in roots {
            for pidfd in ProcessTree.members(of: root) { add(pidfd, to: app) }
        }
    }

    private func add(_ pidfd: Pidfd, to app: ProcessIdentity) {
        guard appOf[pidfd.pid] == nil else { return }
        appOf[pidfd.pid] = app
        members[app, default: [:]][pidfd.pid] = Self.identity(pidfd)
    }

    private static func identity(_ pidfd: Pidfd) -> ProcessIdentity {
        ProcessIdentity(pid: pidfd.pid, startTime: pidfd.startTime, inode: pidfd.inode)
    }

    private func forget(_ pid: Int32) {
        guard let app = appOf.removeValue(forKey: pid) else { return }
        members[app]?[pid] = nil
    }
}
