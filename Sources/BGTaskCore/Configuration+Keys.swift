// SPDX-License-Identifier: Apache-2.0
/// One configuration key: where it lives, how to read it, how to print it.
public struct ConfigurationKey: Sendable {
    /// The INI section, e.g. `Background`.
    public var section: String
    /// The key, e.g. `BackgroundTimeSec`.
    public var name: String
    /// Applies a textual value; returns a reason when it is invalid.
    let apply: @Sendable (inout Configuration, String) -> String?
    /// Prints the current value as the config file would spell it.
    public let format: @Sendable (Configuration) -> String
}

/// A configuration error, naming where it came from: `FILE:LINE: message`.
public struct ConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The file (or `--set`) the value came from.
    public var source: String
    /// The 1-based line, or 0 when there is none.
    public var line: Int
    public var message: String

    public init(source: String, line: Int, message: String) {
        self.source = source
        self.line = line
        self.message = message
    }

    public var description: String { line > 0 ? "\(source):\(line): \(message)" : "\(source): \(message)" }
}

extension Configuration {
    /// Every key, in the order the shipped config file lists them.
    public static let keys: [ConfigurationKey] = [
        span("Background", "BackgroundTimeSec", \.backgroundTime),
        span("Background", "ExpirationWarningSec", \.expirationWarning),
        span("Background", "TransitionTimeoutSec", \.transitionTimeout),
        span("Background", "GrantLatencyMinSec", \.grantLatencyMin),
        span("Background", "GrantLatencyMaxSec", \.grantLatencyMax),
        ConfigurationKey(section: "Background", name: "GrantLatencySeed", apply: { config, text in
            if text.isEmpty { config.grantLatencySeed = nil; return nil }
            guard let seed = UInt64(text) else { return "expected an unsigned integer, got '\(text)'" }
            config.grantLatencySeed = seed
            return nil
        }, format: { $0.grantLatencySeed.map(String.init) ?? "" }),
        span("Background", "TaskAgeWarningSec", \.taskAgeWarning),
        span("Background", "WakeTimeSec", \.wakeTime),
        span("Background", "QuotaWindowSec", \.quotaWindow),
        choice("Background", "KeepAwake", \.keepAwake),
        span("Scheduling", "RefreshTimeSec", \.refreshTime),
        span("Scheduling", "ProcessingTimeSec", \.processingTime),
        span("Scheduling", "CoalesceWindowSec", \.coalesceWindow),
        ConfigurationKey(section: "Scheduling", name: "DailyLaunches", apply: { config, text in
            if text.isEmpty { config.dailyLaunches = nil; return nil }
            guard let value = Int(text), value >= 0, value <= BackgroundModel.maximumCountedLaunches else {
                return "expected a whole number from 0 to \(BackgroundModel.maximumCountedLaunches), or nothing for no limit, got '\(text)'"
            }
            config.dailyLaunches = value
            return nil
        }, format: { $0.dailyLaunches.map(String.init) ?? "" }),
        span("Scheduling", "RequestRetentionSec", \.requestRetention),
        ConfigurationKey(section: "Scheduling", name: "PowerSupplyPath", apply: { config, text in
            guard text.hasPrefix("/"), text.utf8.count <= 4096, !text.containsControlCharacters else {
                return "expected an absolute path, got '\(text)'"
            }
            config.powerSupplyPath = text
            return nil
        }, format: { $0.powerSupplyPath }),
        choice("Enforcement", "SuspendMode", \.suspendMode),
        choice("Enforcement", "IsolateApps", \.isolateApps),
        ConfigurationKey(section: "Enforcement", name: "TerminateSignal", apply: { config, text in
            guard let signal = TerminateSignal(parsing: text) else {
                return "expected a signal such as SIGKILL or SIGTERM, got '\(text)'"
            }
            config.terminateSignal = signal
            return nil
        }, format: { $0.terminateSignal.description }),
        span("Enforcement", "TerminateGraceSec", \.terminateGrace),
        count("Limits", "MaxApps", \.maxApps),
        count("Limits", "MaxAppsPerUser", \.maxAppsPerUser),
        count("Limits", "MaxTasksPerApp", \.maxTasksPerApp),
        count("Limits", "MaxTasksPerUser", \.maxTasksPerUser),
        count("Limits", "MaxConnectionsPerUser", \.maxConnectionsPerUser),
        count("Limits", "MaxTaskRequestsPerUser", \.maxTaskRequestsPerUser),
        count("Limits", "MaxTaskRequests", \.maxTaskRequests),
        ConfigurationKey(section: "Limits", name: "MaxMessageBytes", apply: { config, text in
            guard let size = ConfigurationValue.parseSize(text), size >= 1024, size <= 16 << 20 else {
                return "expected a size from 1K to 16M, got '\(text)'"
            }
            config.maxMessageBytes = size
            return nil
        }, format: { ConfigurationValue.formatSize($0.maxMessageBytes) }),
        ConfigurationKey(section: "Access", name: "ManagerGroup", apply: { config, text in
            guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }) else {
                return "expected a group name, got '\(text)'"
            }
            config.managerGroup = text
            return nil
        }, format: { $0.managerGroup }),
    ]

    private static func span(_ section: String, _ name: String,
                             _ path: WritableKeyPath<Configuration, Duration> & Sendable) -> ConfigurationKey {
        ConfigurationKey(section: section, name: name, apply: { config, text in
            guard let span = ConfigurationValue.parseTimeSpan(text) else {
                return "expected a time span such as 30s, 500ms or 1min 5s, got '\(text)'"
            }
            config[keyPath: path] = span
            return nil
        }, format: { ConfigurationValue.formatTimeSpan($0[keyPath: path]) })
    }

    /// One of an enum's values, by name.
    private static func choice<Value: RawRepresentable<String> & CaseIterable & Sendable>(
        _ section: String, _ name: String, _ path: WritableKeyPath<Configuration, Value> & Sendable
    ) -> ConfigurationKey {
        ConfigurationKey(section: section, name: name, apply: { config, text in
            guard let value = Value(rawValue: text) else {
                return "expected one of \(Value.allCases.map(\.rawValue).joined(separator: ", ")), got '\(text)'"
            }
            config[keyPath: path] = value
            return nil
        }, format: { $0[keyPath: path].rawValue })
    }

    private static func count(_ section: String, _ name: String,
                              _ path: WritableKeyPath<Configuration, Int> & Sendable) -> ConfigurationKey {
        ConfigurationKey(section: section, name: name, apply: { config, text in
            guard let value = Int(text), value >= 1, value <= 10_000_000 else {
                return "expected a whole number from 1 to 10000000, got '\(text)'"
            }
            config[keyPath: path] = value
            return nil
        }, format: { String($0[keyPath: path]) })
    }

    /// The key named `name` (case-sensitive, as systemd's are).
    public static func key(named name: String) -> ConfigurationKey? {
        keys.first { $0.name == name }
    }

    /// Applies `--set KEY=VALUE`.
    public mutating func apply(assignment: String, source: String = "--set") throws(ConfigurationError) {
        guard let equals = assignment.firstIndex(of: "=") else {
            throw ConfigurationError(source: source, line: 0, message: "expected KEY=VALUE, got '\(assignment)'")
        }
        let name = String(assignment[..<equals]).trimmingASCIIWhitespace()
        let value = String(assignment[assignment.index(after: equals)...]).trimmingASCIIWhitespace()
        guard let key = Self.key(named: name) else {
            throw ConfigurationError(source: source, line: 0, message: "unknown key '\(name)'")
        }
        if let problem = key.apply(&self, value) {
            throw ConfigurationError(source: source, line: 0, message: "\(name): \(problem)")
        }
    }

    /// Applies an INI file's text (`[Section]`, `Key=Value`, `#`/`;` comments); names the line of
    /// the first bad key or value.
    public mutating func apply(fileText text: String, source: String) throws(ConfigurationError) {
        for entry in try INI.entries(of: text, source: source, sections: Set(Self.keys.map(\.section))) {
            try apply(entry, source: source)
        }
    }

    /// Applies one `Key=Value` of an INI file.
    mutating func apply(_ entry: INI.Entry, source: String) throws(ConfigurationError) {
        guard let key = Self.keys.first(where: { $0.name == entry.key && $0.section == entry.section }) else {
            throw ConfigurationError(source: source, line: entry.line, message: "unknown key '\(entry.key)' in [\(entry.section)]")
        }
        if let problem = key.apply(&self, entry.value) {
            throw ConfigurationError(source: source, line: entry.line, message: "\(entry.key): \(problem)")
        }
    }

    /// Checks across keys, once every source is applied (so the order of `--set` flags does
    /// not matter).
    public func validate() throws(ConfigurationError) {
        if grantLatencyMin > grantLatencyMax {
            throw ConfigurationError(source: "configuration", line: 0, message:
                "GrantLatencyMinSec=\(ConfigurationValue.formatTimeSpan(grantLatencyMin)) is greater than GrantLatencyMaxSec=\(ConfigurationValue.formatTimeSpan(grantLatencyMax))")
        }
        if backgroundTime == .zero {
            throw ConfigurationError(source: "configuration", line: 0, message: "BackgroundTimeSec must be greater than 0")
        }
    }

    /// The effective configuration as an INI file, every key spelled out.
    public func rendered() -> String {
        var out = ""
        var section = ""
        for key in Self.keys {
            if key.section != section {
                if !out.isEmpty { out += "\n" }
                out += "[\(key.section)]\n"
                section = key.section
            }
            out += "\(key.name)=\(key.format(self))\n"
        }
        return out
    }
}
