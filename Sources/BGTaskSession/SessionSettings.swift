// SPDX-License-Identifier: Apache-2.0
import BGTaskCore

/// `$XDG_CONFIG_HOME/bgtaskd/session.conf`, read by the rules of `bgtaskd.conf` (INI, a
/// `[Session]` section, systemd time spans; an error names file:line):
///
///     [Session]
///     FocusMode=visible        # or focused
///     BackgroundDelaySec=5s    # 0 allowed
///     Compositor=auto          # sway, wlr or none
public struct SessionSettings: Equatable, Sendable {
    public enum Compositor: String, Sendable, CaseIterable { case auto, sway, wlr, none }

    public var focusMode: SessionModel.FocusMode = .visible
    public var backgroundDelay: Duration = .seconds(5)
    public var compositor: Compositor = .auto

    public init() {}

    public static let keys = ["FocusMode", "BackgroundDelaySec", "Compositor"]

    /// The settings of `text` (the file `source`) over the defaults.
    public static func parse(_ text: String, source: String) throws(ConfigurationError) -> SessionSettings {
        var settings = SessionSettings()
        for entry in try INI.entries(of: text, source: source, sections: ["Session"]) {
            do {
                try settings.set(entry.key, entry.value)
            } catch let error {
                throw ConfigurationError(source: source, line: entry.line, message: error.message)
            }
        }
        return settings
    }

    /// One key, from the file or `--set KEY=VALUE`.
    public mutating func set(_ key: String, _ value: String) throws(ConfigurationError) {
        switch key {
        case "FocusMode":
            guard let mode = SessionModel.FocusMode(rawValue: value) else {
                throw ConfigurationError(source: "", line: 0, message: "FocusMode must be visible or focused, not '\(value)'")
            }
            focusMode = mode
        case "BackgroundDelaySec":
            guard let span = ConfigurationValue.parseTimeSpan(value), span <= .seconds(86_400) else {
                throw ConfigurationError(source: "", line: 0, message: "BackgroundDelaySec: '\(value)' is not a time span of at most a day")
            }
            backgroundDelay = span
        case "Compositor":
            guard let compositor = Compositor(rawValue: value) else {
                throw ConfigurationError(source: "", line: 0, message: "Compositor must be auto, sway, wlr or none, not '\(value)'")
            }
            self.compositor = compositor
        default:
            throw ConfigurationError(source: "", line: 0, message: "unknown key '\(key)' (known: \(Self.keys.joined(separator: ", ")))")
        }
    }
}
