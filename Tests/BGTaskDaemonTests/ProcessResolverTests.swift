// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
@testable import BGTaskDaemon
@testable import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// How a connection's peer is named: by its pidfd and start time, with the ancestors the
/// model looks for its app among — none for a process that is an app already.
@Suite struct ProcessResolverTests {
    /// A connection whose peer is `pid` (by `SO_PEERCRED`'s pid, as on kernels without
    /// `SO_PEERPIDFD`), on a socket pair of the test's own.
    static func connection(peer pid: Int32) throws -> (Connection, FileDescriptor) {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw Errno(errno, "socketpair")
        }
        let connection = Connection(id: ConnectionID(1), socket: FileDescriptor(fds[0]),
                                    credentials: PeerCredentials(pid: pid, uid: getuid(), gid: getgid(), groups: []),
                                    peerPidfd: nil, maximumMessageBytes: 1 << 16, account: UserAccount())
        return (connection, FileDescriptor(fds[1]))
    }

    /// A child of the test's: its ancestors start with the test process (same uid), walked
    /// for a peer that is no app; a peer the model knows as an app walks none (nothing above
    /// an app can contain it, `BackgroundModel.app(containing:)`), and is named the same.
    @Test func aPeerThatIsAnAppWalksNoAncestors() throws {
        let child = try Spawned("/bin/sleep", ["60"])
        let (connection, _) = try Self.connection(peer: child.pid)
        let resolver = ProcessResolver()
        let walked = try resolver.resolvePeer(of: connection)
        #expect(walked.description.identity.pid == child.pid)
        #expect(walked.description.ancestors.first?.pid == getpid())
        var asked: [ProcessIdentity] = []
        let known = try resolver.resolvePeer(of: connection) { identity in
            asked.append(identity)
            return identity == walked.description.identity
        }
        #expect(asked == [walked.description.identity])
        #expect(known.description.ancestors.isEmpty)
        #expect(known.description.identity == walked.description.identity)
        #expect(known.description.command == walked.description.command && known.description.uid == walked.description.uid)
    }

    /// The walk up stops at the first parent of another uid (a process of another uid is
    /// never part of an app, DESIGN.md §3): uid 65534's `sleep` under its shell under the
    /// test (root) has the shell alone above it; each parent's uid read from its pidfd.
    @Test(.enabled(if: getuid() == 0, "needs root: setpriv to uid 65534"))
    func theWalkUpStopsAtAParentOfAnotherUID() throws {
        let shell = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups",
                                                     "/bin/sh", "-c", "sleep 60 & echo ready; wait"])
        defer { shell.killTree() }
        try shell.expectLine("ready")
        var sleeper: Int32 = 0
        try waitUntil("the shell's child") {
            sleeper = processTree(of: shell.pidfd).dropFirst().first?.pid ?? 0
            return sleeper > 0
        }
        let resolved = try ProcessResolver().resolve(pid: sleeper)
        #expect(resolved.description.uid == 65534)
        #expect(resolved.description.ancestors.map(\.pid) == [shell.pid])
        #expect(resolved.description.ancestors.first?.startTime == shell.pidfd.startTime)
        // Root's own child is walked up through the test process, root's too.
        let rootsChild = try Spawned("/bin/sleep", ["60"])
        #expect(try ProcessResolver().resolve(pid: rootsChild.pid).description.ancestors.first?.pid == getpid())
    }
}
