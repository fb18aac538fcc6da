extension String {
    /// The text with control characters escaped as C does (`\n`, `\t`, `\x1b`, ...), and
    /// backslashes doubled, like systemd's `cescape()`: safe to print in a table, a log line
    /// or a journal `MESSAGE`. A process name (`prctl(PR_SET_NAME)`) is whatever its owner
    /// chose, escape sequences and newlines included.
    public var cEscaped: String {
        // The common case, printable ASCII with no backslash, costs one scan and no copy.
        if utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\\") }) { return self }
        var out = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F || (0x80..<0xA0).contains(scalar.value)
                || scalar == "\u{2028}" || scalar == "\u{2029}":
                let hex = String(scalar.value, radix: 16)
                out += scalar.value <= 0xFF ? "\\x" + String(repeating: "0", count: 2 - hex.count) + hex
                                            : "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
