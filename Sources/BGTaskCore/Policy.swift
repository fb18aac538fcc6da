// SPDX-License-Identifier: Apache-2.0
/// What an app is, for matching policies (DESIGN.md §2b): its unit's name and whose manager
/// the unit is, the path of its process's executable, its user.
public struct AppFacts: Equatable, Sendable {
    public var unit: String?
    /// Whether the unit is a user manager's (it lives under a `user@UID.service`), matched by
    /// `UserUnit=`; else the system's, matched by `Unit=`. Any user can make a cgroup of any
    /// name in its own subtree: a name alone proves nothing, where it lives does.
    public var userUnit: Bool
    /// The executable, only where the file at that path in the daemon's view is the one the
    /// process runs (same device and inode): a path seen through another mount namespace
    /// (a user's bind mount over `/usr/bin/sleep`) proves nothing.
    public var executable: String?
    public var uid: UInt32
    public var user: String?

    public init(unit: String? = nil, userUnit: Bool = false, executable: String? = nil, uid: UInt32, user: String? = nil) {
        self.unit = unit
        self.userUnit = userUnit
        self.executable = executable
        self.uid = uid
        self.user = user
    }

    /// Whether the unit cgroup at `path` is a user manager's.
    public static func isUserUnit(path: String) -> Bool {
        path.split(separator: "/").contains { $0.hasPrefix("user@") && $0.hasSuffix(".service") }
    }
}

/// One `*.policy` file, systemd-networkd style: `[Match]` (`Unit=` for the system's units,
/// `UserUnit=` for units of users' managers, as `journalctl -u`/`--user-unit`; `Executable=`, `User=`:
/// whitespace-separated globs, any of which may match; every key given must match; none
/// given matches every app) and `[Policy]` (`Exempt=`, `DailyBackgroundSec=`, `MaxTasks=`,
/// and the per-app keys of `bgtaskd.conf`'s `[Background]` and `[Enforcement]`).
public struct AppPolicy: Equatable, Sendable {
    /// The file's name without `.policy`, e.g. `50-terminal`.
    public var name: String
    public var file: String
    public var units: [String] = []
    public var userUnits: [String] = []
    public var executables: [String] = []
    public var users: [String] = []
    /// Never suspended or terminated for background time; tasks granted with no deadline.
    public var exempt = false
    /// Background time per `QuotaWindowSec`; `nil` is unlimited.
    public var dailyBackground: Duration?
    /// Concurrent tasks of the app; `nil` leaves `MaxTasksPerApp`.
    public var maxTasks: Int?
    /// The daemon's configuration with this policy's keys applied.
    public var configuration: Configuration
    /// The configuration keys this policy sets, in file order.
    public var overrides: [String] = []

    /// `bgtaskd.conf` keys a policy may set: those that are about one app. (The seed, the
    /// age warning, the limits and access are the daemon's.)
    public static let perAppKeys: Set<String> = [
        "BackgroundTimeSec", "ExpirationWarningSec", "TransitionTimeoutSec", "GrantLatencyMinSec", "GrantLatencyMaxSec", "WakeTimeSec",
        "SuspendMode", "IsolateApps", "TerminateSignal", "TerminateGraceSec",
        "RefreshTimeSec", "ProcessingTimeSec", "DailyLaunches",
    ]

    /// Parses a policy file's `text`; `file` is its path (errors name it and the line).
    public init(file: String, text: String, base: Configuration) throws(ConfigurationError) {
        let fileName = String(file.split(separator: "/").last ?? Substring(file))
        name = fileName.hasSuffix(".policy") ? String(fileName.dropLast(7)) : fileName
        self.file = file
        configuration = base
        func fail(_ line: Int, _ message: String) -> ConfigurationError {
            ConfigurationError(source: file, line: line, message: message)
        }
        for entry in try INI.entries(of: text, source: file, sections: ["Match", "Policy"]) {
            let words = entry.value.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
            switch (entry.section, entry.key) {
            case ("Match", "Unit"): units = words.isEmpty ? [] : units + words
            case ("Match", "UserUnit"): userUnits = words.isEmpty ? [] : userUnits + words
            case ("Match", "Executable"):
                guard words.allSatisfy({ $0.hasPrefix("/") || $0.hasPrefix("*") }) else {
                    throw fail(entry.line, "Executable: expected absolute paths (or globs), got '\(entry.value)'")
                }
                executables = words.isEmpty ? [] : executables + words
            case ("Match", "User"): users = words.isEmpty ? [] : users + words
            case ("Policy", "Exempt"):
                guard let value = ConfigurationValue.parseBoolean(entry.value) else {
                    throw fail(entry.line, "Exempt: expected yes or no, got '\(entry.value)'")
                }
                exempt = value
            case ("Policy", "DailyBackgroundSec"):
                if entry.value.isEmpty {
                    dailyBackground = nil
                } else {
                    guard let span = ConfigurationValue.parseTimeSpan(entry.value) else {
                        throw fail(entry.line, "DailyBackgroundSec: expected a time span such as 10min, got '\(entry.value)'")
                    }
                    dailyBackground = span
                }
            case ("Policy", "MaxTasks"):
                guard let value = Int(entry.value), value >= 1, value <= 1_000_000 else {
                    throw fail(entry.line, "MaxTasks: expected a whole number from 1 to 1000000, got '\(entry.value)'")
                }
                maxTasks = value
            case let ("Policy", key) where Self.perAppKeys.contains(key):
                let section = Configuration.key(named: key)!.section
                try configuration.apply(INI.Entry(section: section, key: key, value: entry.value, line: entry.line), source: file)
                overrides.append(key)
            case let (section, key):
                throw fail(entry.line, Configuration.key(named: key) != nil
                    ? "\(key) cannot be set per app" : "unknown key '\(key)' in [\(section)]")
            }
        }
        do {
            try configuration.validate()
        } catch {
            throw fail(0, error.message)
        }
    }

    /// Whether every `[Match]` key given matches `facts`.
    public func matches(_ facts: AppFacts) -> Bool {
        func any(_ patterns: [String], _ value: String?) -> Bool {
            patterns.isEmpty || value.map { value in patterns.contains { Glob.matches($0, value) } } ?? false
        }
        let user = users.isEmpty || users.contains { pattern in
            Glob.matches(pattern, String(facts.uid)) || facts.user.map { Glob.matches(pattern, $0) } == true
        }
        return any(units, facts.userUnit ? nil : facts.unit) && any(userUnits, facts.userUnit ? facts.unit : nil)
            && any(executables, facts.executable) && user
    }
}

/// The policies in force: the first, in lexical order of file name, that matches an app is
/// its policy.
public struct PolicySet: Equatable, Sendable {
    public private(set) var policies: [AppPolicy] = []

    public init() {}

    /// Parses every file (`path`, `text`), in lexical order of file name; the first bad one
    /// is an error naming it and its line.
    public init(files: [(path: String, text: String)], base: Configuration) throws(ConfigurationError) {
        let sorted = files.sorted { ($0.path.split(separator: "/").last ?? "") < ($1.path.split(separator: "/").last ?? "") }
        for file in sorted { policies.append(try AppPolicy(file: file.path, text: file.text, base: base)) }
    }

    public func policy(for facts: AppFacts) -> AppPolicy? {
        policies.first { $0.matches(facts) }
    }
}

/// Shell-style globs, as systemd matches unit names: `*` (any run, `/` included), `?` (one
/// character), `[abc]`, `[a-z]`, `[!abc]`.
public enum Glob {
    public static func matches(_ pattern: String, _ text: String) -> Bool {
        matches(Array(pattern.unicodeScalars)[...], Array(text.unicodeScalars)[...])
    }

    private static func matches(_ pattern: ArraySlice<Unicode.Scalar>, _ text: ArraySlice<Unicode.Scalar>) -> Bool {
        var p = pattern.startIndex, t = text.startIndex
        var star: (p: Int, t: Int)?  // backtrack point: the last `*` and where it resumed
        while t < text.endIndex {
            if p < pattern.endIndex, pattern[p] == "*" {
                star = (p, t)
                p += 1
                continue
            }
            if p < pattern.endIndex, let width = single(pattern[p...], matches: text[t]) {
                p += width
                t += 1
                continue
            }
            guard let resume = star else { return false }
            star = (resume.p, resume.t + 1)
            p = resume.p + 1
            t = resume.t + 1
        }
        while p < pattern.endIndex, pattern[p] == "*" { p += 1 }
        return p == pattern.endIndex
    }

    /// Whether the pattern's first element matches `character`; how many pattern scalars it
    /// took (`nil` if it does not match).
    private static func single(_ pattern: ArraySlice<Unicode.Scalar>, matches character: Unicode.Scalar) -> Int? {
        let first = pattern[pattern.startIndex]
        if first == "?" { return 1 }
        guard first == "[", let close = pattern.dropFirst(2).firstIndex(of: "]") else {
            return first == character ? 1 : nil
        }
        var set = pattern[(pattern.startIndex + 1)..<close]
        let negated = set.first == "!" || set.first == "^"
        if negated { set = set.dropFirst() }
        var found = false, i = set.startIndex
        while i < set.endIndex {
            if i + 2 < set.endIndex, set[i + 1] == "-" {
                if set[i] <= character, character <= set[i + 2] { found = true }
                i += 3
            } else {
                if set[i] == character { found = true }
                i += 1
            }
        }
        return found != negated ? close - pattern.startIndex + 1 : nil
    }
}

extension AppFacts {
    /// What an app's daily background time is kept by, so a relaunch does not reset it: its
    /// unit's name without an instance or a numeric suffix (`app-gnome-foo-1234.scope` →
    /// `app-gnome-foo.scope`, `foo@2.service` → `foo@.service`); for a process app, or a unit
    /// whose name is made up per run (`run-u42.scope`, `app-bgtaskd-PID.scope`), its uid and
    /// executable (the uid alone when the executable cannot be read: never a name the app
    /// could choose). Every key starts with the uid: users never share quota, whatever
    /// their units are called.
    public var quotaKey: String {
        if let unit, let key = Self.unitKey(unit) { return "uid \(uid) unit " + key }
        return "uid \(uid) " + (executable ?? "")
    }

    static func unitKey(_ name: String) -> String? {
        guard let dot = name.lastIndex(of: ".") else { return nil }
        var stem = String(name[..<dot])
        let suffix = String(name[dot...])
        if stem.hasPrefix("run-") || stem.hasPrefix("app-bgtaskd-") { return nil }
        if let at = stem.firstIndex(of: "@") { return String(stem[...at]) + suffix }
        while let dash = stem.lastIndex(of: "-"), stem[stem.index(after: dash)...].allSatisfy({ $0.isHexDigit }),
              stem.index(after: dash) < stem.endIndex {
            stem = String(stem[..<dash])
        }
        return stem.isEmpty ? nil : stem + suffix
    }
}
