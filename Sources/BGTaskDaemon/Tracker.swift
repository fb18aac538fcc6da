// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Glibc

/// Process apps whose forks are followed as they happen (containment `tracked`): a process
/// forked by a member is a member, wherever it re-parents afterwards — a double fork or
/// `setsid` does not take it out of the app. Fed by the kernel's process-events connector.
///
/// Events are read in order, and the kernel sends a process's exit before its pid can be
/// reused: a member's pid leaves at its exit, before it can name another process. Each
/// member is kept as the process it was when its fork was read (its pidfd's inode and start
/// time), and only that process is ever handed out. If the kernel drops events (a burst
/// beyond the socket buffer), an exit may be missed and a pid may come to name another
/// process — another user's, another daemon: then every member that is provably still the
/// process it was (same pidfs inode and start time) is kept, every app's tree is walked again,
/// and only what re-parented during the loss and is not in a kept member's tree is lost
/// (logged), never a stranger signalled.
///
/// What the connector cannot show: a process the app's own process (or a member that was
/// re-parented, to init or a subreaper) makes with `clone(CLONE_PARENT)` is reported as the
/// child of *its* parent, which is not a member, so it is not followed. Apps that must be
/// contained against that belong in a scope of their own (`IsolateApps=`, containment `scope`).
final class Tracker {
    let events: ProcessEvents
    private var appOf: [Int32: ProcessIdentity] = [:]
    /// Each app's members by pid: the process as named when its fork was read, or `nil` for
    /// one gone by then (a double fork's middle process), kept only so that its own forks,
    /// read after, are followed; its exit, read after those, removes it.
    private var members: [ProcessIdentity: [Int32: ProcessIdentity?]] = [:]
    /// Each followed app's own process, to follow it afresh after a loss.
    private var roots: [ProcessIdentity: Pidfd] = [:]
    /// Members' pidfds, opened when they were named and kept (at most `maximumHeld`): every
    /// action on an app hands out its members, and opening and checking each anew (a pidfd,
    /// `/proc/PID/stat`, a poll) was a fifth of the daemon's time in a session lock. A kept
    /// pidfd is the process that was forked for as long as it lives; one that exited is
    /// dropped at its exit event. Beyond the bound (a fork-happy app: the descriptors are
    /// the daemon's, for everyone) members are opened as they are needed, as before.
    private var held: [Int32: Pidfd] = [:]
    /// 1,024, or a sixteenth of the descriptor limit where that is less.
    let maximumHeld = min(1024, max(16, Host.descriptorLimit / 16))
    /// Called each time the kernel dropped events (a burst beyond the socket buffer).
    let lost: () -> Void
    /// Called for a member that could not be opened for want of descriptors
    /// (`Errno.isShortage`): it is left out of what `members(of:)` hands out, not forgotten.
    var unopened: (Int32) -> Void = { _ in }
    /// Called for each process seen forked into an app, with its parent's pid, as its event
    /// is read: a fork whose event came after the app was stopped is stopped then
    /// (`Enforcer.forked`), since the app's members are this set, not a walk.
    var forked: (ProcessIdentity, Int32, Pidfd) -> Void = { _, _, _ in }
    /// Descriptors kept for a fork read while the daemon has none (the daemon's).
    let reserve: DescriptorReserve
    /// Datagrams read per `drain`: a fork storm cannot hold the loop; the rest wait in the
    /// socket, readable on the next pass.
    static let eventsPerDrain = 16_384

    init(events: ProcessEvents, reserve: DescriptorReserve, lost: @escaping () -> Void) {
        self.events = events
        self.reserve = reserve
        self.lost = lost
    }

    /// Opens the connector (`ProcessEvents.open()`: root or `CAP_NET_ADMIN`, outside containers).
    /// `BGTASKD_PROCESS_EVENTS_BUFFER` (bytes) replaces the receive buffer's size: a test
    /// knob, to make the kernel drop events on purpose.
    static func open(reserve: DescriptorReserve, lost: @escaping () -> Void) throws(Errno) -> Tracker {
        let buffer = Host.environment("BGTASKD_PROCESS_EVENTS_BUFFER").flatMap { Int32($0) }
        let tracker = Tracker(events: try ProcessEvents.open(bufferBytes: buffer ?? ProcessEvents.receiveBufferBytes),
                              reserve: reserve, lost: lost)
        tracker.listen(false)  // until an app is followed
        return tracker
    }

    /// Starts following `app`, whose own process is held by `root`. The kernel is asked for
    /// events first (`listening`), then they are read, and the tree walked after: a process
    /// that exits between the two is not in the walk, and one forked meanwhile is in the walk
    /// or in an event still to read.
    func follow(_ app: ProcessIdentity, root: Pidfd) {
        listen(true)
        drain()
        roots[app] = root
        for pidfd in ProcessTree.members(of: root) { add(pidfd, to: app) }
    }

    /// Called when the kernel could not be asked for events again (the forks of the app
    /// followed then are not seen until a later `follow` succeeds).
    var unheard: (Errno) -> Void = { _ in }

    /// The kernel's events only while an app is followed: with none (no process app, or only
    /// apps in scopes of their own), every fork, exec and exit on the machine woke the daemon
    /// for nothing — measured: an idle daemon with no app spent ~47 µs of CPU and 3 wake-ups
    /// per process started elsewhere (a build's thousands a second).
    func listen(_ listening: Bool) {
        guard listening != events.isListening else { return }
        do {
            try events.listen(listening)
        } catch {
            if listening { unheard(error) }
        }
    }

    /// Whether `app` is followed (its members are this tracker's set).
    func follows(_ app: ProcessIdentity) -> Bool { roots[app] != nil }

    /// Stops following `app` (it is gone).
    func stop(_ app: ProcessIdentity) {
        roots[app] = nil
        for pid in (members.removeValue(forKey: app) ?? [:]).keys where appOf[pid] == app {
            appOf[pid] = nil
            held[pid] = nil
        }
        if roots.isEmpty { listen(false) }
    }

    /// The app's members (with `reading`, every fork up to this instant read first; without,
    /// those read so far), each held by a pidfd kept or just opened and checked to be the
    /// process that was forked. `known`: pids the caller holds already, not handed out.
    func members(of app: ProcessIdentity, excluding known: Set<Int32> = [], reading: Bool = true) -> [Pidfd] {
        if reading { drain() }
        var result: [Pidfd] = []
        for case let (pid, identity?) in members[app] ?? [:] where !known.contains(pid) {
            if let pidfd = held[pid] {
                result.append(pidfd)
                continue
            }
            let pidfd: Pidfd
            do {
                pidfd = try Pidfd.open(pid: pid)
            } catch where error.isShortage {
                // The daemon is out of descriptors (an app with more processes than its
                // limit, every one held for the length of the action): not handed out this
                // time, and kept, to be tried again at the next action.
                unopened(pid)
                continue
            } catch {
                forget(pid)  // gone (its exit event is still to be read)
                continue
            }
            guard pidfd.startTime == identity.startTime, pidfd.inode == identity.inode else {
                forget(pid)  // exited, its exit event lost: not the process that was forked
                continue
            }
            hold(pidfd, of: app)
            result.append(pidfd)
        }
        return result
    }

    /// The app `process` is a tracked member of, if the tracker saw its fork (every event
    /// up to now read first): how a worker that re-parented and calls the daemon at once
    /// is known to be its app's, not an app of its own.
    func app(of process: ProcessIdentity) -> ProcessIdentity? {
        drain()
        guard let app = appOf[process.pid], case let known?? = members[app]?[process.pid],
              known.startTime == process.startTime, known.inode == process.inode else { return nil }
        return app
    }

    /// Reads the events waiting (at most `eventsPerDrain`).
    func drain() {
        while true {
            let batch: [ProcessEvents.Event]
            do {
                batch = try events.read(limit: Self.eventsPerDrain)
            } catch {
                restart()
                continue  // what is queued after the loss is read on the slate kept
            }
            for event in batch {
                switch event {
                case let .fork(parent, child):
                    // Named now: the child, or, if it is gone and its pid reused, a process whose
                    // pid leaves again at the child's exit, read after this.
                    guard let app = appOf[parent], appOf[child] == nil else { continue }
                    appOf[child] = app
                    do {
                        name(child, of: app, parent: parent, try Pidfd.open(pid: child), keeping: true)
                    } catch where error.isShortage {
                        // Out of descriptors (an action on an app with more processes than
                        // the limit): a child not named now would never be handed out. The
                        // reserve's are given back to name it; it is not kept.
                        reserve.withReleased { name(child, of: app, parent: parent, try? Pidfd.open(pid: child), keeping: false) }
                    } catch {
                        name(child, of: app, parent: parent, nil, keeping: false)  // gone already (a double fork's middle process)
                    }
                case let .exit(pid):
                    // A thread other than the leader that calls exec takes over the process:
                    // the old leader's exit is reported, but the process lives on, the same
                    // pidfs inode. Only a process that is gone leaves.
                    if let kept = held[pid] {
                        if !kept.hasExited { continue }
                    } else if let app = appOf[pid], case let known?? = members[app]?[pid], livesOn(known) { continue }
                    forget(pid)
                }
            }
            return
        }
    }

    /// Records a fork's `child` as `app`'s member: the process `pidfd` holds, or, without one,
    /// a process gone by its fork's read. With `keeping`, its pidfd is kept (within the bound).
    private func name(_ child: Int32, of app: ProcessIdentity, parent: Int32, _ pidfd: Pidfd?, keeping: Bool) {
        members[app, default: [:]][child] = pidfd.map(Self.identity)
        guard let pidfd else { return }
        if keeping { hold(pidfd, of: app) }
        forked(app, parent, pidfd)
    }

    /// Whether the member `known` is still there (its exit was a thread's, the process lives
    /// on): a pidfd opened now is the same process and has not exited. Out of descriptors,
    /// the reserve's are given back for the look.
    private func livesOn(_ known: ProcessIdentity) -> Bool {
        func look() throws(Errno) -> Bool {
            let pidfd = try Pidfd.open(pid: known.pid)
            return !pidfd.hasExited && pidfd.inode == known.inode && pidfd.startTime == known.startTime
        }
        do {
            return try look()
        } catch where error.isShortage {
            return reserve.withReleased { (try? look()) ?? false }
        } catch {
            return false
        }
    }

    /// Events were lost: an exit may have been missed, so a pid may name another process now.
    /// Members still provably the process they were (a pidfd opened now shows the same pidfs
    /// inode and start time) are kept; the rest are dropped, and every app's tree, and each
    /// kept member's tree, is walked again.
    private func restart() {
        lost()
        var kept: [ProcessIdentity: [Int32: ProcessIdentity?]] = [:]
        var roots: [Pidfd] = []
        for (app, known) in members {
            for case let (pid, identity?) in known {
                guard let pidfd = try? Pidfd.open(pid: pid), !pidfd.hasExited, pidfd.inode == identity.inode,
                      pidfd.startTime == identity.startTime else { continue }
                kept[app, default: [:]][pid] = identity
                roots.append(pidfd)
            }
        }
        members = kept
        appOf = [:]
        for (app, known) in kept { for pid in known.keys { appOf[pid] = app } }
        held = [:]
        for pidfd in roots { if let app = appOf[pidfd.pid] { hold(pidfd, of: app) } }
        for (app, root) in self.roots {
            for pidfd in ProcessTree.members(of: root) { add(pidfd, to: app) }
        }
        for root in roots {
            guard let app = appOf[root.pid] else { continue }
            for pidfd in ProcessTree.members(of: root) { add(pidfd, to: app) }
        }
    }

    private func add(_ pidfd: Pidfd, to app: ProcessIdentity) {
        guard appOf[pidfd.pid] == nil else { return }
        appOf[pidfd.pid] = app
        members[app, default: [:]][pidfd.pid] = Self.identity(pidfd)
        hold(pidfd, of: app)
    }

    /// Keeps a member's pidfd, within the bound; not an app's own process (the daemon holds
    /// that one already, and `members(of:)` is asked without it).
    private func hold(_ pidfd: Pidfd, of app: ProcessIdentity) {
        guard held.count < maximumHeld, pidfd.pid != app.pid else { return }
        held[pidfd.pid] = pidfd
    }

    private static func identity(_ pidfd: Pidfd) -> ProcessIdentity {
        ProcessIdentity(pid: pidfd.pid, startTime: pidfd.startTime, inode: pidfd.inode)
    }

    private func forget(_ pid: Int32) {
        guard let app = appOf.removeValue(forKey: pid) else { return }
        members[app]?[pid] = nil
        held[pid] = nil
    }
}
