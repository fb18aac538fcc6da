// SPDX-License-Identifier: Apache-2.0
extension Unicode.Scalar {
    /// A C0 or C1 control character (Unicode's `Cc`), or a line or paragraph separator: what
    /// a terminal or a log reader may take for more than text.
    var isControlCharacter: Bool {
        value < 0x20 || (0x7F...0x9F).contains(value) || value == 0x2028 || value == 0x2029
    }
}

extension String {
    /// Whether the text holds a control character (`isControlCharacter`); printable ASCII,
    /// the common case, is answered without Unicode tables.
    public var containsControlCharacters: Bool {
        // Over the bytes in place, with no exit the compiler must keep (it vectorizes): the
        // generic walk of `utf8` was ~190 instructions for a five-byte task name (callgrind).
        let printable = utf8.withContiguousStorageIfAvailable { bytes in
            var outside: UInt8 = 0
            for byte in bytes { outside |= byte &- 0x20 >= 0x5F ? 1 : 0 }  // 0x20...0x7E
            return outside == 0
        } ?? utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F }
        if printable { return false }
        return unicodeScalars.contains(where: \.isControlCharacter)
    }

    /// The text with control characters escaped as C does (`\n`, `\t`, `\x1b`, ...), and
    /// backslashes doubled, like systemd's `cescape()`: safe to print in a table, a log line
    /// or a journal `MESSAGE`. A process name (`prctl(PR_SET_NAME)`) is whatever its owner
    /// chose, escape sequences and newlines included.
    public var cEscaped: String {
        // The common case, printable ASCII with no backslash, costs one scan of its bytes and
        // no copy.
        var text = self
        let plain = text.withUTF8 { bytes in !bytes.contains { $0 < 0x20 || $0 >= 0x7F || $0 == UInt8(ascii: "\\") } }
        if plain { return self }
        var out = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            case _ where scalar.isControlCharacter:
                let hex = String(scalar.value, radix: 16)
                out += scalar.value <= 0xFF ? "\\x" + String(repeating: "0", count: 2 - hex.count) + hex
                                            : "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
