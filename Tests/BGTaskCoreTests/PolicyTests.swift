import BGTaskCore
import Testing

/// Policy files (DESIGN.md §2b): parsing, matching and precedence. Not yet applied by the
/// daemon; these pin what it will apply.
@Suite struct PolicyTests {
    static let terminal = """
    # /etc/bgtaskd/policy.d/50-terminal.policy
    [Match]
    Unit=app-*Terminal*.scope vte-spawn-*.scope
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
        #expect(policy.units == ["app-*Terminal*.scope", "vte-spawn-*.scope"] && policy.executables == ["/usr/bin/foot"])
        #expect(policy.exempt && policy.dailyBackground == .seconds(600) && policy.maxTasks == 3)
        #expect(policy.configuration.backgroundTime == .seconds(180) && policy.overrides == ["BackgroundTimeSec"])
        #expect(policy.configuration.expirationWarning == Configuration().expirationWarning)  // the rest is the daemon's
    }

    @Test func everyKeyGivenMustMatchAndAnyValueOfAKeyMay() throws {
        let policy = try AppPolicy(file: "50-terminal.policy", text: Self.terminal, base: Configuration())
        let alice = AppFacts(unit: "vte-spawn-1234.scope", executable: "/usr/bin/foot", uid: 1000, user: "alice")
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
