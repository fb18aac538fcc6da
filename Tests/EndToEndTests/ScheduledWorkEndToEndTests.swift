// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Scheduled work (BGTaskScheduler) through the Swift library (`bgtask-libprobe`), the
/// daemon and `bgtaskctl`: a due refresh wakes a suspended app, a processing request waits
/// for power from a power-supply directory of the test's own, requests survive a `kill -9`
/// of the daemon and a relaunch of the app, `bgtaskctl launch`, another user, bad input.
@Suite(.serialized) struct ScheduledWorkEndToEndTests {
    /// A library app with `identifier` registered (`mode`: complete or hold), and a monitor;
    /// the app run as uid 65534 (`setpriv`) when `asNobody`.
    static func app(_ daemon: TestDaemon, registering identifier: String, mode: String = "complete",
                    asNobody: Bool = false) throws -> (Probe, Spawned) {
        let monitor = try Spawned(Binaries.path("bgtaskctl"), ["--socket", daemon.socketPath, "--json", "monitor"])
        #expect(try JSON.parse(try #require(try monitor.readLine(timeout: 5)))["event"] == "monitoring")
        let app = try Probe.library(daemon, asNobody: asNobody)
        try app.send("register \(identifier) \(mode)")
        _ = try app.next { $0["registered"] != nil }
        return (app, monitor)
    }

    static func submit(_ app: Probe, _ words: String) throws -> JSON {
        try app.send("submit " + words)
        return try app.next { $0["submitted"] != nil || $0["submitError"] != nil }
    }

    static func suspend(_ daemon: TestDaemon, _ app: Probe) throws {
        try daemon.setState(app.pid, "background")
        try waitUntil("the app suspended") { try daemon.app(app.pid)?["state"] == "suspended" }
    }

    static func requests(_ daemon: TestDaemon) throws -> [JSON] {
        try daemon.manager("ListTaskRequests")["requests"]?.arrayValue ?? []
    }

    @Test func aDueRefreshWakesTheSuspendedAppWhichIsSuspendedAgainOnceCompleted() throws {
        let daemon = try TestDaemon(["CoalesceWindowSec=0"])
        let (app, monitor) = try Self.app(daemon, registering: "org.example.refresh")
        #expect(try Self.submit(app, "refresh org.example.refresh 1")["submitted"] == "org.example.refresh")
        try Self.suspend(daemon, app)
        #expect(try Self.requests(daemon).first?["waitingFor"] == "date")
        let launched = try app.next(timeout: 5) { $0["launched"] != nil }
        #expect(launched["kind"] == "refresh" && launched["state"] == "background")
        let completed = try #require(launched["at"]?.intValue)
        _ = try WakeEndToEndTests.next(monitor) { $0["event"] == "woken" }
        let (suspended, seen) = try WakeEndToEndTests.next(monitor) { $0["event"] == "suspended" }
        #expect(suspended["entry"]?["reason"] == "wakeFinished")
        #expect(seen - completed < 50_000_000, "suspended \((seen - completed) / 1_000_000) ms after setTaskCompleted")
        #expect(try Self.requests(daemon).isEmpty)  // launched: no longer pending
        #expect(try daemon.history().contains { $0["action"] == "woken" && $0["reason"] == "launch" })
    }

    /// A launch completed before its task's grant lets a background transition waiting for
    /// that grant finish at once, as an ended task does: the library's thread is woken (it
    /// slept on, and the app was suspended only at the transition's deadline).
    @Test func aLaunchCompletedBeforeItsGrantLetsTheTransitionFinish() throws {
        let daemon = try TestDaemon(["CoalesceWindowSec=0", "GrantLatencyMinSec=2s", "GrantLatencyMaxSec=2s",
                                     "TransitionTimeoutSec=10s"])
        let (app, monitor) = try Self.app(daemon, registering: "org.example.refresh")
        #expect(try Self.submit(app, "refresh org.example.refresh 0")["submitted"] == "org.example.refresh")
        try daemon.setState(app.pid, "background")
        let background = Clock.realtimeNanoseconds()
        let launched = try app.next(timeout: 5) { $0["launched"] != nil }
        #expect(launched["state"] == "background")
        let (suspended, seen) = try WakeEndToEndTests.next(monitor) { $0["event"] == "suspended" }
        #expect(suspended["entry"]?["reason"] == "transitionFinished")
        // Before the grant (2 s) could have let it, and long before the deadline (10 s).
        #expect(seen - background < 1_500_000_000, "suspended \((seen - background) / 1_000_000) ms after the background")
    }

    @Test func aProcessingRequestWaitsForPowerAndIsWarnedWhenUnplugged() throws {
        var template = Array("/tmp/bgtask-power-XXXXXX".utf8CString)
        let power = String(cString: try #require(mkdtemp(&template)))
        defer { _ = try? SystemdTests.run(["/bin/rm", "-rf", power]) }
        for (supply, type, online) in [("AC", "Mains", "0"), ("BAT0", "Battery", "1")] {
            mkdir(power + "/" + supply, 0o755)
            try writeFile(power + "/\(supply)/type", Array((type + "\n").utf8))
            try writeFile(power + "/\(supply)/online", Array((online + "\n").utf8))
        }
        let daemon = try TestDaemon(["PowerSupplyPath=\(power)", "CoalesceWindowSec=0", "ProcessingTimeSec=30s"])
        let (app, monitor) = try Self.app(daemon, registering: "org.example.backup", mode: "hold")
        #expect(try Self.submit(app, "processing org.example.backup 0 power")["submitted"] != nil)
        try Self.suspend(daemon, app)
        try waitUntil("the request waiting for power") { try Self.requests(daemon).first?["waitingFor"] == "power" }
        #expect(try daemon.ctl(["requests"]).1.contains("on battery"))
        #expect(!app.lines.contains { $0["launched"] != nil })
        try writeFile(power + "/AC/online", Array("1\n".utf8))  // plugged in
        let plugged = Clock.monotonicNanoseconds()
        _ = try app.next(timeout: 1) { $0["launched"] != nil }
        #expect(Clock.monotonicNanoseconds() - plugged < 1_000_000_000)
        #expect(try daemon.app(app.pid)?["state"] == "background")
        // Mid-run: once the launch's task is granted (unplugged before its grant, it would be
        // denied, and the app kept to its deadline: see the closing note).
        try waitUntil("the launch granted") { try daemon.tasks(app.pid).first?["state"] == "granted" }
        try writeFile(power + "/AC/online", Array("0\n".utf8))  // unplugged mid-run: warned, then suspended
        _ = try app.next(timeout: 2) { $0["launchExpired"] == "org.example.backup" }
        _ = try WakeEndToEndTests.next(monitor) { $0["event"] == "woken" }
        _ = try WakeEndToEndTests.next(monitor) { $0["event"] == "suspended" }
        #expect(try daemon.app(app.pid)?["state"] == "suspended")
    }

    /// In a network namespace of the daemon's own (no default route), a request requiring a
    /// network waits, and runs once a route is added (rtnetlink tells the daemon).
    @Test(.enabled(if: getuid() == 0, "needs root to make a network namespace (unshare -n) and add a route in it"))
    func aRequestRequiringANetworkWaitsForADefaultRoute() throws {
        let daemon = try TestDaemon(["CoalesceWindowSec=0"], wrapper: ["/usr/bin/unshare", "--net", "--"])
        let (app, _) = try Self.app(daemon, registering: "org.example.upload")
        #expect(try Self.submit(app, "processing org.example.upload 0 network")["submitted"] != nil)
        try Self.suspend(daemon, app)
        try waitUntil("the request waiting for the network") { try Self.requests(daemon).first?["waitingFor"] == "network" }
        #expect(try daemon.manager("ListTaskRequests")["network"] == false)
        #expect(!app.lines.contains { $0["launched"] != nil })
        let namespace = "/proc/\(daemon.process.pid)/ns/net"  // the daemon's own, which it made
        for command in [["link", "set", "lo", "up"], ["route", "add", "default", "dev", "lo"]] {
            let (code, output) = try SystemdTests.run(["/usr/bin/nsenter", "--net=" + namespace, "--", "/usr/sbin/ip"] + command)
            try #require(code == 0, "ip \(command): \(output)")
        }
        _ = try app.next(timeout: 2) { $0["launched"] == "org.example.upload" }
        #expect(try daemon.manager("ListTaskRequests")["network"] == true)
    }

    /// A refresh due an hour after its submission, the machine then asleep two hours while
    /// no daemon ran (the restarted daemon in a time namespace whose `CLOCK_BOOTTIME` is two
    /// hours ahead and `CLOCK_MONOTONIC` the same: what a suspend does to the two clocks),
    /// is due: the suspended app is launched at once, not an hour of waking time later.
    /// The app as root or as uid 65534: a user's requests count the sleep as root's do.
    @Test(.enabled(if: getuid() == 0, "needs root to make a time namespace (unshare -T)"), arguments: [false, true])
    func aRequestsDateCountsTheTimeTheMachineSleptWhileNoDaemonRan(asNobody: Bool) throws {
        let daemon = try TestDaemon(["CoalesceWindowSec=0"])
        let (app, _) = try Self.app(daemon, registering: "org.example.later", asNobody: asNobody)
        #expect(try Self.submit(app, "refresh org.example.later 3600")["submitted"] != nil)
        try daemon.stop()
        let restarted = try daemon.restart(["CoalesceWindowSec=0"],
                                           wrapper: ["/usr/bin/unshare", "--time", "--boottime", "7200", "--"])
        #expect(restarted.logged { $0.contains("The machine slept 2h: scheduled requests' dates and the quota window count it") })
        // Its process's start time reads otherwise in the namespace (/proc counts it on
        // CLOCK_BOOTTIME): the app is not restored, and registers again as its library
        // reconnects, with its requests (its key).
        try waitUntil("the app registered again", timeout: 10) { try restarted.app(app.pid) != nil }
        #expect(try Self.requests(restarted).first?["uid"]?.intValue == (asNobody ? 65534 : 0))
        try Self.suspend(restarted, app)
        let launched = try app.next(timeout: 5) { $0["launched"] != nil }
        #expect(launched["launched"] == "org.example.later" && launched["kind"] == "refresh")
    }

    @Test func requestsSurviveAKillOfTheDaemonAndARelaunchOfTheApp() throws {
        let daemon = try TestDaemon()
        let (app, _) = try Self.app(daemon, registering: "org.example.later")
        #expect(try Self.submit(app, "refresh org.example.later 3600")["submitted"] != nil)
        try daemon.crash()
        let restarted = try daemon.restart()
        #expect(try Self.requests(restarted).map { $0["identifier"] } == ["org.example.later"])
        // The app is relaunched: its new process (same executable, same user) has them.
        try app.send("exit")
        _ = try app.process.wait(timeout: 5)
        try waitUntil("the request without a running app") { try Self.requests(restarted).first?["waitingFor"] == "app" }
        let again = try Probe(daemon: restarted, binary: "bgtask-libprobe")
        try again.send("pending")
        #expect(try again.next { $0["pending"] != nil }["pending"] == .array(["org.example.later"]))
        #expect(try Self.requests(restarted).first?["pid"]?.intValue == Int64(again.pid))
    }

    @Test func bgtaskctlLaunchRunsTheHandlerNowAndAnotherUserMayNeitherListNorLaunch() throws {
        let daemon = try TestDaemon()
        let (app, _) = try Self.app(daemon, registering: "org.example.sync")
        #expect(try Self.submit(app, "refresh org.example.sync 86400")["submitted"] != nil)
        try Self.suspend(daemon, app)
        let (listed, table) = try daemon.ctl(["requests"])
        #expect(listed == 0 && table.contains("org.example.sync") && table.contains("date"), "\(table)")
        if getuid() == 0 {
            let (mine, theirs) = try daemon.ctl(["requests"], asUser: 65534)
            #expect(mine == 0 && !theirs.contains("org.example.sync"), "\(theirs)")
            let (refused, output) = try daemon.ctl(["launch", "\(app.pid)", "org.example.sync"], asUser: 65534)
            #expect(refused != 0 && output.contains("permission denied"), "\(output)")
            #expect(!app.lines.contains { $0["launched"] != nil })
        }
        let (code, output) = try daemon.ctl(["launch", "\(app.pid)", "org.example.sync"])
        #expect(code == 0, "\(output)")
        _ = try app.next(timeout: 2) { $0["launched"] == "org.example.sync" }
        let (missing, message) = try daemon.ctl(["launch", "\(app.pid)", "org.example.none"])
        #expect(missing != 0 && message.contains("no pending request"), "\(message)")
    }

    @Test func badRequestsGetClearErrorsAndChangeNothing() throws {
        let daemon = try TestDaemon()
        let connection = try daemon.connect()  // the test process is the app
        func submit(_ parameters: [String: JSON]) -> String? {
            do {
                _ = try connection.call("io.bgtaskd.App.SubmitTaskRequest", parameters)
                return nil
            } catch {
                return error.varlinkError?.name ?? "\(error)"  // call throws ClientError
            }
        }
        let good: [String: JSON] = ["identifier": "org.example.p", "kind": "processing"]
        #expect(submit(["identifier": "x", "kind": "daily"])?.contains("InvalidParameter") == true)
        #expect(submit(["identifier": .string(String(repeating: "x", count: 257)), "kind": "refresh"])?.contains("InvalidParameter") == true)
        #expect(submit(["identifier": "a\u{1}b", "kind": "refresh"])?.contains("InvalidParameter") == true)
        #expect(submit(["identifier": "x", "kind": "refresh", "interval": 60])?.contains("InvalidParameter") == true)
        #expect(submit(["identifier": "x", "kind": "refresh", "earliestBeginDate": -1])?.contains("InvalidParameter") == true)
        for index in 0..<10 {
            var parameters = good
            parameters["identifier"] = .string("org.example.p\(index)")
            #expect(submit(parameters) == nil)
        }
        var eleventh = good
        eleventh["identifier"] = "org.example.p10"
        #expect(submit(eleventh)?.contains("TooManyPendingTaskRequests") == true)
        let pending = try connection.call("io.bgtaskd.App.GetPendingTaskRequests")["requests"]?.arrayValue ?? []
        #expect(pending.count == 10)
        #expect(try Self.requests(daemon).count == 10)
    }
}
