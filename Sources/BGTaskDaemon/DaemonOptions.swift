// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// `bgtaskd [--config FILE] [--socket PATH] [--set KEY=VALUE]... [--check-config] [--version]`
public struct DaemonOptions: Sendable {
    public var configFile: String?
    public var socketPath: String?
    public var assignments: [String] = []
    public var checkConfig = false
    public var showVersion = false

    /// The system socket, used when neither `--socket` nor socket activation gives one.
    public static let systemSocketPath = "/run/bgtaskd/io.bgtaskd"
    public static let systemConfigFile = "/etc/bgtaskd/bgtaskd.conf"

    public static let usage = """
    Usage: bgtaskd [--config FILE] [--socket PATH] [--set KEY=VALUE]... [--check-config] [--version]

    Grants background tasks to Linux processes the way iOS does, over Varlink.

      --config FILE      read FILE (and FILE.d/*.conf) instead of \(systemConfigFile)
                         (and, for a per-user daemon, ~/.config/bgtaskd/bgtaskd.conf after it)
      --socket PATH      listen on PATH (default: systemd's socket, else \(systemSocketPath))
      --set KEY=VALUE    override one configuration key, e.g. --set BackgroundTimeSec=500ms
      --check-config     print the effective configuration and exit (non-zero if invalid)
      --version          print the version and exit
    """

    public struct UsageError: Error, CustomStringConvertible {
        public var description: String
    }

    public init() {}

    public static func parse(_ arguments: [String]) throws(UsageError) -> DaemonOptions {
        var options = DaemonOptions()
        var rest = arguments[...]
        func value(_ flag: String) throws(UsageError) -> String {
            guard let value = rest.popFirst() else { throw UsageError(description: "\(flag) needs a value") }
            return value
        }
        while let argument = rest.popFirst() {
            // Accept --flag=value too.
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "="),
               ["--config", "--socket", "--set"].contains(String(argument[..<equals])) {
                rest.insert(String(argument[argument.index(after: equals)...]), at: rest.startIndex)
                rest.insert(String(argument[..<equals]), at: rest.startIndex)
                continue
            }
            switch argument {
            case "--config": options.configFile = try value(argument)
            case "--socket": options.socketPath = try value(argument)
            case "--set": options.assignments.append(try value(argument))
            case "--check-config": options.checkConfig = true
            case "--version": options.showVersion = true
            case "-h", "--help": throw UsageError(description: usage)
            default: throw UsageError(description: "unknown argument '\(argument)'\n\n\(usage)")
            }
        }
        return options
    }

    /// The files read, in order: `--config FILE` or `/etc/bgtaskd/bgtaskd.conf`, each
    /// followed by its drop-ins; a per-user daemon's own `bgtaskd.conf` (`userDirectory`) and
    /// its drop-ins after the admin's, as a user manager reads `~/.config/systemd/user.conf`.
    public var configurationFiles: (main: [String], all: [String]) {
        let main = configFile.map { [$0] } ?? [Self.systemConfigFile] + (userDirectory.map { [$0 + "/bgtaskd.conf"] } ?? [])
        return (main, main.flatMap { [$0] + Self.dropIns(of: $0) })
    }

    /// Loads the configuration in DESIGN.md §4 order: defaults, the main file, its drop-ins
    /// (lexical order), a per-user daemon's own file and its drop-ins, then `--set`. Missing
    /// main files are fine; unreadable or bad ones are not. Returns the files read, in order,
    /// for `--check-config` and the reload's log line to name (listed once: a drop-in added
    /// meanwhile is not named unread).
    public func loadConfiguration() throws(ConfigurationError) -> (configuration: Configuration, read: [String]) {
        var configuration = Configuration()
        var read: [String] = []
        let files = configurationFiles
        for path in files.all {
            let bytes: [UInt8]
            do {
                bytes = try readFile(path)
            } catch {
                if error.isNotFound, files.main.contains(path) { continue }
                throw ConfigurationError(source: path, line: 0, message: "\(error)")
            }
            guard let text = String(validating: bytes, as: UTF8.self) else {
                throw ConfigurationError(source: path, line: 0, message: "not valid UTF-8")
            }
            try configuration.apply(fileText: text, source: path)
            read.append(path)
        }
        for assignment in assignments {
            try configuration.apply(assignment: assignment)
        }
        try configuration.validate()
        return (configuration, read)
    }

    /// A per-user daemon's own configuration directory, `$XDG_CONFIG_HOME/bgtaskd`
    /// (`~/.config/bgtaskd`); `nil` for the system daemon and with `--config`. Per-user: not
    /// root, and in a user's session (`$XDG_RUNTIME_DIR`, which a user manager and a login
    /// set; the system unit's transient user has none).
    public var userDirectory: String? {
        guard configFile == nil, Host.effectiveUID != 0, Host.environment("XDG_RUNTIME_DIR") != nil else { return nil }
        let config = Host.environment("XDG_CONFIG_HOME").flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? (Host.environment("HOME") ?? "/") + "/.config"
        return config + "/bgtaskd"
    }

    /// Where policy files live (DESIGN.md §2b): `policy.d/` beside `--config FILE`; else
    /// `/etc/bgtaskd/policy.d` for the system daemon, `$XDG_CONFIG_HOME/bgtaskd/policy.d` for a
    /// per-user one.
    public var policyDirectory: String {
        if let configFile {
            let directory = configFile.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
            return (directory.isEmpty ? "." : directory) + "/policy.d"
        }
        return (userDirectory ?? "/etc/bgtaskd") + "/policy.d"
    }

    /// A policy file is at most this long, and at most this many are read.
    static let maximumPolicyBytes = 64 * 1024
    static let maximumPolicies = 1024

    /// Every `*.policy` in `policyDirectory`, over `configuration`. A missing directory is
    /// no policies; a bad file is an error naming it and its line.
    public func loadPolicies(over configuration: Configuration) throws(ConfigurationError) -> PolicySet {
        let directory = policyDirectory
        let names = ProcessTree.directoryNames(directory).filter { $0.hasSuffix(".policy") && !$0.hasPrefix(".") }.sorted()
        guard names.count <= Self.maximumPolicies else {
            throw ConfigurationError(source: directory, line: 0, message: "more than \(Self.maximumPolicies) policy files")
        }
        var files: [(path: String, text: String)] = []
        for name in names {
            let path = directory + "/" + name
            let bytes: [UInt8]
            do {
                bytes = try readFile(path, limit: Self.maximumPolicyBytes + 1)
            } catch {
                throw ConfigurationError(source: path, line: 0, message: "\(error)")
            }
            guard bytes.count <= Self.maximumPolicyBytes else {
                throw ConfigurationError(source: path, line: 0, message: "longer than \(Self.maximumPolicyBytes) bytes")
            }
            guard let text = String(validating: bytes, as: UTF8.self) else {
                throw ConfigurationError(source: path, line: 0, message: "not valid UTF-8")
            }
            files.append((path, text))
        }
        return try PolicySet(files: files, base: configuration)
    }

    /// `FILE.d/*.conf`, sorted.
    static func dropIns(of file: String) -> [String] {
        let directory = file + ".d"
        return ProcessTree.directoryNames(directory)
            .filter { $0.hasSuffix(".conf") && !$0.hasPrefix(".") }
            .sorted()
            .map { "\(directory)/\($0)" }
    }
}
