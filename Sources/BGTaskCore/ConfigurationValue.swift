// SPDX-License-Identifier: Apache-2.0
/// Parsers and printers for systemd-style values: time spans and sizes.
public enum ConfigurationValue {
    private static let timeUnits: [(names: [String], nanoseconds: Int64)] = [
        (["ns", "nsec"], 1),
        (["us", "usec", "µs", "μs"], 1_000),
        (["ms", "msec"], 1_000_000),
        (["s", "sec", "second", "seconds"], 1_000_000_000),
        (["m", "min", "minute", "minutes"], 60_000_000_000),
        (["h", "hr", "hour", "hours"], 3_600_000_000_000),
        (["d", "day", "days"], 86_400_000_000_000),
        (["w", "week", "weeks"], 604_800_000_000_000),
    ]

    /// systemd's booleans: `yes`/`no`, `true`/`false`, `on`/`off`, `1`/`0`.
    public static func parseBoolean(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "yes", "true", "on", "1": true
        case "no", "false", "off", "0": false
        default: nil
        }
    }

    /// Parses a systemd time span (`30`, `30s`, `500ms`, `1min 5s`, `1.5s`); a bare number
    /// is seconds. Returns `nil` for anything else, including negative spans and spans of
    /// 10^18 ns (31 years) or more.
    public static func parseTimeSpan(_ text: String) -> Duration? {
        var rest = Substring(text.trimmingASCIIWhitespace())
        guard !rest.isEmpty else { return nil }
        var total: Int64 = 0
        while !rest.isEmpty {
            let number = rest.prefix { $0.isASCII && ($0.isNumber || $0 == ".") }
            rest = rest.dropFirst(number.count).drop { $0 == " " }
            let unit = rest.prefix { $0.isLetter || $0 == "µ" || $0 == "μ" }
            rest = rest.dropFirst(unit.count).drop { $0 == " " }
            let factor = unit.isEmpty ? 1_000_000_000 : timeUnits.first(where: { $0.names.contains(String(unit)) })?.nanoseconds
            guard let factor, let part = nanoseconds(number, times: factor) else { return nil }
            let (sum, overflow) = total.addingReportingOverflow(part)
            guard !overflow else { return nil }
            total = sum
        }
        guard total < 1_000_000_000_000_000_000 else { return nil }
        return .nanoseconds(total)
    }

    /// `number` (digits with at most one `.`, one digit at least) times `factor` nanoseconds,
    /// in integers: rounded to the nearest nanosecond (a half up) from its first 18
    /// fractional digits, the rest being worth less than a thousandth of one for every unit.
    /// No `Double` on the way, so that every span `formatTimeSpan` prints parses back to
    /// itself: a sum of `Double`s lost the last nanoseconds of spans past 2^53 ns (104 days;
    /// found by the fuzzer). `nil` if malformed or past `Int64`.
    private static func nanoseconds(_ number: Substring, times factor: Int64) -> Int64? {
        let dot = number.firstIndex(of: ".")
        let whole = number[..<(dot ?? number.endIndex)]
        let fraction = dot.map { number[number.index(after: $0)...] } ?? ""
        guard !whole.isEmpty || !fraction.isEmpty, !fraction.contains(".") else { return nil }
        var value: Int64 = 0
        for digit in whole.utf8 {
            let (tens, overflow) = value.multipliedReportingOverflow(by: 10)
            guard !overflow, tens <= .max - 9 else { return nil }
            value = tens + Int64(digit - UInt8(ascii: "0"))
        }
        let (scaled, overflow) = value.multipliedReportingOverflow(by: factor)
        guard !overflow else { return nil }
        var digits: UInt64 = 0, scale: UInt64 = 1
        for digit in fraction.utf8.prefix(18) {
            digits = digits * 10 + UInt64(digit - UInt8(ascii: "0"))
            scale *= 10
        }
        // digits / scale × factor: a quotient below factor, so it fits.
        let (part, remainder) = scale.dividingFullWidth(digits.multipliedFullWidth(by: UInt64(factor)))
        let (sum, carried) = scaled.addingReportingOverflow(Int64(part) + (remainder >= scale - remainder ? 1 : 0))
        return carried ? nil : sum
    }

    /// Prints a span the way systemd does: `30s`, `500ms`, `1min 5s`.
    public static func formatTimeSpan(_ span: Duration) -> String {
        String(capacity: 40) { $0.append(timeSpan: span) }
    }

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
    /// The string without leading and trailing spaces, tabs, CR and LF, cut in its UTF-8
    /// bytes: what is left starts and ends on a whole scalar, these being ASCII. (Rebuilt
    /// from reversed Characters, it was a quarter of the config fuzz target's time, most of
    /// it allocating: every line and value of a file goes through here.)
    func trimmingASCIIWhitespace() -> String {
        let isSpace: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D || $0 == 0x0A }
        guard let first = utf8.firstIndex(where: { !isSpace($0) }), let last = utf8.lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(Substring(utf8[first...last]))
    }
}
