// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskSystem
import Dispatch
import Glibc
import Testing
import TestSupport
import Varlink

/// A user manager's subtree for uid 65534, made by the test as systemd delegates one
/// (`/user.slice/user-UID.slice/user@UID.service`, owned by the user), with `count` cgroups
/// the user made in it. Whatever the test made is removed after, deepest first.
///
/// One at a time in the whole test process: suites run side by side, and two of them use
/// uid 65534's (`Intruder`, `SwaySession`); one's removal took the other's empty scope away
/// before its process moved in.
final class DelegatedSubtree {
    let uid: UInt32
    let root: Cgroup
    private var made: [String] = []
    /// This subtree's turn, first of its properties: given back once the subtree is removed,
    /// or as soon as `init` throws.
    private let turn = Turn()

    /// Taken when made, given back when released (on whichever thread: a semaphore).
    private final class Turn {
        static let semaphore = DispatchSemaphore(value: 1)
        init() { Self.semaphore.wait() }
        deinit { Self.semaphore.signal() }
    }

    init(uid: UInt32, cgroups count: Int) throws {
        self.uid = uid
        var path = Cgroup.mountPoint!
        for component in ["user.slice", "user-\(uid).slice", "user@\(uid).service"] {
            path += "/" + component
            if !FileSystem.exists(path) {
                try systemCall("mkdir(\(path))") { mkdir(path, 0o755) }
                made.append(path)
            }
        }
        root = Cgroup(directory: path)
        try systemCall("chown(\(path))") { chown(path, uid, uid) }
        guard count > 0 else { return }
        // The user makes them itself, as any user with a systemd --user can.
        let script = "import os, sys\nfor i in range(\(count / 100 + 1)):\n    for j in range(100):\n        os.makedirs(sys.argv[1] + '/s%d.slice/c%d.slice' % (i, j), exist_ok=True)\n"
        let maker = try Spawned("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups",
                                                    "/usr/bin/python3", "-c", script, path])
        guard try maker.wait(timeout: 120) == 0 else { throw TestFailure("could not make \(count) cgroups as uid \(uid)") }
    }

    deinit {
        removeBelow(root.directory)
        for path in made.reversed() { rmdir(path) }
    }

    private func removeBelow(_ directory: String) {
        guard let dir = opendir(directory) else { return }
        var children: [String] = []
        while let entry = readdir(dir) {
            let name = entryName(entry)
            if entry.pointee.d_type == UInt8(DT_DIR), name != ".", name != ".." { children.append(directory + "/" + name) }
        }
        closedir(dir)
        for child in children {
            removeBelow(child)
            rmdir(child)
        }
    }
}

/// Root's `GetStatus` round trips, one after another on one connection (`connection`, or a
/// new one), while something else goes on: at least `calls` of them, and on until `done` says
/// the load is over. The 99th percentile and the slowest, in milliseconds, and the daemon's
/// largest resident size seen meanwhile (sampled between calls), in KiB.
struct LoadMeasurement {
    var p99: Double
    var max: Double
    var peakKiB: Int
}

func rootStatusLatencies(_ daemon: TestDaemon, on existing: VarlinkConnection? = nil, calls: Int = 200,
                         until done: () -> Bool = { true }) throws -> LoadMeasurement {
    let connection = try existing ?? daemon.connect()
    var latencies: [Double] = []
    var peak = 0
    while latencies.count < calls || !done() {
        peak = max(peak, (try? residentKiB(daemon.process.pid)) ?? 0)
        let start = Clock.monotonicNanoseconds()
        _ = try connection.call("io.bgtaskd.Manager.GetStatus", timeoutMilliseconds: 60_000)
        latencies.append(Double(Clock.monotonicNanoseconds() - start) / 1e6)
    }
    latencies.sort()
    return LoadMeasurement(p99: latencies[min(latencies.count - 1, latencies.count * 99 / 100)], max: latencies.last!, peakKiB: peak)
}

/// What uid 65534 can make the daemon do (the second review): naming units (findings 1 and
/// 10), and the extensions beside this file. The floods, which measure root's latency, are
/// `UnprivilegedFloodTests`.
@Suite(.serialized, .enabled(if: getuid() == 0 && Capabilities.cgroupsWritable,
                             "needs root to run the daemon, make cgroups and setpriv to uid 65534"))
struct UnprivilegedUserTests {
    /// 1, the lookup still works: a unit of the user's own, in its subtree, is found by name.
    @Test func aUsersOwnUnitIsFoundInItsSubtree() throws {
        let subtree = try DelegatedSubtree(uid: Intruder.uid, cgroups: 0)
        let unit = subtree.root.directory + "/app.slice"
        let scope = unit + "/app-test-\(getpid()).scope"
        for path in [unit, scope] { try systemCall("mkdir(\(path))") { mkdir(path, 0o755) } }
        for path in [unit, scope, scope + "/cgroup.procs", scope + "/cgroup.freeze"] {
            try systemCall("chown(\(path))") { chown(path, Intruder.uid, Intruder.uid) }
        }
        let daemon = try TestDaemon()
        let sleeper = try Spawned("/bin/sh", ["-c", "echo $$ > \(scope)/cgroup.procs; exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sleep 600"])
        defer { sleeper.killTree() }
        try waitUntil("the sleeper in its scope as uid 65534") {
            (try? ProcStatus.uids(pid: sleeper.pid))?.real == 65534 && Cgroup.of(pid: sleeper.pid)?.directory == scope
        }
        let (code, output) = try daemon.ctl(["background", "--unit", "app-test-\(getpid()).scope"], asUser: Intruder.uid)
        #expect(code == 0, "\(output)")
        try waitUntil("the scope frozen") { (try? Cgroup(directory: scope).isFrozen()) == true }
        #expect(try daemon.ctl(["terminate", "--unit", "app-test-\(getpid()).scope"], asUser: Intruder.uid).0 == 0)
        try waitUntil("the sleeper gone") { sleeper.hasExited }
    }

    /// 10: whether another user's unit is an app is not the caller's to learn: by name, an
    /// unprivileged caller finds only its own (`NoSuchApp` either way); by path, another
    /// user's unit is `PermissionDenied` either way.
    @Test func anotherUsersUnitIsRefusedAlikeAppOrNot() throws {
        let daemon = try TestDaemon()
        let registered = try TestUnit("app"), plain = try TestUnit("plain")
        let sleepers = try [registered, plain].map { try $0.spawn("echo ready; exec sleep 600") }
        for sleeper in sleepers { try sleeper.expectLine("ready") }
        let (registeredCode, registeredOutput) = try daemon.ctl(["foreground", "--unit", registered.name])
        #expect(registeredCode == 0, "\(registeredOutput)")
        var answers: [String] = []
        for unit in [registered, plain] {
            for name in [unit.name, "/" + unit.name] {
                for verb in [["terminate"], ["expire"], ["tasks"], ["policy"]] {
                    let (code, output) = try daemon.ctl(verb + ["--unit", name], asUser: Intruder.uid)
                    #expect(code != 0, "\(verb) \(name): \(output)")
                    // With thousands of cgroups in uid 65534's subtree (the floods', when run
                    // beside this suite), a search is cut short by the allowance of the second
                    // it falls in, whatever it looks for: the hint says which, not what.
                    answers.append(output.replacingOccurrences(of: unit.name, with: "UNIT")
                        .replacingOccurrences(of: "; try again or give the unit's cgroup path", with: "; try again"))
                }
            }
        }
        let (first, second) = (answers.prefix(answers.count / 2), answers.suffix(answers.count / 2))
        #expect(Array(first) == Array(second), "\(answers)")
        #expect(try daemon.apps().count == 1)
        withExtendedLifetime(sleepers) {}
    }
}
