// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Policy files through the real daemon: matched by what the kernel says of an app.
@Suite(.serialized) struct PolicyEndToEndTests {
    typealias ConfigFiles = ConfigurationFileTests.ConfigFiles

    /// A configuration directory whose `policy.d/` exempts `/usr/bin/sleep`.
    static func sleepExempt() throws -> ConfigFiles {
        let files = try ConfigFiles()
        try files.write(files.main, "")
        mkdir(files.directory + "/policy.d", 0o755)
        try files.write(files.directory + "/policy.d/50-sleep.policy", "[Match]\nExecutable=/usr/bin/sleep\n\n[Policy]\nExempt=yes\n")
        return files
    }

    @Test func anExecutablePolicyExemptsOneAppWhileAnotherWithTheSameBudgetIsSuspended() throws {
        let files = try Self.sleepExempt()
        let daemon = try TestDaemon(["BackgroundTimeSec=1s"], extraArguments: ["--config", files.main])
        let exempt = try Spawned("/bin/sleep", ["600"])
        let other = try Spawned("/usr/bin/tail", ["-f", "/dev/null"])
        try daemon.setState(other.pid, "background")
        try daemon.setState(exempt.pid, "background")
        try waitUntil("the other app suspended") { processState(other.pid) == "T" }
        let app = try #require(try daemon.app(exempt.pid))
        #expect(app["policy"] == "50-sleep" && app["exempt"] == true && app["state"] == "background")
        #expect(app["backgroundTimeRemaining"] == .null)  // unlimited
        #expect(processState(exempt.pid) != "T")
        let (code, output) = try daemon.ctl(["policy", "\(exempt.pid)"])
        #expect(code == 0 && output.contains("Policy: 50-sleep (\(files.directory)/policy.d/50-sleep.policy)")
            && output.contains("BackgroundTimeSec=1s") && output.contains("Exempt=yes"), "\(output)")
        let (_, none) = try daemon.ctl(["policy", "\(other.pid)"])
        #expect(none.contains("Policy: none"), "\(none)")
        #expect(try daemon.ctl(["apps"]).1.contains("50-sleep (exempt)"))
    }

    @Test func aBadPolicyNamesItsFileAndLineAndAReloadKeepsTheOldOnes() throws {
        let files = try Self.sleepExempt()
        let daemon = try TestDaemon(["BackgroundTimeSec=1s"], extraArguments: ["--config", files.main])
        let bad = files.directory + "/policy.d/60-bad.policy"
        try files.write(bad, "[Policy]\nExempt=perhaps\n")
        let (code, output) = try daemon.ctl(["reload"])
        #expect(code == 1 && output.contains("\(bad):2: Exempt: expected yes or no"), "\(output)")
        let sleeper = try Spawned("/bin/sleep", ["600"])  // registered after the failed reload
        try daemon.setState(sleeper.pid, "background")
        #expect(try daemon.app(sleeper.pid)?["exempt"] == true)  // the old policies are in force
        let (checked, refusal) = try ConfigurationFileTests.checkConfig(["--config", files.main])
        #expect(checked != 0 && refusal.contains("\(bad):2:"), "\(refusal)")  // and would keep a daemon from starting
    }

    /// A configuration directory whose policy gives root's apps `DailyBackgroundSec=2s`.
    static func quotaFiles() throws -> ConfigFiles {
        let files = try ConfigFiles()
        try files.write(files.main, "")
        mkdir(files.directory + "/policy.d", 0o755)
        try files.write(files.directory + "/policy.d/50-quota.policy", "[Match]\nUser=root\n\n[Policy]\nDailyBackgroundSec=2s\n")
        return files
    }

    /// A probe that uses up its 2 s quota under a 10 s budget: the period ends at 2 s; the
    /// app, warned, ends its task and is suspended; then it is killed.
    static func useUpTheQuota(_ daemon: TestDaemon) throws {
        let first = try daemon.probe()
        try first.send("subscribe")
        try first.event("subscribed")
        let id = try first.begin("held")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        try daemon.setState(first.pid, "background")
        let left = try #require(try daemon.app(first.pid)?["backgroundTimeRemaining"]?.doubleValue)
        #expect(left <= 2 && left > 1.5, "the period ends with the quota, not the 10 s budget: \(left)")
        try first.event("didEnterBackground")
        try first.call("finish")
        try first.event("taskExpiring")  // the warning, 500 ms before the quota runs out
        try first.send("end \(id)")
        try waitUntil("the app suspended") { try daemon.history().last?["reason"] == "tasksEnded" }
        try first.process.signal(SIGKILL)
    }

    static let quotaSettings = ["BackgroundTimeSec=10s", "ExpirationWarningSec=500ms", "GrantLatencyMaxSec=5ms"]

    /// The quota used up; relaunched, and after a `kill -9` of the daemon, the app has
    /// nothing left.
    @Test func aDailyQuotaCutsThePeriodShortAndOutlivesRelaunchesAndRestarts() throws {
        let files = try Self.quotaFiles()
        let daemon = try TestDaemon(Self.quotaSettings, extraArguments: ["--config", files.main])
        try Self.useUpTheQuota(daemon)

        let second = try daemon.probe()  // relaunched: a new pid, the same app
        try Self.expectRefusedInTheBackground(second, daemon)

        try daemon.crash()
        let restarted = try daemon.restart(Self.quotaSettings, extraArguments: ["--config", files.main])  // same state
        try restarted.setState(second.pid, "foreground")  // it was suspended meanwhile
        try second.send("remaining")
        let remaining = try second.next { $0["call"] == "remaining" }
        #expect((remaining["reply"]?["backgroundQuotaRemaining"]?.doubleValue ?? 1) <= 0.5, "\(remaining)")
        try Self.expectRefusedInTheBackground(second, restarted)  // its subscription ended with the old daemon
    }

    /// The quota window (`QuotaWindowSec=1h`) counts the machine's sleep: used up, then the
    /// machine asleep an hour while no daemon ran (the restarted daemon in a time namespace
    /// whose `CLOCK_BOOTTIME` is an hour ahead), the relaunched app has its 2 s again.
    @Test(.enabled(if: getuid() == 0, "needs root to make a time namespace (unshare -T)"))
    func aDailyQuotaUsedUpIsBackOnceTheMachineSleptTheWindow() throws {
        let files = try Self.quotaFiles()
        let settings = Self.quotaSettings + ["QuotaWindowSec=1h"]
        let daemon = try TestDaemon(settings, extraArguments: ["--config", files.main])
        try Self.useUpTheQuota(daemon)
        try daemon.stop()
        let restarted = try daemon.restart(settings, extraArguments: ["--config", files.main],
                                           wrapper: ["/usr/bin/unshare", "--time", "--boottime", "3601", "--"])
        #expect(restarted.logged { $0.contains("The machine slept 1h 1s: ") })
        let again = try restarted.probe()
        try again.send("subscribe")
        try again.event("subscribed")
        try restarted.setState(again.pid, "background")
        try again.event("didEnterBackground")
        let left = try #require(try restarted.app(again.pid)?["backgroundQuotaRemaining"]?.doubleValue)
        #expect(left == 2, "the whole quota back: \(left)")
        try again.send("begin granted")
        let begun = try again.next { $0["call"] == "begin" }
        #expect(begun["error"] == nil, "\(begun)")
    }

    /// Subscribes `probe` (so that it is not suspended the moment it is backgrounded), moves
    /// it to the background, and expects `BeginTask` refused for want of time.
    static func expectRefusedInTheBackground(_ probe: Probe, _ daemon: TestDaemon) throws {
        try probe.send("subscribe")
        try probe.event("subscribed")
        try daemon.setState(probe.pid, "background")
        try probe.event("didEnterBackground")
        try probe.send("begin refused")
        let refused = try probe.next { $0["call"] == "begin" }
        #expect(refused["error"] == "io.bgtaskd.App.NoBackgroundTime", "\(refused)")
    }
}
