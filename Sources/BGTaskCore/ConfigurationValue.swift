// SPDX-License-Identifier: Apache-2.0
/// Parsers and printers for systemd-style values: time spans and sizes.
public enum ConfigurationValue {
    private static let timeUnits: [(names: [String], nanoseconds: Double)] = [
        (["ns", "nsec"], 1),
        (["us", "usec", "µs", "μs"], 1e3),
        (["ms", "msec"], 1e6),
        (["s", "sec", "second", "seconds"], 1e9),
        (["m", "min", "minute", "minutes"], 60e9),
        (["h", "hr", "hour", "hours"], 3600e9),
        (["d", "day", "days"], 86400e9),
        (["w", "week", "weeks"], 604800e9),
    ]

    /// Parses a systemd time span (`30`, `30s`, `500ms`, `1min 5s`, `1.5s`); a bare number
    /// is seconds. Returns `nil` for anything else, including negative spans.
    /// systemd's booleans: `yes`/`no`, `true`/`false`, `on`/`off`, `1`/`0`.
    public static func parseBoolean(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "yes", "true", "on", "1": true
        case "no", "false", "off", "0": false
        default: nil
        }
    }

    public static func parseTimeSpan(_ text: String) -> Duration? {
        var rest = Substring(text.trimmingASCIIWhitespace())
        guard !rest.isEmpty else { return nil }
        var total = 0.0
        while !rest.isEmpty {
            let number = rest.prefix { $0.isASCII && ($0.isNumber || $0 == ".") }
            guard !number.isEmpty, let value = Double(number) else { return nil }
            rest = rest.dropFirst(number.count).drop { $0 == " " }
            let unit = rest.prefix { $0.isLetter || $0 == "µ" || $0 == "μ" }
            rest = rest.dropFirst(unit.count).drop { $0 == " " }
            if unit.isEmpty {
                total += value * 1e9
            } else if let factor = timeUnits.first(where: { $0.names.contains(String(unit)) })?.nanoseconds {
                total += value * factor
            } else {
                return nil
            }
        }
        guard total.isFinite, total < 1e18 else { return nil }
        return .nanoseconds(Int64(total.rounded()))
    }

    /// Prints a span the way systemd does: `30s`, `500ms`, `1min 5s`.
    public static func formatTimeSpan(_ span: Duration) -> String {
        var ns = span.nanoseconds
        if ns == 0 { return "0" }
        // One string grown in place (an array of parts joined cost ~1,900 instructions a
        // span: every app entering the background logs one).
        var text = ""
        func part(_ value: Int64, _ unit: StaticString) {
            if !text.isEmpty { text.append(" ") }
            text.append(String(value))
            text.append(unit.description)
        }
        for (unit, size) in timeSpanUnits where ns >= size {
            part(ns / size, unit)
            ns %= size
        }
        if ns > 0 { part(ns, "ns") }
        return text
    }

    private static let timeSpanUnits: [(StaticString, Int64)] = [
        ("d", 86_400_000_000_000), ("h", 3_600_000_000_000), ("min", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000),
    ]

    /// Parses a size in bytes: `65536`, `64K`, `1M`, `1G` (binary multiples, optional `B`/`iB`).
    public static func parseSize(_ text: String) -> Int? {
        var body = text.trimmingASCIIWhitespace().uppercased()
        if body.hasSuffix("IB") { body.removeLast(2) } else if body.hasSuffix("B") { body.removeLast() }
        var factor = 1
        switch body.last {
        case "K": factor = 1 << 10
        case "M": factor = 1 << 20
        case "G": factor = 1 << 30
        default: break
        }
        if factor != 1 { body.removeLast() }
        guard let value = Int(body), value >= 0 else { return nil }
        let (product, overflow) = value.multipliedReportingOverflow(by: factor)
        return overflow ? nil : product
    }

    /// Prints a size with the largest exact binary suffix: `64K`, `1M`, `1000`.
    public static func formatSize(_ bytes: Int) -> String {
        for (suffix, size) in [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)] where bytes >= size && bytes % size == 0 {
            return "\(bytes / size)\(suffix)"
        }
        return String(bytes)
    }
}

extension String {
    /// The string without leading and trailing spaces, tabs, CR and LF.
    func trimmingASCIIWhitespace() -> String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }
        return String(drop(while: isSpace).reversed().drop(while: isSpace).reversed())
    }
}
