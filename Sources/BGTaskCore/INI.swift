// SPDX-License-Identifier: Apache-2.0
/// systemd-style INI text: `[Section]` headers, `Key=Value` lines, `#`/`;` comments. Shared by
/// `bgtaskd.conf` and the policy files, so both read (and refuse) alike.
public enum INI {
    public struct Entry: Equatable, Sendable {
        public var section: String
        public var key: String
        public var value: String
        /// 1-based, for error messages.
        public var line: Int
    }

    /// Every `Key=Value` in order. A malformed line, a section not in `sections`, or a key
    /// outside a section is an error naming the line.
    public static func entries(of text: String, source: String, sections: Set<String>) throws(ConfigurationError) -> [Entry] {
        var entries: [Entry] = []
        var section: String?
        var number = 0
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: false) {
            number += 1
            let line = String(rawLine).trimmingASCIIWhitespace()
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]"), line.count > 2 else {
                    throw ConfigurationError(source: source, line: number, message: "malformed section header '\(line)'")
                }
                let name = String(line.dropFirst().dropLast())
                guard sections.contains(name) else {
                    throw ConfigurationError(source: source, line: number, message: "unknown section [\(name)]")
                }
                section = name
                continue
            }
            guard let equals = line.firstIndex(of: "=") else {
                throw ConfigurationError(source: source, line: number, message: "expected Key=Value, got '\(line)'")
            }
            let key = String(line[..<equals]).trimmingASCIIWhitespace()
            let value = String(line[line.index(after: equals)...]).trimmingASCIIWhitespace()
            guard let section else {
                throw ConfigurationError(source: source, line: number, message: "'\(key)' outside of a section")
            }
            entries.append(Entry(section: section, key: key, value: value, line: number))
        }
        return entries
    }
}
