// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// Policy files (DESIGN.md §2b): parsing, matching and precedence. Not yet applied by the
/// daemon; these pin what it will apply.
@Suite struct PolicyTests {
    static let terminal = """
    # /etc/bgtaskd/policy.d/50-terminal.policy
    [Match]
    UserUnit=app-*Terminal*.scope vte-spawn-*.scope
    Executable=/usr/bin/foot
    User=alice

    [Policy]
    Exempt=yes
    BackgroundTimeSec=3min
    DailyBackgroundSec=10min
    MaxTasks=3
    """

    @Test func aPolicyFileParsesIntoItsRules() throws {
        let policy = try AppPolicy(file: "/etc/bgtaskd/policy.d/50-terminal.policy", text: Self.terminal, base: Configuration())
        #expect(policy.name == "50-terminal")
        #expect(policy.userUnits == ["app-*Terminal*.scope", "vte-spawn-*.scope"] && policy.executables == ["/usr/bin/foot"])
        #expect(policy.exempt && policy.dailyBackground == .seconds(600) && policy.maxTasks == 3)
        #expect(policy.configuration.backgroundTime == .seconds(180) && policy.overrides == ["BackgroundTimeSec"])
        #expect(policy.configuration.expirationWarning == Configuration().expirationWarning)  // the rest is the daemon's
    }

    @Test func everyKeyGivenMustMatchAndAnyValueOfAKeyMay() throws {
        let policy = try AppPolicy(file: "50-terminal.policy", text: Self.terminal, base: Configuration())
        let alice = AppFacts(unit: "vte-spawn-1234.scope", userUnit: true, executable: "/usr/bin/foot", uid: 1000, user: "alice")
        #expect(policy.matches(alice))
        var other = alice
        other.user = "bob"
        #expect(!policy.matches(other))
        other = alice
        other.unit = nil  // a process app: a Unit= policy cannot match it
        #expect(!policy.matches(other))
        let byUID = try AppPolicy(file: "x.policy", text: "[Match]\nUser=1000\n", base: Configuration())
        #expect(byUID.matches(AppFacts(uid: 1000)) && !byUID.matches(AppFacts(uid: 1001)))
        let everyone = try AppPolicy(file: "99-all.policy", text: "[Policy]\nMaxTasks=2\n", base: Configuration())
        #expect(everyone.matches(AppFacts(uid: 0)))
    }

    /// Finding 9 of the second review: `mkdir cron.service` in a user's own subtree claimed a
    /// `Unit=cron.service` policy meant for the system's cron. `Unit=` is the system's units,
    /// `UserUnit=` users' managers' (as journalctl's `-u` and `--user-unit`).
    @Test func aUnitPolicyMatchesWhereTheUnitLivesNotItsNameAlone() throws {
        let cron = try AppPolicy(file: "50-cron.policy", text: "[Match]\nUnit=cron.service\n[Policy]\nExempt=yes\n", base: Configuration())
        let path = "/user.slice/user-65534.slice/user@65534.service/cron.service"
        #expect(AppFacts.isUserUnit(path: path) && !AppFacts.isUserUnit(path: "/system.slice/cron.service"))
        #expect(cron.matches(AppFacts(unit: "cron.service", userUnit: false, uid: 0)))
        #expect(!cron.matches(AppFacts(unit: "cron.service", userUnit: true, uid: 65534)))
        let apps = try AppPolicy(file: "50-apps.policy", text: "[Match]\nUserUnit=app-*.scope\n", base: Configuration())
        #expect(apps.matches(AppFacts(unit: "app-foo-1.scope", userUnit: true, uid: 1000)))
        #expect(!apps.matches(AppFacts(unit: "app-foo-1.scope", userUnit: false, uid: 0)))
    }

    @Test func theFirstFileInLexicalOrderWins() throws {
        let set = try PolicySet(files: [
            ("/etc/bgtaskd/policy.d/90-default.policy", "[Policy]\nBackgroundTimeSec=10s\n"),
            ("/etc/bgtaskd/policy.d/10-player.policy", "[Match]\nExecutable=/usr/bin/mpv\n[Policy]\nExempt=yes\n"),
        ], base: Configuration())
        #expect(set.policy(for: AppFacts(executable: "/usr/bin/mpv", uid: 1000))?.name == "10-player")
        #expect(set.policy(for: AppFacts(executable: "/usr/bin/vim", uid: 1000))?.name == "90-default")
        #expect(PolicySet().policy(for: AppFacts(uid: 0)) == nil)
    }

    @Test(arguments: [
        ("[Match]\nColour=blue\n", 2, "unknown key 'Colour' in [Match]"),
        ("[Policy]\nExempt=perhaps\n", 2, "Exempt: expected yes or no"),
        ("[Policy]\n\nMaxTasks=0\n", 3, "MaxTasks: expected a whole number"),
        ("[Policy]\nBackgroundTimeSec=soon\n", 2, "BackgroundTimeSec: expected a time span"),
        ("[Policy]\nMaxApps=3\n", 2, "MaxApps cannot be set per app"),
        ("[Match]\nExecutable=foot\n", 2, "Executable: expected absolute paths"),
        ("[Background]\nBackgroundTimeSec=1s\n", 1, "unknown section [Background]"),
        ("Exempt=yes\n", 1, "outside of a section"),
    ] as [(String, Int, String)])
    func aBadFileNamesItselfAndTheLine(text: String, line: Int, message: String) {
        #expect {
            _ = try AppPolicy(file: "/etc/bgtaskd/policy.d/bad.policy", text: text, base: Configuration())
        } throws: { error in
            let error = error as? ConfigurationError
            return error?.source == "/etc/bgtaskd/policy.d/bad.policy" && error?.line == line
                && error?.message.contains(message) == true
        }
    }

    @Test(arguments: [
        ("app-*Terminal*.scope", "app-org.gnome.Terminal-1234.scope", true), ("app-*.scope", "app-foo.service", false),
        ("vte-spawn-?.scope", "vte-spawn-1.scope", true), ("vte-spawn-?.scope", "vte-spawn-12.scope", false),
        ("[a-c]x", "bx", true), ("[!a-c]x", "bx", false), ("[!a-c]x", "dx", true), ("/usr/bin/*", "/usr/bin/x/y", true),
        ("*", "", true), ("", "", true), ("a*b*c", "aXbYc", true), ("a*b*c", "aXbY", false), ("**x", "yyx", true),
    ] as [(String, String, Bool)])
    func globsMatchAsTheShellDoes(pattern: String, text: String, matches: Bool) {
        #expect(Glob.matches(pattern, text) == matches)
    }
}

/// What a policy does to its app in the model, with explicit instants.
@Suite struct PolicyModelTests {
    static func policy(_ text: String) throws -> AppPolicy {
        try AppPolicy(file: "/etc/bgtaskd/policy.d/50-test.policy", text: text, base: ModelHarness().model.configuration)
    }

    mutating func register(_ harness: inout ModelHarness, pid: Int32, policy: AppPolicy?) throws -> ProcessIdentity {
        try harness.model.register(harness.process(pid: pid), policy: policy, at: harness.now, effects: &harness.effects)
    }

    @Test mutating func anExemptAppIsNeverSuspendedNorTerminatedForTime() throws {
        var harness = ModelHarness()  // budget 30 s
        let exempt = try register(&harness, pid: 100, policy: try Self.policy("[Policy]\nExempt=yes\n"))
        let plain = try register(&harness, pid: 200, policy: nil)
        let task = try harness.begin(exempt)
        harness.at(0.05)
        for app in [exempt, plain] { try harness.background(app) }
        #expect(harness.state(plain) == .suspended)  // idle: suspended at once
        #expect(harness.state(exempt) == .background && harness.phase(exempt) == .running)
        #expect(harness.model.backgroundTimeRemaining(of: exempt, at: harness.now) == nil)  // unlimited
        harness.at(3600)
        #expect(harness.taskState(task) == .granted && harness.state(exempt) == .background)
        try harness.end(task, in: exempt)  // its last task ends: still not suspended
        #expect(harness.state(exempt) == .background)
        #expect(harness.model.snapshot(of: exempt, at: harness.now)?.exempt == true)
        try harness.model.terminate(exempt, at: harness.now, effects: &harness.effects)  // a manager still may
        #expect(harness.state(exempt) == nil)
    }

    /// The grant latency and task-age warning in force are read where they are kept
    /// (`BackgroundModel.spans`): a reload's apply from the next task and the next deadline,
    /// a policy's latency to its app's tasks only.
    @Test mutating func aReloadsAndAPolicysLatencyAndAgeWarningApply() throws {
        var harness = ModelHarness { $0.taskAgeWarning = .seconds(30) }  // latency 50 ms
        let slow = try register(&harness, pid: 100, policy: try Self.policy("[Policy]\nGrantLatencyMinSec=3s\nGrantLatencyMaxSec=3s\n"))
        let plain = try register(&harness, pid: 200, policy: nil)
        let before = try harness.begin(plain)
        var configuration = harness.model.configuration
        configuration.grantLatencyMin = .seconds(2)
        configuration.grantLatencyMax = .seconds(2)
        configuration.taskAgeWarning = .seconds(10)
        harness.model.reload(configuration)
        let after = try harness.begin(plain)
        let policys = try harness.begin(slow)
        harness.at(1.999)
        #expect(harness.taskState(before) == .granted && harness.taskState(after) == .pending)
        harness.at(2)
        #expect(harness.taskState(after) == .granted && harness.taskState(policys) == .pending)
        harness.at(3)
        #expect(harness.taskState(policys) == .granted)
        _ = harness.take()
        #expect(harness.model.nextDeadline() == .seconds(10))  // all begun at 0: the new age
        harness.at(10)
        let warned = harness.take().compactMap { if case let .log(entry) = $0, entry.kind == .taskAgeWarning { entry.taskID } else { nil } }
        #expect(Set(warned) == [before, after, policys])
    }

    @Test mutating func aPolicysBudgetAndMaxTasksAreTheAppsOwn() throws {
        var harness = ModelHarness()
        let app = try register(&harness, pid: 100, policy: try Self.policy("[Policy]\nBackgroundTimeSec=3s\nMaxTasks=2\n"))
        _ = try harness.begin(app)
        _ = try harness.begin(app)
        #expect(throws: BGTaskError.limitExceeded("MaxTasks=2 of policy 50-test reached")) { try harness.begin(app) }
        harness.at(0.05)
        try harness.background(app)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(3))
        harness.at(0.05)  // warned at once: 3 s is less than the 5 s warning
        harness.at(3.05)  // its deadline, not the daemon's 30 s
        #expect(harness.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
    }

    @Test mutating func aReloadedPolicyAppliesFromTheNextBackgroundPeriod() throws {
        var harness = ModelHarness()
        let app = try register(&harness, pid: 100, policy: nil)
        _ = try harness.begin(app)
        harness.at(0.05)
        try harness.background(app)
        harness.model.setPolicy(try Self.policy("[Policy]\nBackgroundTimeSec=3s\n"), quotaKey: nil, of: app, at: harness.now)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(30))  // this period
        try harness.foreground(app)
        try harness.background(app)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(3))
        #expect(harness.model.snapshot(of: app, at: harness.now)?.policy == "50-test")
    }
}

/// The daily background-time quota, with explicit instants (DESIGN.md §2b).
@Suite struct QuotaModelTests {
    /// 10 s a day, a 30 s budget, a warning 1 s before the deadline; the window is 100 s here.
    static func harness() -> ModelHarness {
        ModelHarness { $0.quotaWindow = .seconds(100); $0.expirationWarning = .seconds(1) }
    }

    static func quotaPolicy(_ harness: ModelHarness) throws -> AppPolicy {
        try AppPolicy(file: "50-quota.policy", text: "[Policy]\nDailyBackgroundSec=10s\n", base: harness.model.configuration)
    }

    mutating func app(_ harness: inout ModelHarness, pid: Int32) throws -> ProcessIdentity {
        try harness.model.register(harness.process(pid: pid), policy: try Self.quotaPolicy(harness), quotaKey: "uid 1000 /usr/bin/app",
                                   at: harness.now, effects: &harness.effects)
    }

    @Test mutating func overlappingTasksCountOnceAndOnlyWhileHeldInTheBackground() throws {
        var harness = Self.harness()
        let app = try self.app(&harness, pid: 100)
        let first = try harness.begin(app), second = try harness.begin(app)
        harness.at(5)  // granted, in the foreground: nothing counts
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(10))
        try harness.background(app)
        harness.at(7)  // two tasks held for 2 s: 2 s used, not 4
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(8))
        try harness.end(first, in: app)
        harness.at(8)
        try harness.end(second, in: app)  // suspended: counting stops
        harness.at(20)
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(7))
        #expect(harness.model.snapshot(of: app, at: harness.now)?.backgroundQuotaRemaining == .seconds(7))
    }

    /// Counting follows what is held as it changes without a suspension between: it stops
    /// when the last granted task ends while another waits for its grant, and starts again
    /// at that grant (each settled with the end's and the grant's own change of the record).
    @Test mutating func countingStopsAtAnEndAndStartsAgainAtTheNextGrant() throws {
        var harness = Self.harness()
        let app = try self.app(&harness, pid: 100)
        let first = try harness.begin(app)
        harness.at(0.5)  // granted
        harness.at(1)
        try harness.background(app)
        harness.at(3)
        let second = try harness.begin(app)  // pending until 3.05
        try harness.end(first, in: app)  // 2 s held (1 to 3); nothing granted now
        #expect(harness.taskState(second) == .pending && harness.state(app) == .background)
        harness.at(3.05)  // granted: held again from here
        harness.at(6.05)
        #expect(harness.model.quotaRemaining(of: app, at: harness.now) == .seconds(5))
    }

    /// An app with the quota, holding a task, moved to the background at instant 1.
    mutating func heldInTheBackground(_ harness: inout ModelHarness) throws -> ProcessIdentity {
        let app = try self.app(&harness, pid: 100)
        _ = try harness.begin(app)
        harness.at(1)
        try harness.background(app)
        return app
    }

    @Test mutating func theDeadlineIsCutShortByTheQuotaAndAtZeroBeginTaskIsRefused() throws {
        var harness = Self.harness()
        let app = try self.heldInTheBackground(&harness)
        #expect(harness.model.backgroundTimeRemaining(of: app, at: harness.now) == .seconds(10))  // not the 30 s budget
        harness.at(10)  // warned
        harness.at(11)  // held to the quota's deadline: terminated
        #expect(harness.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
        // Relaunched: a new process of the same app key has nothing left.
        let again = try self.app(&harness, pid: 200)
        try harness.background(again)
        #expect(harness.model.quotaRemaining(of: again, at: harness.now) == .zero)
        #expect(throws: BGTaskError.noBackgroundTime) { try harness.begin(again) }
        // The rolling window gives the time back as it moves past the use.
        harness.at(105)
        #expect(harness.model.quotaRemaining(of: again, at: harness.now) == .seconds(4))
        harness.at(111)
        #expect(harness.model.quotaRemaining(of: again, at: harness.now) == .seconds(10))
    }

    /// Finding 12 of the second review (rule 7a): with no quota left, an app holding a task
    /// begun in the foreground was terminated 3 ms after entering the background, unwarned.
    /// Now it is warned at once and terminated no sooner than the minimum grace after.
    @Test(arguments: [0.0, 0.01]) mutating func withLittleOrNoQuotaLeftTheWarningComesAndThenTheGrace(left: Double) throws {
        var harness = Self.harness()
        var app = try self.heldInTheBackground(&harness)
        harness.at(10)  // warned
        if left == 0 {
            harness.at(11)  // used up, terminated: relaunched, with a task begun in the foreground
            app = try self.app(&harness, pid: 200)
            _ = try harness.begin(app)
            harness.at(11.1)
        } else {
            harness.at(11 - left)  // all but `left` of the 10 s used
            try harness.foreground(app)
        }
        _ = harness.take()
        try harness.background(app)
        harness.at(Double(harness.now.nanoseconds) / 1e9)
        let events = harness.take()
        #expect(events.lifecycle.contains { if case .taskExpiring = $0 { true } else { false } })
        #expect(events.actions.isEmpty)
        let warnedAt = harness.now
        harness.at((Double(warnedAt.nanoseconds) / 1e9) + BackgroundModel.minimumGrace.seconds - 0.001)
        #expect(harness.take().actions.isEmpty)  // the handler's time: it can still end its task
        harness.at((Double(warnedAt.nanoseconds) / 1e9) + BackgroundModel.minimumGrace.seconds)
        #expect(harness.take().actions.map(\.1) == [.assertionsBeyondPermittedTime])
    }

    @Test mutating func usageSurvivesARestart() throws {
        var harness = Self.harness()
        let app = try self.heldInTheBackground(&harness)
        harness.at(4)  // 3 s used so far, still holding
        var restored = Self.harness()
        restored.model.restore(harness.model.savedState(), at: harness.now, effects: &restored.effects)
        restored.model.setPolicy(try Self.quotaPolicy(restored), quotaKey: "uid 1000 /usr/bin/app", of: app, at: .seconds(6))
        #expect(restored.model.quotaRemaining(of: app, at: .seconds(6)) == .seconds(5))  // 5 s held in all
        #expect(harness.model.takeQuotaChanges().isEmpty)  // nothing recorded until it stops holding
    }
}

@Suite struct QuotaKeyTests {
    @Test(arguments: [
        ("app-gnome-org.gnome.Terminal-1234.scope", "uid 1000 unit app-gnome-org.gnome.Terminal.scope"),
        ("foo@2.service", "uid 1000 unit foo@.service"), ("cron.service", "uid 1000 unit cron.service"),
        ("run-u42.scope", "uid 1000 /usr/bin/app"), ("app-bgtaskd-77.scope", "uid 1000 /usr/bin/app"),
    ] as [(String, String)])
    func aRelaunchKeepsItsKey(unit: String, key: String) {
        #expect(AppFacts(unit: unit, executable: "/usr/bin/app", uid: 1000).quotaKey == key)
    }

    @Test func withoutAReadableExecutableTheUidAloneIsTheKey() {
        #expect(AppFacts(executable: nil, uid: 1000).quotaKey == "uid 1000 ")
    }

    /// Finding 3 of the second review: two users running a unit of one name (uid 65534's own
    /// `app-gnome-firefox-9999.scope`) never share quota.
    @Test func usersRunningUnitsOfOneNameHaveKeysOfTheirOwn() {
        let mine = AppFacts(unit: "app-gnome-firefox-1.scope", executable: "/usr/bin/firefox", uid: 65533).quotaKey
        let theirs = AppFacts(unit: "app-gnome-firefox-9999.scope", executable: "/usr/bin/firefox", uid: 65534).quotaKey
        #expect(mine != theirs)
        #expect(BackgroundModel.quotaOwner(ofKey: mine) == 65533 && BackgroundModel.quotaOwner(ofKey: theirs) == 65534)
    }
}

/// Finding 4 of the second review: minting keys (hard links of one binary) neither grows the
/// table nor gives anyone time back, the minting user's own used-up keys included.
@Suite struct QuotaBoundTests {
    static let policy = try! AppPolicy(file: "q.policy", text: "[Policy]\nDailyBackgroundSec=10s\n", base: Configuration())

    /// Registers an app of `uid` under `key` and has it hold a task in the background for
    /// `seconds` from now; the app is gone after (its key stays).
    static func use(_ harness: inout ModelHarness, pid: Int32, uid: UInt32, key: String, seconds: Double) throws {
        let app = try harness.model.register(harness.process(pid: pid, uid: uid), policy: policy, quotaKey: key,
                                             at: harness.now, effects: &harness.effects)
        let start = (Double(harness.now.nanoseconds) / 1e9)
        _ = try harness.begin(app)
        harness.at(start + 0.06)  // granted
        try harness.background(app)
        harness.at(start + 0.06 + seconds)
        if harness.model.isApp(app) {  // else terminated at the quota's deadline
            try harness.foreground(app)
            harness.model.processExited(app, at: harness.now, effects: &harness.effects)
        }
        _ = harness.take()
    }

    /// What a new app of `uid` under `key` has left now.
    static func left(_ harness: inout ModelHarness, uid: UInt32, key: String) throws -> Duration? {
        let app = try harness.model.register(harness.process(pid: 99_999, uid: uid), policy: policy, quotaKey: key,
                                             at: harness.now, effects: &harness.effects)
        defer { harness.model.processExited(app, at: harness.now, effects: &harness.effects) }
        return harness.model.quotaRemaining(of: app, at: harness.now)
    }

    @Test func aUserMintingKeysEvictsOnlyItsOwnAndGetsNoTimeBack() throws {
        var harness = ModelHarness { $0.quotaWindow = .seconds(100_000) }
        try Self.use(&harness, pid: 10, uid: 2000, key: "uid 2000 /usr/bin/victim", seconds: 10)
        try Self.use(&harness, pid: 11, uid: 1000, key: "uid 1000 /usr/bin/used", seconds: 10)
        for index in 0..<(BackgroundModel.maximumQuotaKeysPerUser + 20) {
            try Self.use(&harness, pid: Int32(100 + index), uid: 1000, key: "uid 1000 /tmp/link\(index)", seconds: 0.01)
        }
        #expect(harness.model.quotaKeysByUID[1000]!.count <= BackgroundModel.maximumQuotaKeysPerUser)
        #expect(try Self.left(&harness, uid: 2000, key: "uid 2000 /usr/bin/victim") == .zero)
        #expect(try Self.left(&harness, uid: 1000, key: "uid 1000 /usr/bin/used") == .zero)
        // The window passing gives time back, as it does for any key.
        harness.at((Double(harness.now.nanoseconds) / 1e9) + 100_001)
        #expect(try Self.left(&harness, uid: 1000, key: "uid 1000 /usr/bin/used") == .seconds(10))
    }

    @Test func theTableIsBoundedAcrossUsersAndNobodyGetsTimeBack() throws {
        var harness = ModelHarness { $0.quotaWindow = .seconds(100_000) }
        try Self.use(&harness, pid: 10, uid: 2000, key: "uid 2000 /usr/bin/victim", seconds: 10)
        let users = BackgroundModel.maximumQuotaKeys / BackgroundModel.maximumQuotaKeysPerUser + 1
        var pid: Int32 = 100
        for user in 0..<users {
            for index in 0..<BackgroundModel.maximumQuotaKeysPerUser {
                pid += 1
                let uid = UInt32(3000 + user)
                try Self.use(&harness, pid: pid, uid: uid, key: "uid \(uid) /tmp/link\(index)", seconds: 0.001)
            }
        }
        #expect(harness.model.quotaUsage.count <= BackgroundModel.maximumQuotaKeys)
        #expect(try Self.left(&harness, uid: 2000, key: "uid 2000 /usr/bin/victim") == .zero)
    }
}
