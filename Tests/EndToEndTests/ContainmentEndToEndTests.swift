// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// A cgroup the test makes, named like a systemd scope so that the daemon takes it for a unit
/// of its own (as it would `systemd-run --scope`'s). When the test ends, whatever is left in
/// it (processes the test started) is killed and the cgroup removed.
final class TestUnit {
    let name: String
    let cgroup: Cgroup

    init(_ label: String) throws {
        name = "bgtaskd-test-\(getpid())-\(label).scope"
        cgroup = Cgroup(directory: Cgroup.mountPoint! + "/" + name)
        try systemCall("mkdir(\(cgroup.directory))") { mkdir(cgroup.directory, 0o755) }
    }

    /// Runs `script` with `/bin/sh` inside the unit.
    func spawn(_ script: String) throws -> Spawned {
        try Spawned("/bin/sh", ["-c", "echo $$ > \(cgroup.directory)/cgroup.procs; " + script])
    }

    /// Runs `command` inside the unit, its arguments as they are (no shell quoting).
    func spawn(_ command: [String]) throws -> Spawned {
        try Spawned("/bin/sh", ["-c", "echo $$ > \(cgroup.directory)/cgroup.procs; exec \"$@\"", "sh"] + command)
    }

    /// The processes in the unit, each held by a pidfd.
    func members() throws -> [Pidfd] {
        try cgroup.processes().compactMap { try? Pidfd.open(pid: $0) }
    }

    deinit {
        try? cgroup.setFrozen(false)
        try? cgroup.kill()
        try? waitUntil("\(name) empty") { try cgroup.processes().isEmpty }
        rmdir(cgroup.directory)
    }
}

/// Apps that cannot escape (DESIGN.md §2a): a unit app is its whole cgroup, whatever the
/// parent of each process — double-forked and `setsid` workers included — named by unit by
/// managers. Cgroups are made by the tests, named like scopes; no systemd is needed.
@Suite(.serialized, .enabled(if: Capabilities.cgroupsWritable, "needs a writable cgroup v2 hierarchy (root)"))
struct ContainmentEndToEndTests {
    /// A double-forked worker and a `setsid` one, both re-parented out of the app's tree.
    static let workers = "(sleep 600 &); (setsid sleep 600 &); "

    static func isRunning(_ pid: Int32) -> Bool { !["T", "t", "Z", "X"].contains(processState(pid)) }

    /// A three-process app in `unit` that never calls the daemon: a sleeper and its two
    /// escaped workers, each held by a pidfd.
    static func sleeperWithWorkers(in unit: TestUnit) throws -> (Spawned, [Pidfd]) {
        let app = try unit.spawn(workers + "echo ready; exec sleep 600")
        try app.expectLine("ready")
        try waitUntil("three processes in the unit") { try unit.cgroup.processes().count == 3 }
        return (app, try unit.members())
    }

    @Test func escapedWorkersOfAUnitAppAreFrozenThawedAndKilledWithIt() throws {
        let unit = try TestUnit("escape")
        let daemon = try TestDaemon(["BackgroundTimeSec=1s", "ExpirationWarningSec=0"])
        let probe = try Probe(process: try unit.spawn(Self.workers + "exec \(Binaries.path("bgtask-probe")) --socket \(daemon.socketPath)"))
        try waitUntil("the probe and two workers in the unit") { try unit.cgroup.processes().count == 3 }
        let members = try unit.members()
        #expect(ProcessTree.members(of: members.first { $0.pid == probe.pid }!).count == 1)  // the workers left its tree
        try probe.call("remaining")  // registers the app
        let app = try #require(try daemon.app(probe.pid))
        #expect(app["unit"]?.stringValue == unit.name && app["containment"] == "unit")

        try daemon.setState(probe.pid, "background")
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        #expect(members.allSatisfy { Cgroup.of(pid: $0.pid) == unit.cgroup })
        try daemon.setState(probe.pid, "foreground")
        try waitUntil("the unit thawed") { try !unit.cgroup.isFrozen() }
        try waitUntil("every process running") { members.allSatisfy { Self.isRunning($0.pid) } }

        _ = try probe.begin("held")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        try daemon.setState(probe.pid, "background")  // held past the deadline: terminated
        try waitUntil("every process gone, workers too", timeout: 10) { members.allSatisfy(\.hasExited) }
        #expect(try daemon.history().last?["reason"] == "assertionsBeyondPermittedTime")
    }

    @Test func aDoubleForkedWorkerBeginsTasksForItsUnitApp() throws {
        let unit = try TestUnit("worker")
        let daemon = try TestDaemon()
        let probe = try Probe(process: try unit.spawn("exec \(Binaries.path("bgtask-probe")) --socket \(daemon.socketPath)"))
        _ = try probe.begin("main")
        // A worker started in the unit by another shell, double-forked: not the app's child.
        let worker = """
        import json, signal, socket, sys
        s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
        s.sendall(b'{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"worker"}}\\0')
        reply = b""
        while not reply.endswith(b"\\0"): reply += s.recv(4096)
        print(json.dumps({"worker": json.loads(reply[:-1])}), flush=True)
        signal.pause()  # holds its task until the unit is torn down
        """
        let shell = try unit.spawn("(python3 -c '\(worker.replacingOccurrences(of: "'", with: "'\\''"))' \(daemon.socketPath) &); echo started")
        try shell.expectLine("started")
        let answer = try #require(try shell.readLine(timeout: 10))
        #expect(try JSON.parse(answer)["worker"]?["parameters"]?["taskId"]?.intValue != nil)
        let apps = try daemon.apps()
        #expect(apps.count == 1 && apps.first?["tasks"] == 2 && apps.first?["pid"]?.intValue == Int64(probe.pid))
        #expect(try daemon.tasks().map { $0["appPid"]?.intValue } == [Int64(probe.pid), Int64(probe.pid)])
        let (code, listed) = try daemon.ctl(["--json", "tasks", "--unit", unit.name])
        let listedTasks = try JSON.parse(listed)["tasks"]?.arrayValue
        #expect(code == 0 && listedTasks?.count == 2)
    }

    @Test func bgtaskctlNamesAUnitThatNeverCalledTheDaemon() throws {
        let unit = try TestUnit("named")
        let daemon = try TestDaemon()
        let (app, members) = try Self.sleeperWithWorkers(in: unit)
        var (code, output) = try daemon.ctl(["background", "--unit", unit.name])
        #expect(code == 0, "\(output)")
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        (code, output) = try daemon.ctl(["apps"])
        #expect(output.contains(unit.name) && output.contains(" unit "), "\(output)")
        #expect(try daemon.app(app.pid)?["unit"]?.stringValue == unit.name)  // named after its oldest process
        (code, output) = try daemon.ctl(["foreground", "--unit", "/" + unit.name])  // by cgroup path too
        #expect(code == 0, "\(output)")
        try waitUntil("the unit thawed") { try !unit.cgroup.isFrozen() }
        (code, output) = try daemon.ctl(["terminate", "--unit", unit.name])
        #expect(code == 0, "\(output)")
        try waitUntil("every process gone") { members.allSatisfy(\.hasExited) }
    }

    @Test func aFrozenUnitAppIsStillItsUnitAfterARestart() throws {
        let unit = try TestUnit("restart")
        let daemon = try TestDaemon()
        let (app, members) = try Self.sleeperWithWorkers(in: unit)
        #expect(try daemon.ctl(["background", "--unit", unit.name]).0 == 0)
        try waitUntil("the unit frozen") { try unit.cgroup.isFrozen() }
        try daemon.crash()
        let restarted = try daemon.restart()
        let restored = try #require(try restarted.app(app.pid))
        #expect(restored["unit"]?.stringValue == unit.name && restored["containment"] == "unit")
        let frozen = try unit.cgroup.isFrozen()
        #expect(restored["state"] == "suspended" && frozen)
        #expect(try restarted.ctl(["foreground", "--unit", unit.name]).0 == 0)
        try waitUntil("the unit thawed") { try !unit.cgroup.isFrozen() }
        try waitUntil("every process running") { members.allSatisfy { Self.isRunning($0.pid) } }
    }

    /// uid 65534's process in a unit it shares with root (one not delegated to it, as a
    /// service with a `User=` child): backgrounding its own app stops what it could stop
    /// itself, never the unit, never root's process beside it.
    @Test func anUnprivilegedAppInASharedUnitBorrowsNothing() throws {
        let unit = try TestUnit("shared")
        let daemon = try TestDaemon()
        let root = try unit.spawn("echo ready; exec sleep 600")
        try root.expectLine("ready")
        let own = try unit.spawn("exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sleep 600")
        try waitUntil("the unprivileged sleep in the unit") {
            (try? ProcStatus.uids(pid: own.pid))?.real == 65534 && (try? ProcStat.read(pid: own.pid))?.command == "sleep"
        }
        let (code, output) = try daemon.ctl(["background", "\(own.pid)"], asUser: 65534)
        #expect(code == 0, "\(output)")
        try waitUntil("its own process stopped") { processState(own.pid) == "T" }
        let app = try #require(try daemon.app(own.pid))
        #expect(app["unit"]?.stringValue == unit.name && app["uid"] == 65534)
        #expect(try !unit.cgroup.isFrozen() && Self.isRunning(root.pid))
        #expect(daemon.logged { $0.contains("is not delegated to uid 65534") || $0.contains("pid \(root.pid) not suspended") })
        // Nor may it name the unit for root's process: the unit's app is its own, of its uid.
        let (_, tasks) = try daemon.ctl(["--json", "tasks", "--unit", unit.name], asUser: 65534)
        #expect(tasks.contains("\"tasks\""), "\(tasks)")
        #expect(Self.isRunning(root.pid))
    }

    @Test func unitsThatAreNotAppsAreRefusedAndNothingIsFrozen() throws {
        let own = try TestUnit("daemon")
        let daemon = try TestDaemon(cgroup: own.cgroup)
        try waitUntil("the daemon in its unit") { Cgroup.of(pid: daemon.process.pid) == own.cgroup }
        let victim = try TestUnit("victim")
        let app = try victim.spawn("echo ready; exec sleep 600")
        try app.expectLine("ready")
        for name in ["init.scope", "user.slice", "-.slice", "session-2.scope", "user@0.service", own.name, "../x.scope", ""] {
            let (code, output) = try daemon.ctl(["background", "--unit", name])
            #expect(code != 0 && (output.contains("invalid parameter: unit") || output.contains("takes one PID")), "\(name): \(output)")
        }
        let (code, output) = try daemon.ctl(["background", "--unit", "bgtaskd-test-nonexistent.scope"])
        #expect(code != 0 && output.contains("no unit app or unit named"), "\(output)")
        // Another user's unit: not found by name (a user's search is its own units; when
        // another test has filled its subtree, the search is cut short), refused by path,
        // and left alone.
        let (unseen, answer) = try daemon.ctl(["background", "--unit", victim.name], asUser: 65534)
        #expect(unseen != 0 && (answer.contains("no unit app or unit named") || answer.contains("unit lookups of uid")), "\(answer)")
        let (denied, refusal) = try daemon.ctl(["background", "--unit", "/" + victim.name], asUser: 65534)
        #expect(denied != 0 && refusal.contains("permission denied"), "\(refusal)")
        #expect(try !own.cgroup.isFrozen() && !(try victim.cgroup.isFrozen()))
        #expect(try daemon.apps().isEmpty)
        #expect(Self.isRunning(app.pid) && !daemon.process.hasExited)
    }
}

/// Process apps whose forks the daemon follows with the kernel's process-events connector.
@Suite(.serialized) struct TrackedContainmentTests {
    static func isRunning(_ pid: Int32) -> Bool { ContainmentEndToEndTests.isRunning(pid) }

    /// An app that registers, then forks a double-forked and a `setsid` worker (printing
    /// their pids), and begins a task "held" when told to on stdin.
    static let forkingApp = #"""
    import json, os, signal, socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    \#(UnprivilegedFloodTests.call)
    call("io.bgtaskd.App.GetTimeRemaining", {})
    r, w = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            os.write(w, b"%d\n" % os.getpid()); signal.pause(); os._exit(0)
        os._exit(0)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, b"%d\n" % os.getpid()); signal.pause(); os._exit(0)
        os._exit(0)
    os.wait(); os.wait()
    workers = os.read(r, 100).split() 
    while len(workers) < 2: workers += os.read(r, 100).split()
    print(json.dumps({"workers": [int(p) for p in workers]}), flush=True)
    for line in sys.stdin:
        print(json.dumps(call("io.bgtaskd.App.BeginTask", {"name": "held"})), flush=True)
    """#

    /// Without a unit of its own, an app's re-parented workers are still its own: the daemon
    /// followed their forks (containment `tracked`).
    @Test(.enabled(if: getuid() == 0 && Host.inInitialNamespaces,
                   "needs CAP_NET_ADMIN in the initial namespaces for the process-events connector"))
    func escapedWorkersOfATrackedAppAreStoppedResumedAndKilledWithIt() throws {
        let daemon = try TestDaemon(["BackgroundTimeSec=1s", "ExpirationWarningSec=0"])
        let app = try Spawned("/usr/bin/python3", ["-c", Self.forkingApp, daemon.socketPath])
        let line = try #require(try app.readLine(timeout: 10))
        let pids = try #require(try JSON.parse(line)["workers"]?.arrayValue?.compactMap(\.intValue).map(Int32.init))
        let members = [app.pidfd] + (try pids.map { try Pidfd.open(pid: $0) })
        #expect(members.count == 3 && ProcessTree.members(of: app.pidfd).count == 1)  // both left its tree
        #expect(try daemon.app(app.pid)?["containment"] == "tracked")

        try daemon.setState(app.pid, "background")
        try waitUntil("every process stopped, workers too") { members.allSatisfy { processState($0.pid) == "T" } }
        try daemon.setState(app.pid, "foreground")
        try waitUntil("every process running") { members.allSatisfy { Self.isRunning($0.pid) } }
        try app.send("begin")
        _ = try app.readLine(timeout: 5)
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        try daemon.setState(app.pid, "background")
        try waitUntil("every process gone, workers too", timeout: 10) { members.allSatisfy(\.hasExited) }
    }
}
