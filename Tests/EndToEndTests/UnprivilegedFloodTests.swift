// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// The floods of findings 1 and 2 of the second review, measuring root's `GetStatus` while
/// uid 65534 floods. `make check` runs this suite on its own, after the rest (`swift test
/// --filter UnprivilegedFloodTests`): measured beside forty other suites on two cores, the
/// latency would be theirs.
@Suite(.serialized, .enabled(if: getuid() == 0 && Capabilities.cgroupsWritable,
                             "needs root to run the daemon, make cgroups and setpriv to uid 65534"))
struct UnprivilegedFloodTests {
    /// Root's `GetStatus` p99 during a flood (the slowest may be 5 times this), and the
    /// daemon's growth: the issue's 100 ms and 64 MiB. Under `make sanitize` the daemon runs
    /// 3–5 times slower and ASan keeps what is freed in quarantine (the subscriber flood frees
    /// gigabytes' worth on the old code, tens of megabytes now): 1 s and 1 GiB there, still
    /// far below what the floods did before (42 s; 2 GiB).
    static let sanitized = Capabilities.sanitized
    let floodLatencyBound: Double = sanitized ? 1000 : 100
    let floodGrowthBoundKiB = sanitized ? 1024 * 1024 : 64 * 1024

    /// 1: uid 65534 made 5,000 cgroups in its own delegated subtree and pipelines lookups of
    /// a unit that does not exist (each walked the whole tree: 160–220 ms a call at 10,000;
    /// 400 calls held root's GetStatus for 44 s). Now a user's search is its own subtree,
    /// within 1,000 directories a second: root is answered meanwhile.
    @Test func lookupsOfUnitsThatDoNotExistCannotHoldTheLoop() throws {
        let subtree = try DelegatedSubtree(uid: Intruder.uid, cgroups: 5_000)
        let daemon = try TestDaemon()
        let rssBefore = try residentKiB(daemon.process.pid)
        let intruders = try (0..<4).map { _ in try Intruder(daemon) }
        for intruder in intruders {
            #expect(try intruder.run("unread 100 io.bgtaskd.Manager.Terminate {\"unit\":\"no-such.scope\"}")["sent"] == 100)
        }
        let latency = try rootStatusLatencies(daemon)
        print("unit lookup flood: GetStatus p99 \(latency.p99) ms (slowest \(latency.max) ms), daemon grew \(latency.peakKiB - rssBefore) KiB at most")
        #expect(latency.p99 < floodLatencyBound && latency.max < 5 * floodLatencyBound, "root's GetStatus p99 \(latency.p99) ms, slowest \(latency.max) ms")
        // The first answer is a clear one: not found, or searched too much this second.
        let first = try intruders[0].run("read")
        #expect(Intruder.isError(first, "io.bgtaskd.Manager.NoSuchApp") || Intruder.isError(first, "io.bgtaskd.App.LimitExceeded"),
                "\(first.serialized)")
        #expect(latency.peakKiB < rssBefore + floodGrowthBoundKiB)
        withExtendedLifetime(subtree) {}
    }


    /// Python: `call(method, params)` on the socket `s`, one call at a time, its reply parsed.
    static let call = #"""
    def call(method, params):
        s.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
        reply = b""
        while not reply.endswith(b"\0"): reply += s.recv(65536)
        return json.loads(reply[:-1])
    """#

    /// Python: sends `data` (`count` calls) on `s` while reading their replies, as a
    /// pipelining client must; returns how many replies came and how many were errors.
    static let pipelined = #"""
    def pipelined(s, data, count, timeout, end=False):
        replies, errors, buf = 0, 0, b""
        while replies < count:
            r, w, _ = select.select([s], [s] if data else [], [], timeout)
            if not r and not w: break
            if w:
                data = data[s.send(data[:65536]):]
                if end and not data: s.shutdown(socket.SHUT_WR)
            if r:
                chunk = s.recv(65536)
                if not chunk: break
                buf += chunk
                while b"\0" in buf:
                    m, buf = buf.split(b"\0", 1); replies += 1
                    if "error" in json.loads(m): errors += 1
        return replies, errors
    """#

    /// Python: `pipelined` on each of `sockets` (non-blocking) at once, `data` (`count` calls)
    /// on each; returns the replies each had (in order), how many were errors in all, and the
    /// fewest replies any had when the first had all of its own.
    static let pipelinedAll = #"""
    def pipelined_all(sockets, data, count, timeout):
        unsent = {s: data for s in sockets}
        replies, bufs, ended = {s: 0 for s in sockets}, {s: b"" for s in sockets}, set()
        errors, fewest = 0, None
        def waiting(s): return s not in ended and replies[s] < count
        while any(waiting(s) for s in sockets):
            r, w, _ = select.select([s for s in sockets if waiting(s)], [s for s in sockets if unsent[s]], [], timeout)
            if not r and not w: break
            for s in w: unsent[s] = unsent[s][s.send(unsent[s][:65536]):]
            for s in r:
                chunk = s.recv(1 << 20)
                if not chunk: ended.add(s); continue
                bufs[s] += chunk
                while b"\0" in bufs[s]:
                    m, bufs[s] = bufs[s].split(b"\0", 1); replies[s] += 1
                    if "error" in json.loads(m): errors += 1
                if fewest is None and replies[s] >= count: fewest = min(replies.values())
        return [replies[s] for s in sockets], errors, fewest
    """#

    /// 2: one `Wake` payload was copied to every subscriber, so 250
/// unread subscriptions of a user's own app grew the daemon from 12.7 MiB to 1,983 MiB in
/// 7.6 s. Now an app has at most 8 subscriptions, an event's bytes are encoded once and
/// shared, and what one user's connections have unread is bounded in all.
    /// As uid 65534: subscribe `subscriptions` times and read nothing more, put its own app in
    /// the background, then pipeline `wakes` wakes of it with a 4 KiB payload.
    static let script = #"""
    import json, os, select, socket, sys
    \#(pipelined)
    path, subscriptions, wakes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def connect():
        s = socket.socket(socket.AF_UNIX); s.connect(path); return s
    def read(s):
        buf = b""
        while not buf.endswith(b"\0"):
            chunk = s.recv(65536)
            if not chunk: return {"closed": True}
            buf += chunk
        return json.loads(buf[:-1].split(b"\0")[0])
    def call(s, method, params, more=False):
        m = {"method": method, "parameters": params}
        if more: m["more"] = True
        s.sendall(json.dumps(m).encode() + b"\0")
        return read(s)
    streams, refused = [], 0
    for _ in range(subscriptions):
        s = connect()
        r = call(s, "io.bgtaskd.App.Subscribe", {}, True)
        if "error" in r: refused += 1; s.close()
        else: streams.append(s)
    control = connect()
    call(control, "io.bgtaskd.Manager.SetAppState", {"pid": os.getpid(), "state": "background"})
    print(json.dumps({"subscribed": len(streams), "refused": refused}), flush=True)
    wake = json.dumps({"method": "io.bgtaskd.Manager.Wake", "parameters": {
        "pid": os.getpid(), "reason": "flood", "payload": {"x": "a" * 4000}}}).encode() + b"\0"
    replies, errors = pipelined(control, wake * wakes, wakes, 30.0)
    print(json.dumps({"wakes": replies, "errors": errors}), flush=True)
    sys.stdin.readline()
    """#

    @Test func unreadSubscriptionsOfOnesOwnAppCannotGrowTheDaemon() throws {
        let daemon = try TestDaemon(["TransitionTimeoutSec=10min", "BackgroundTimeSec=10min"])
        let path = daemon.directory + "/subscriber-flood.py"
        try FileDescriptor(systemCall("open") { open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644) })
            .writeAll(Array(Self.script.utf8))
        let rssBefore = try residentKiB(daemon.process.pid)
        let flood = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                    "/usr/bin/python3", path, daemon.socketPath, "250", "2500"])
        defer { flood.killTree() }
        let subscribed = try JSON.parse(try #require(try flood.readLine(timeout: 30)))
        #expect(subscribed["subscribed"] == 8 && subscribed["refused"] == 242, "\(subscribed.serialized)")
        var doneLine: String?
        let latency = try rootStatusLatencies(daemon) {
            doneLine = doneLine ?? (try? flood.readLine(timeout: 0.001))
            return doneLine != nil
        }
        let done = try JSON.parse(try #require(doneLine))
        #expect(done["wakes"] == 2500 && done["errors"] == 0, "\(done.serialized)")
        #expect(latency.p99 < floodLatencyBound && latency.max < 5 * floodLatencyBound, "root's GetStatus p99 \(latency.p99) ms, slowest \(latency.max) ms")
        let grown = latency.peakKiB - rssBefore
        print("subscriber flood: GetStatus p99 \(latency.p99) ms (slowest \(latency.max) ms), daemon grew \(grown) KiB at most")
        #expect(grown < floodGrowthBoundKiB, "the daemon grew by \(grown) KiB")
        #expect(daemon.logged { $0.contains("unread replies") })
    }

    /// 3: uid 65534 connecting and closing in a loop from four processes held the daemon in
    /// its accept loop for as long as it went on (root's `GetStatus` waited 5.7 s of a 6 s
    /// flood, measured by hand, and no deadline fired meanwhile). Now a pass accepts at most
    /// `acceptsPerPass`, and root is answered between them, on a connection it made before.
    /// (A connection made during the flood waits its turn in the listen queue behind the
    /// flood's: up to 360 ms for root's first call in a CI run, which measured that.)
    static let connectFlood = #"""
    import socket, sys
    n = 0
    while True:
        s = socket.socket(socket.AF_UNIX)
        try: s.connect(sys.argv[1])
        except OSError: pass
        s.close()
        n += 1
        if n == 200: print("flooding", flush=True)
    """#

    @Test func aConnectionFloodCannotHoldTheLoop() throws {
        let daemon = try TestDaemon()
        let root = try daemon.connect()
        _ = try root.call("io.bgtaskd.Manager.GetStatus", timeoutMilliseconds: 5000)  // accepted
        let floods = try (0..<4).map { _ in
            try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                             "/usr/bin/python3", "-c", Self.connectFlood, daemon.socketPath])
        }
        defer { for flood in floods { flood.killTree() } }
        for flood in floods { try flood.expectLine("flooding", timeout: 30) }
        let latency = try rootStatusLatencies(daemon, on: root)
        print("connection flood: GetStatus p99 \(latency.p99) ms (slowest \(latency.max) ms)")
        #expect(latency.p99 < floodLatencyBound && latency.max < 5 * floodLatencyBound, "root's GetStatus p99 \(latency.p99) ms, slowest \(latency.max) ms")
        #expect(floods.allSatisfy { !$0.hasExited }, "the floods went on throughout")
    }
    /// 4: uid 65534's app in a cgroup of its own, with 5,000 empty cgroups below it that the
    /// user made: each suspension looked into every one of them for a process not the app's
    /// (`SuspendMode=auto`'s look for a cgroup to freeze whole), ~150 ms of the loop; 20 flips
    /// to the background and back held it 3.3 s (measured by hand with the release daemon).
    /// Now a look goes into at most `Enforcer.cgroupsPerLook` cgroups, and such an app is
    /// suspended with signals, as an app in a shared cgroup is.
    /// 5: the same app in a unit (`flips.scope`) that an administrator's policy claimed for
    /// `SuspendMode=signal`, which any user may match with its own scopes (`UserUnit=`): every
    /// stop walked the unit's 5,000 cgroups, twice (20 flips: 7.1–8.9 s, by hand). Now a unit
    /// with more cgroups than a walk reads is frozen instead.
    /// 6: the same unit flipped from 250 connections of uid 65534 at once: a pass took a call
    /// of every connection ready (each a kernel freeze or thaw of the 5,000 cgroups, 1–5 ms),
    /// so root's `GetStatus` waited for one of each: p50 98 ms, slowest 139 ms from 64
    /// connections; p50 78 ms, slowest 199 ms from 250 (measured by hand, release daemon).
    /// Now a turn is the user's (`Daemon.processInput`), whatever its number of connections.
    static let app = #"""
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    \#(call)
    task = call("io.bgtaskd.App.BeginTask", {"name": "registers"})["parameters"]["taskId"]
    call("io.bgtaskd.App.EndTask", {"taskId": task})
    print("ready", flush=True)
    sys.stdin.read()  # until the test lets it go
    """#

    /// As uid 65534: `flips` times the app at pid to the background and back, pipelined on
    /// each of `connections` connections at once (all connected first).
    static let flips = #"""
    import json, select, socket, sys
    \#(pipelinedAll)
    path, pid, flips, connections = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    def msg(state):
        return json.dumps({"method": "io.bgtaskd.Manager.SetAppState", "parameters": {"pid": pid, "state": state}}).encode() + b"\0"
    sockets = []
    for _ in range(connections):
        s = socket.socket(socket.AF_UNIX); s.connect(path); s.setblocking(False); sockets.append(s)
    replies, errors, _ = pipelined_all(sockets, (msg("background") + msg("foreground")) * flips, 2 * flips, 60.0)
    print(json.dumps({"replies": sum(replies), "errors": errors}), flush=True)
    """#

    @Test(arguments: [("flips.slice", 1, 200), ("flips.scope", 1, 200), ("flips.scope", 250, 2)])
    func flipsOfAnAppAboveThousandsOfCgroupsCannotHoldTheLoop(cgroup name: String, connections: Int, flips: Int) throws {
        let subtree = try DelegatedSubtree(uid: Intruder.uid, cgroups: 0)
        let own = subtree.root.directory + "/" + name
        let files = try ConfigurationFileTests.ConfigFiles()
        try files.write(files.main, "")
        mkdir(files.directory + "/policy.d", 0o755)
        try files.write(files.directory + "/policy.d/50-flips.policy", "[Match]\nUserUnit=flips.scope\n\n[Policy]\nSuspendMode=signal\n")
        let make = "import os, sys\nfor i in range(5000): os.makedirs(sys.argv[1] + '/c%d.slice' % i)\n"
        let maker = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                    "/usr/bin/python3", "-c", make, own])
        #expect(try maker.wait(timeout: 120) == 0)
        let daemon = try TestDaemon(extraArguments: ["--config", files.main])
        // Moved into its cgroup as root (the user could not move it from the test's), then
        // uid 65534's for good.
        let app = try Spawned("/bin/sh", ["-c", "echo $$ > \(own)/cgroup.procs; exec /usr/bin/setpriv --reuid=\(Intruder.uid) "
            + "--regid=\(Intruder.uid) --clear-groups /usr/bin/python3 -c '\(Self.app)' \(daemon.socketPath)"])
        try app.expectLine("ready", timeout: 30)
        let flood = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                    "/usr/bin/python3", "-c", Self.flips, daemon.socketPath, String(app.pid),
                                                    String(flips), String(connections)])
        defer { flood.killTree() }
        var doneLine: String?
        let latency = try rootStatusLatencies(daemon) {
            doneLine = doneLine ?? (try? flood.readLine(timeout: 0.001))
            return doneLine != nil
        }
        let done = try JSON.parse(try #require(doneLine))
        #expect(done["replies"] == .int(Int64(2 * flips * connections)) && done["errors"] == 0, "\(done.serialized)")
        print("cgroup flips flood (\(name), \(connections) connections): GetStatus p99 \(latency.p99) ms (slowest \(latency.max) ms); \(done.serialized)")
        #expect(latency.p99 < floodLatencyBound && latency.max < 5 * floodLatencyBound, "root's GetStatus p99 \(latency.p99) ms, slowest \(latency.max) ms")
        #expect(daemon.logged { $0.contains("App pid \(app.pid)") && $0.contains("suspended") })
        if name.hasSuffix(".scope") {
            #expect(try daemon.app(app.pid)?["policy"] == "50-flips")
            #expect(daemon.logged { $0.contains("App pid \(app.pid)") && $0.contains("frozen instead of stopped with SIGSTOP") })
        }
        app.killTree()
        _ = try app.wait(timeout: 5)
        withExtendedLifetime(subtree) {}
    }
}
