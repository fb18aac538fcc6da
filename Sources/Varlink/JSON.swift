// SPDX-License-Identifier: Apache-2.0
/// A JSON value. Integers that fit `Int64` stay exact; objects print with sorted keys.
public enum JSON: Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    /// The member `key` of an object, else `nil`.
    public subscript(key: String) -> JSON? {
        if case let .object(members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? { if case let .string(s) = self { s } else { nil } }
    public var boolValue: Bool? { if case let .bool(b) = self { b } else { nil } }
    public var objectValue: [String: JSON]? { if case let .object(o) = self { o } else { nil } }
    public var arrayValue: [JSON]? { if case let .array(a) = self { a } else { nil } }
    public var isNull: Bool { self == .null }

    /// An exact integer: an `int`, or a `double` with no fraction that fits.
    public var intValue: Int64? {
        switch self {
        case let .int(i): return i
        case let .double(d) where d.rounded(.towardZero) == d && abs(d) < 9.0e18: return Int64(d)
        default: return nil
        }
    }

    /// Any number, as a `Double`.
    public var doubleValue: Double? {
        switch self {
        case let .int(i): Double(i)
        case let .double(d): d
        default: nil
        }
    }
}

/// Why a JSON text was refused, with the byte offset where it went wrong.
public struct JSONError: Error, Equatable, Sendable, CustomStringConvertible {
    public var offset: Int
    public var reason: String
    public var description: String { "invalid JSON at byte \(offset): \(reason)" }
}

extension JSON {
    /// Nesting deeper than this is refused, so hostile input cannot exhaust the stack.
    public static let maximumDepth = 64

    /// Parses exactly one JSON value (surrounding whitespace allowed) from UTF-8 bytes.
    public static func parse(_ bytes: [UInt8]) throws(JSONError) -> JSON {
        let parsed = bytes.withUnsafeBufferPointer { buffer in
            Result { () throws(JSONError) -> JSON in
                var parser = JSONParser(bytes: buffer)
                return try parser.parseDocument()
            }
        }
        return try parsed.get()
    }

    /// Parses a message as the framer hands it over, in place (a listing's reply is megabytes:
    /// no copy of it is made).
    public static func parse(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> JSON {
        let parsed = bytes.withUnsafeBufferPointer { buffer in
            Result { () throws(JSONError) -> JSON in
                var parser = JSONParser(bytes: buffer)
                return try parser.parseDocument()
            }
        }
        return try parsed.get()
    }

    /// Parses a JSON text given as a string.
    public static func parse(_ text: String) throws(JSONError) -> JSON {
        try parse(Array(text.utf8))
    }

    /// The compact JSON text of this value.
    public var serialized: String {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        write(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the compact JSON text of this value to `out`.
    public func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case let .bool(b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case let .int(i): JSON.writeInteger(i, to: &out)
        case let .double(d):
            if !d.isFinite {
                out.append(contentsOf: "null".utf8)
            } else if d.rounded(.towardZero) == d, abs(d) < 1e15 {
                JSON.writeInteger(Int64(d), to: &out)
                out.append(contentsOf: ".0".utf8)
            } else {
                out.append(contentsOf: String(d).utf8)
            }
        case let .string(s): JSON.writeString(s, to: &out)
        case let .array(items):
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                item.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case let .object(members):
            JSON.writeObject(members, to: &out)
        }
    }

    /// `{...}` with the keys in order, so the same value is always the same text.
    public static func writeObject(_ members: [String: JSON], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        var first = true
        for (key, value) in members.sorted(by: { $0.key < $1.key }) {
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            JSON.writeString(key, to: &out)
            out.append(UInt8(ascii: ":"))
            value.write(to: &out)
        }
        out.append(UInt8(ascii: "}"))
    }

    /// Decimal digits, without making a String.
    public static func writeInteger(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var first = 20
            repeat {
                first -= 1
                digits[first] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            out.append(contentsOf: UnsafeBufferPointer(rebasing: digits[first...]))
        }
    }

    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    public static func writeString(_ s: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { bytes in
            // Most strings need no escape: copied whole.
            guard bytes.contains(where: { $0 < 0x20 || $0 == 0x7F || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
                out.append(contentsOf: bytes)
                return
            }
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "\""): out.append(contentsOf: [92, 34])
                case UInt8(ascii: "\\"): out.append(contentsOf: [92, 92])
                case 0x0A: out.append(contentsOf: [92, UInt8(ascii: "n")])
                case 0x0D: out.append(contentsOf: [92, UInt8(ascii: "r")])
                case 0x09: out.append(contentsOf: [92, UInt8(ascii: "t")])
                case 0..<0x20, 0x7F:
                    out.append(contentsOf: [92, UInt8(ascii: "u"), 48, 48, hex[Int(byte >> 4)], hex[Int(byte & 15)]])
                default: out.append(byte)
                }
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// A recursive-descent parser over bytes, read in place.
struct JSONParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0
    /// The members of the objects being parsed, innermost last: each object takes its own
    /// off the end when it closes, and its dictionary is made at its size once (growing one
    /// member at a time resized and rehashed it; a listing holds 100,000 of them).
    var members: [(String, JSON)] = []

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    mutating func parseDocument() throws(JSONError) -> JSON {
        let value = try parseValue(depth: 0)
        skipWhitespace()
        guard index == bytes.count else { throw fail("trailing characters") }
        return value
    }

    func fail(_ reason: String) -> JSONError { JSONError(offset: index, reason: reason) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            let byte = bytes[index]
            guard byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 else { return }
            index += 1
        }
    }

    mutating func parseValue(depth: Int) throws(JSONError) -> JSON {
        guard depth < JSON.maximumDepth else { throw fail("nested too deeply") }
        skipWhitespace()
        guard index < bytes.count else { throw fail("unexpected end") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth)
        case UInt8(ascii: "["): return try parseArray(depth: depth)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw fail("unexpected character")
        }
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONError) {
        let count = literal.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end") }
        let matches = literal.withUTF8Buffer { expected in
            (0..<count).allSatisfy { bytes[index + $0] == expected[$0] }
        }
        guard matches else { throw fail("invalid literal") }
        index += count
    }

    mutating func parseObject(depth: Int) throws(JSONError) -> JSON {
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object([:]) }
        let base = members.count
        // Thrown out of: the document is refused whole, and the parser is not used again.
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            members.append((key, try parseValue(depth: depth + 1)))
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; break }
            throw fail("expected ',' or '}'")
        }
        var object = [String: JSON](minimumCapacity: members.count - base)
        // A member named twice: the last one counts.
        for (key, value) in members[base...] { object[key] = value }
        members.removeSubrange(base...)
        return .object(object)
    }

    mutating func parseArray(depth: Int) throws(JSONError) -> JSON {
        index += 1
        var items: [JSON] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
        while true {
            items.append(try parseValue(depth: depth + 1))
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func parseString() throws(JSONError) -> String {
        index += 1
        let start = index
        // Fast path: no escapes, the string is the bytes themselves.
        var high: UInt8 = 0
        while index < bytes.count, bytes[index] != UInt8(ascii: "\""), bytes[index] != UInt8(ascii: "\\"),
              bytes[index] >= 0x20 {
            high |= bytes[index]
            index += 1
        }
        guard index < bytes.count else { throw fail("unterminated string") }
        if bytes[index] == UInt8(ascii: "\"") {
            let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
            index += 1
            // ASCII (nearly every string in a call) needs no validation, and the generic
            // validating initialiser costs a thousand instructions even then.
            guard let string = high < 0x80 ? String(decoding: text, as: UTF8.self) : String(validating: text, as: UTF8.self) else {
                throw JSONError(offset: start, reason: "string is not valid UTF-8")
            }
            return string
        }
        var raw = Array(bytes[start..<index])
        while bytes[index] != UInt8(ascii: "\"") {
            let byte = bytes[index]
            if byte < 0x20 { throw fail("control character in string") }
            if byte != UInt8(ascii: "\\") {
                raw.append(byte)
                index += 1
            } else {
                index += 1
                guard index < bytes.count else { throw fail("unterminated escape") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): raw.append(escape)
                case UInt8(ascii: "b"): raw.append(0x08)
                case UInt8(ascii: "f"): raw.append(0x0C)
                case UInt8(ascii: "n"): raw.append(0x0A)
                case UInt8(ascii: "r"): raw.append(0x0D)
                case UInt8(ascii: "t"): raw.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try parseHex4()
                    if (0xD800..<0xDC00).contains(scalar) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                              bytes[index + 1] == UInt8(ascii: "u") else { throw fail("unpaired surrogate") }
                        index += 2
                        let low = try parseHex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw fail("unpaired surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(scalar) {
                        throw fail("unpaired surrogate")
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw fail("invalid code point") }
                    raw.append(contentsOf: Array(String(Character(unicode)).utf8))
                default: throw fail("invalid escape")
                }
            }
            guard index < bytes.count else { throw fail("unterminated string") }
        }
        index += 1
        guard let string = raw.withUnsafeBufferPointer({ String(validating: $0, as: UTF8.self) }) else {
            throw JSONError(offset: start, reason: "string is not valid UTF-8")
        }
        return string
    }

    mutating func parseHex4() throws(JSONError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("short \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | UInt32(digit)
            index += 1
        }
        return value
    }

    mutating func digits() -> Int {
        let begin = index
        while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
        return index - begin
    }

    mutating func parseNumber() throws(JSONError) -> JSON {
        let start = index
        var isInteger = true
        let negative = bytes[index] == UInt8(ascii: "-")
        if negative { index += 1 }
        let intStart = index
        let intDigits = digits()
        guard intDigits > 0 else { throw fail("expected digits") }
        if intDigits > 1, bytes[intStart] == UInt8(ascii: "0") { throw JSONError(offset: intStart, reason: "leading zero") }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard digits() > 0 else { throw fail("expected digits after '.'") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { throw fail("expected exponent digits") }
        }
        // Up to 18 digits cannot overflow Int64: summed in place, without making a String.
        if isInteger, intDigits <= 18 {
            var magnitude: Int64 = 0
            for position in intStart..<index { magnitude = magnitude * 10 + Int64(bytes[position] &- 48) }
            return .int(negative ? -magnitude : magnitude)
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        if isInteger, let value = Int64(text) { return .int(value) }
        guard let value = Double(text), value.isFinite else { throw JSONError(offset: start, reason: "number out of range") }
        return .double(value)
    }
}

extension JSON: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByNilLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(nilLiteral: ()) { self = .null }
}
