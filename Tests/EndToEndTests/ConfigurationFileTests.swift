// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Configuration files, drop-ins and `--set` through the real binary.
@Suite(.serialized) struct ConfigurationFileTests {
    /// A temporary `--config` file with a `.d` directory.
    final class ConfigFiles {
        let directory: String
        var main: String { directory + "/bgtaskd.conf" }

        init() throws {
            directory = try temporaryDirectory("bgtaskd-config")
            mkdir(main + ".d", 0o755)
        }

        deinit { _ = try? Spawned("/bin/rm", ["-rf", directory]).wait(timeout: 10) }

        func write(_ path: String, _ text: String) throws { try writeFile(path, Array(text.utf8)) }
    }

    static func checkConfig(_ arguments: [String]) throws -> (Int32, String) {
        let process = try Spawned(Binaries.path("bgtaskd"), arguments + ["--check-config"], standardError: .mergeIntoOutput)
        process.closeInput()
        let output = try process.readAll(timeout: 10)
        return (Spawned.exitCode(try process.wait(timeout: 10)) ?? -1, output)
    }

    @Test func filesDropInsAndSetApplyInOrder() throws {
        let files = try ConfigFiles()
        try files.write(files.main, "[Background]\nBackgroundTimeSec=10s\nTaskAgeWarningSec=1min\n")
        try files.write(files.main + ".d/20-b.conf", "[Background]\nExpirationWarningSec=4s\n")
        try files.write(files.main + ".d/10-a.conf", "[Background]\nBackgroundTimeSec=20s\nExpirationWarningSec=3s\n")
        try files.write(files.main + ".d/README", "not a .conf file, ignored\n")
        let (code, output) = try Self.checkConfig(["--config", files.main, "--set", "BackgroundTimeSec=40s"])
        #expect(code == 0, "\(output)")
        let lines = Set(output.split(separator: "\n").map(String.init))
        #expect(lines.isSuperset(of: ["BackgroundTimeSec=40s", "ExpirationWarningSec=4s", "TaskAgeWarningSec=1min",
                                      "TransitionTimeoutSec=5s", "MaxMessageBytes=64K"]))
        // First, as a comment, the files read in order (not the README beside the drop-ins).
        #expect(output.hasPrefix("# \(files.main), \(files.main).d/10-a.conf, \(files.main).d/20-b.conf\n[Background]\n"), "\(output)")
    }

    static let badValues = [
        ("Background", "BackgroundTimeSec", "soon"), ("Background", "ExpirationWarningSec", "-1s"),
        ("Background", "TransitionTimeoutSec", "5 parsecs"), ("Background", "GrantLatencyMinSec", "x"),
        ("Background", "GrantLatencyMaxSec", ""), ("Background", "GrantLatencySeed", "-3"),
        ("Background", "TaskAgeWarningSec", "1e3"), ("Background", "QuotaWindowSec", "a day"), ("Background", "KeepAwake", "sometimes"), ("Background", "WakeTimeSec", "soon"), ("Enforcement", "SuspendMode", "sometimes"), ("Enforcement", "IsolateApps", "maybe"),
        ("Enforcement", "TerminateSignal", "SIGSTOP"), ("Enforcement", "TerminateGraceSec", "later"),
        ("Limits", "MaxApps", "0"), ("Limits", "MaxTasksPerApp", "many"), ("Limits", "MaxConnectionsPerUser", "-5"),
        ("Limits", "MaxAppsPerUser", "all"), ("Limits", "MaxTasksPerUser", "0"),
        ("Limits", "MaxMessageBytes", "1T"), ("Access", "ManagerGroup", "wheel;rm -rf"),
        ("Scheduling", "RefreshTimeSec", "soon"), ("Scheduling", "ProcessingTimeSec", "-1"),
        ("Scheduling", "CoalesceWindowSec", "a while"), ("Scheduling", "DailyLaunches", "-1"),
        ("Scheduling", "RequestRetentionSec", "forever"), ("Scheduling", "PowerSupplyPath", "relative/path"),
        ("Limits", "MaxTaskRequestsPerUser", "0"), ("Limits", "MaxTaskRequests", "lots"),
    ]

    @Test func everyBadValueIsRejectedNamingFileAndLine() throws {
        let files = try ConfigFiles()
        let dropIn = files.main + ".d/50-bad.conf"
        for (section, key, value) in Self.badValues {
            try files.write(dropIn, "# a comment\n[\(section)]\n\n\(key)=\(value)\n")
            let (code, output) = try Self.checkConfig(["--config", files.main])
            #expect(code == 1, "\(key)=\(value) was accepted")
            #expect(output.hasPrefix("bgtaskd: configuration error: \(dropIn):4: \(key): "), "\(key)=\(value): \(output)")
        }
        let (code, output) = try Self.checkConfig(["--set", "NoSuchKey=1"])
        #expect(code == 1 && output.contains("--set: unknown key 'NoSuchKey'"))
        // Every key has a bad-value case.
        #expect(Set(Self.badValues.map(\.1)) == Set(Configuration.keys.map(\.name)))
    }

    /// Reload (Varlink and SIGHUP) with a bad file keeps the old values.
    @Test func reloadWithABadFileKeepsTheOldValues() throws {
        let files = try ConfigFiles()
        try files.write(files.main, "[Background]\nBackgroundTimeSec=20s\nGrantLatencyMaxSec=5ms\n")
        let daemon = try TestDaemon([], extraArguments: ["--config", files.main])
        let probe = try daemon.probe()
        _ = try probe.begin("work")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        func remaining() throws -> Double {
            try daemon.setState(probe.pid, "background")
            defer { try? daemon.setState(probe.pid, "foreground") }
            return try daemon.app(probe.pid)?["backgroundTimeRemaining"]?.doubleValue ?? -1
        }
        #expect(try remaining() > 19.9)

        try files.write(files.main, "[Background]\nBackgroundTimeSec=soon\n")
        #expect(throws: (any Error).self) { try daemon.manager("Reload") }
        let reply = try daemon.connect()
        try reply.send(VarlinkCall(method: "io.bgtaskd.Manager.Reload"))
        let refused = try reply.receive(timeoutMilliseconds: 5000)
        #expect(refused.error == "io.bgtaskd.Manager.InvalidConfiguration")
        #expect(refused.parameters["message"]?.stringValue?.hasPrefix("\(files.main):2: BackgroundTimeSec: ") == true)
        try daemon.process.signal(SIGHUP)
        try waitUntil("the SIGHUP refusal logged") {
            daemon.log().filter { $0.contains("Configuration not reloaded, keeping the old one") }.count == 3  // two calls, one SIGHUP
        }
        #expect(try remaining() > 19.9)

        try files.write(files.main, "[Background]\nBackgroundTimeSec=10s\n")
        try files.write(files.main + ".d/10-a.conf", "[Background]\nTaskAgeWarningSec=1min\n")
        try daemon.manager("Reload")
        let now = try remaining()
        #expect(now > 9.9 && now <= 10)
        // The log says what the configuration now is made of.
        #expect(daemon.logged { $0.hasSuffix("Configuration reloaded from \(files.main), \(files.main).d/10-a.conf (0 policies)") }, "\(daemon.log().suffix(5))")
    }

    /// `Reload` is for root, `ManagerGroup` and the daemon's own uid: a per-user daemon's user
    /// reloads it (`systemctl --user reload bgtaskd` runs `bgtaskctl reload` as that user),
    /// another user does not, and uid 65534 does not reload root's daemon.
    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon as uid 65534 (setpriv)"))
    func theDaemonsOwnUserMayReloadItAndNoOtherUser() throws {
        let denied = "bgtaskctl: permission denied: reloading is for root, ManagerGroup and the daemon's own user"
        let rootsDaemon = try TestDaemon()
        #expect(try rootsDaemon.ctl(["reload"], asUser: 65534) == (1, denied))
        let directory = try temporaryDirectory("bgtaskd-own")
        try systemCall("chown") { chown(directory, 65534, 65534) }
        let daemon = try TestDaemon(directory: directory, wrapper: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        #expect(try ProcStatus.uids(pid: daemon.process.pid).effective == 65534)
        #expect(try daemon.ctl(["reload"], asUser: 65534) == (0, ""))
        #expect(try daemon.ctl(["reload"], asUser: 65533) == (1, denied))
        #expect(try daemon.ctl(["reload"]) == (0, ""))
        // The pass's log records go out when it ends, after its reply: waited for (read at
        // once, a loaded CI machine once found one of the two).
        try waitUntil("both reloads logged") { daemon.log().filter { $0.contains("Configuration reloaded") }.count >= 2 }
        #expect(daemon.log().filter { $0.contains("Configuration reloaded") }.count == 2)
        #expect(rootsDaemon.log().filter { $0.contains("Configuration reloaded") }.isEmpty)
    }
}

/// A per-user daemon (not root, `$XDG_RUNTIME_DIR` set, no `--config`) reads the user's own
/// `$XDG_CONFIG_HOME/bgtaskd/bgtaskd.conf` and its drop-ins after the admin's
/// `/etc/bgtaskd/bgtaskd.conf`, as a user manager reads `~/.config/systemd/user.conf`; its
/// policies are `policy.d/` beside it. The system daemon (root) does not read them.
@Suite(.serialized) struct UserConfigurationTests {
    static let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

    /// uid 65534's configuration home, with `bgtaskd/bgtaskd.conf`, a drop-in and a policy.
    final class UserHome {
        let directory: String
        var config: String { directory + "/bgtaskd/bgtaskd.conf" }
        var environment: [String] { ["XDG_RUNTIME_DIR=\(directory)", "XDG_CONFIG_HOME=\(directory)", "PATH=/usr/bin:/bin"] }

        init() throws {
            directory = try temporaryDirectory("bgtaskd-home")
            for path in [directory + "/bgtaskd", config + ".d", directory + "/bgtaskd/policy.d"] {
                try systemCall("mkdir") { mkdir(path, 0o755) }
            }
            try write(config, "[Background]\nBackgroundTimeSec=7s\nExpirationWarningSec=3s\n")
            try write(config + ".d/10-mine.conf", "[Background]\nExpirationWarningSec=2s\n")
            try write(directory + "/bgtaskd/policy.d/50-sleep.policy", "[Match]\nExecutable=/usr/bin/sleep\n\n[Policy]\nExempt=yes\n")
            try Spawned("/bin/chown", ["-R", "65534:65534", directory]).wait(timeout: 10)
        }

        deinit { _ = try? Spawned("/bin/rm", ["-rf", directory]).wait(timeout: 10) }

        func write(_ path: String, _ text: String) throws { try writeFile(path, Array(text.utf8)) }
    }

    static func checkConfig(_ home: UserHome, asNobody: Bool, _ arguments: [String] = []) throws -> (Int32, String) {
        let command = (asNobody ? nobody : []) + [Binaries.path("bgtaskd")] + arguments + ["--check-config"]
        return try SystemdTests.run(command, environment: home.environment)
    }

    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon as uid 65534 (setpriv)"))
    func aPerUserDaemonReadsTheUsersOwnFileAfterTheAdmins() throws {
        let home = try UserHome()
        let (code, output) = try Self.checkConfig(home, asNobody: true, ["--set", "GrantLatencyMaxSec=5ms"])
        #expect(code == 0, "\(output)")
        let lines = Set(output.split(separator: "\n").map(String.init))
        #expect(lines.isSuperset(of: ["BackgroundTimeSec=7s", "ExpirationWarningSec=2s", "GrantLatencyMaxSec=5ms",
                                      "# \(home.directory)/bgtaskd/policy.d/50-sleep.policy"]), "\(output)")
        // The files read, in order, first: the admin's where there is one, then the user's.
        let admin = access("/etc/bgtaskd/bgtaskd.conf", F_OK) == 0 ? "/etc/bgtaskd/bgtaskd.conf, " : ""
        #expect(output.hasPrefix("# \(admin)\(home.config), \(home.config).d/10-mine.conf\n[Background]\n"), "\(output)")
        // Root's daemon, in the same environment, is the system daemon: neither is read.
        let (rootCode, roots) = try Self.checkConfig(home, asNobody: false)
        #expect(rootCode == 0 && !roots.contains("BackgroundTimeSec=7s") && !roots.contains("50-sleep"), "\(roots)")
        // `--config` replaces both.
        let other = home.directory + "/other.conf"
        try home.write(other, "[Background]\nBackgroundTimeSec=9s\n")
        let (_, given) = try Self.checkConfig(home, asNobody: true, ["--config", other])
        #expect(given.hasPrefix("# \(other)\n") && given.contains("BackgroundTimeSec=9s\n") && given.contains("ExpirationWarningSec=5s\n"), "\(given)")
        // A bad line in the user's file is an error naming it, as in the admin's.
        try home.write(home.config + ".d/20-bad.conf", "[Background]\nBackgroundTimeSec=soon\n")
        let (badCode, bad) = try Self.checkConfig(home, asNobody: true)
        #expect(badCode == 1 && bad.hasPrefix("bgtaskd: configuration error: \(home.config).d/20-bad.conf:2: BackgroundTimeSec: "), "\(bad)")
    }

    /// A running per-user daemon's reload reads the user's file again (a bad one is refused,
    /// naming it; a good one taken), as `systemctl --user reload bgtaskd` asks.
    @Test(.enabled(if: getuid() == 0, "needs root to run the daemon as uid 65534 (setpriv)"))
    func aPerUserDaemonsReloadReadsTheUsersFile() throws {
        let home = try UserHome()
        let directory = try temporaryDirectory("bgtaskd-own")
        try systemCall("chown") { chown(directory, 65534, 65534) }
        let daemon = try TestDaemon(["GrantLatencyMaxSec=5ms"], directory: directory,
                                    environment: Array(home.environment.dropLast()), wrapper: Self.nobody)
        let probe = try daemon.probe()
        func remaining() throws -> Double {
            try daemon.setState(probe.pid, "background")
            defer { try? daemon.setState(probe.pid, "foreground") }
            return try daemon.app(probe.pid)?["backgroundTimeRemaining"]?.doubleValue ?? -1
        }
        _ = try probe.begin("work")
        try waitUntil("the task granted") { try daemon.tasks().first?["state"] == "granted" }
        #expect(try (6.9...7).contains(remaining()))
        try home.write(home.config, "[Background]\nBackgroundTimeSec=soon\n")
        let refused = try daemon.ctl(["reload"], asUser: 65534)
        #expect(refused.0 == 1 && refused.1.contains(": \(home.config):2: BackgroundTimeSec: "), "\(refused)")
        try home.write(home.config, "[Background]\nBackgroundTimeSec=12s\n")
        #expect(try daemon.ctl(["reload"], asUser: 65534) == (0, ""))
        #expect(try (11.9...12).contains(remaining()))
    }
}
