// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// Turns a calling or named process into a `ProcessDescription` the model can use, holding
/// a pidfd for it. Refuses pid 1, the daemon itself and kernel threads (rule 1).
struct ProcessResolver {
    let ownPID = Host.pid
    /// The daemon's own unit, never an app (`nil` outside one).
    let ownUnit = Cgroup.of(pid: Host.pid).flatMap { AppUnit.of(cgroupPath: $0.path, daemonUnit: nil) }
    /// Ancestor walks stop here; real trees are far shallower.
    static let maximumDepth = 128

    /// A resolved process and the pidfd that proves its identity.
    struct Resolved {
        var description: ProcessDescription
        var pidfd: Pidfd
    }

    /// The peer of `connection`, by `SO_PEERPIDFD` (or, on kernels without it, by the pid
    /// from `SO_PEERCRED` checked against its start time).
    /// `isApp` as for `resolve(pid:isApp:)`: an app's second connection (the libraries open
    /// two or three) walks no ancestors, which were most of a connection's cost (a shell
    /// four deep: ~60 of its ~90 system calls).
    func resolvePeer(of connection: Connection, isApp: (ProcessIdentity) -> Bool = { _ in false }) throws(BGTaskError) -> Resolved {
        let pidfd: Pidfd
        if let peer = connection.peerPidfd {
            pidfd = peer
        } else {
            do { pidfd = try Pidfd.open(pid: connection.credentials.pid) } catch { throw refusal(connection.credentials.pid, error) }
        }
        return try describe(pidfd, uid: connection.credentials.uid, isApp: isApp)
    }

    /// The process with `pid`, named by a manager. `isApp` says whether an identity is a
    /// registered process app already: then its ancestors are not walked (nothing above an
    /// app can contain it).
    func resolve(pid: Int32, isApp: (ProcessIdentity) -> Bool = { _ in false }) throws(BGTaskError) -> Resolved {
        guard pid > 1 else { throw .invalidParameter("pid \(pid) cannot be managed") }
        let pidfd: Pidfd
        do { pidfd = try Pidfd.open(pid: pid) } catch { throw refusal(pid, error) }
        let uid: UInt32
        do { uid = try ProcStatus.effectiveUID(pid: pid) } catch { throw refusal(pid, error) }
        return try describe(pidfd, uid: uid, isApp: isApp)
    }

    private func refusal(_ pid: Int32, _ error: Errno) -> BGTaskError {
        error.isNoSuchProcess ? .noSuchApp(pid) : .invalidParameter("pid \(pid): \(error)")
    }

    private func describe(_ pidfd: Pidfd, uid: UInt32, isApp: (ProcessIdentity) -> Bool = { _ in false }) throws(BGTaskError) -> Resolved {
        let pid = pidfd.pid
        guard pid > 1 else { throw .invalidParameter("pid \(pid) cannot be managed") }
        guard pid != ownPID else { throw .invalidParameter("pid \(pid) is bgtaskd itself") }
        let stat: ProcStat
        do { stat = try ProcStat.read(pid: pid) } catch { throw refusal(pid, error) }
        guard stat.startTime == pidfd.startTime else { throw .noSuchApp(pid) }
        guard !stat.isKernelThread else {
            throw .invalidParameter("pid \(pid) is a kernel thread")
        }
        let identity = ProcessIdentity(pid: pid, startTime: stat.startTime, inode: pidfd.inode)
        // The name is the process's own choice (PR_SET_NAME): escaped once, here, it is safe
        // in every table, event and log line.
        let unit = Cgroup.of(pid: pid).flatMap { AppUnit.of(cgroupPath: $0.path, daemonUnit: ownUnit) }
        let description = ProcessDescription(identity: identity, uid: uid, command: stat.command.cEscaped,
                                             ancestors: isApp(identity) ? [] : ancestors(of: stat, uid: uid), unit: unit)
        return Resolved(description: description, pidfd: pidfd)
    }

    /// Parent first, up to (not including) pid 1, and only while they run as `uid`: a
    /// process of another uid is never part of an app (DESIGN.md §3), so a child that
    /// switched user cannot act for its parent's app. A parent that started after its child
    /// is a recycled pid read mid-race; the walk stops there. Each is named as the model
    /// names apps, by a pidfd held while its start time is read.
    func ancestors(of stat: ProcStat, uid: UInt32) -> [ProcessIdentity] {
        var result: [ProcessIdentity] = []
        var current = stat
        // Each parent's state read once, with its pidfd held (`openReading`), and its uid from
        // the pidfd: 8 system calls a parent where reading its stat twice and its status by
        // path were 13.
        while current.parentPID > 1, result.count < Self.maximumDepth,
              let (pidfd, parent) = try? Pidfd.openReading(pid: current.parentPID), parent.startTime <= current.startTime,
              pidfd.uids?.effective == uid {
            result.append(ProcessIdentity(pid: parent.pid, startTime: parent.startTime, inode: pidfd.inode))
            current = parent
        }
        return result
    }
}
