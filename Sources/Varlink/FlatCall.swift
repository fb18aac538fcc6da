// SPDX-License-Identifier: Apache-2.0
import Glibc

/// A call read from its bytes without building a `JSON` value: for the calls a client makes
/// all the time, whose parameters are flat (strings, integers, booleans, null). Parsing into
/// `[String: JSON]` and reading it back was a fifth of the daemon's instructions per call
/// (callgrind): a dictionary per object, a `String` and a hash per key.
///
/// `init` accepts only what `JSON.parse` + `VarlinkCall(message:)` read the same way, and
/// gives up (`nil`) on anything else, so a caller can take the general path then and get the
/// general path's answer, error or not: a member name or string with an escape or a byte
/// over 0x7F, a number with a fraction or an exponent or out of `Int64`, a nested value in
/// `parameters`, a member given twice, a member the call object does not have, `upgrade`.
public struct FlatCall: Sendable {
    /// The method's name: bytes of the message.
    public let method: Range<Int>
    /// The members of `parameters`, between its braces (empty: none, or no parameters).
    public let parameters: Range<Int>
    public let more: Bool
    public let oneway: Bool

    /// A parameter's value. A string is bytes of the message: ASCII, no escape.
    public enum Value: Equatable, Sendable {
        case null
        case bool(Bool)
        case int(Int64)
        case string(Range<Int>)
    }

    /// Reads `bytes` (a message without its NUL) as a flat call, or gives up.
    /// `parameter` is shown each member of `parameters` as it is read, before the call is
    /// known to be whole: it returns false to give up. The hot path reads its fields so, in
    /// the one walk over the bytes (walking them again was a thousand instructions of each
    /// call's fifteen, callgrind).
    public init?(_ bytes: UnsafeBufferPointer<UInt8>,
                 parameter: (_ name: UnsafeBufferPointer<UInt8>, _ value: Value) -> Bool = { _, _ in true }) {
        var scanner = FlatScanner(bytes: bytes)
        var method: Range<Int>?
        var parameters: Range<Int>?
        var more: Bool?
        var oneway: Bool?
        guard scanner.take(UInt8(ascii: "{")) else { return nil }
        var first = true
        while !scanner.take(UInt8(ascii: "}")) {
            if !first { guard scanner.take(UInt8(ascii: ",")) else { return nil } }
            first = false
            guard let key = scanner.string(), scanner.take(UInt8(ascii: ":")) else { return nil }
            // By length first: one comparison per member, not one per name it is not.
            let count = key.count
            if count == 6, scanner.equals(key, "method") {
                guard method == nil, case let .string(name)? = scanner.value(), !name.isEmpty else { return nil }
                method = name
            } else if count == 10, scanner.equals(key, "parameters") {
                guard parameters == nil else { return nil }
                if scanner.take(literal: "null") {
                    parameters = 0..<0
                } else {
                    guard let members = scanner.flatObject(parameter) else { return nil }
                    parameters = members
                }
            } else if count == 4, scanner.equals(key, "more") {
                guard more == nil, let flag = scanner.flag() else { return nil }
                more = flag
            } else if count == 6, scanner.equals(key, "oneway") {
                guard oneway == nil, let flag = scanner.flag() else { return nil }
                oneway = flag
            } else {
                return nil  // `upgrade`, or a member the general path ignores: it answers
            }
        }
        guard scanner.atEnd, let method else { return nil }
        self.method = method
        self.parameters = parameters ?? 0..<0
        self.more = more ?? false
        self.oneway = oneway ?? false
    }

    /// Each parameter in the order given: `body` returns false to give up. Returns false if
    /// `body` gave up.
    public func forEachParameter(in bytes: UnsafeBufferPointer<UInt8>,
                                 _ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: Value) -> Bool) -> Bool {
        guard !parameters.isEmpty else { return true }
        var scanner = FlatScanner(bytes: bytes, at: parameters.lowerBound)
        repeat {
            // `init` checked the members: each is a name, a colon and a flat value.
            guard let key = scanner.string(), scanner.take(UInt8(ascii: ":")), let value = scanner.value(),
                  body(UnsafeBufferPointer(rebasing: bytes[key]), value) else { return false }
        } while scanner.take(UInt8(ascii: ","))
        return true
    }

    /// The method's name and the parameters as `JSON` values: what the general path reads
    /// (for checks; a hot call reads them in place).
    public func general(in bytes: UnsafeBufferPointer<UInt8>) -> (method: String, parameters: [String: JSON]) {
        func text(_ range: Range<Int>) -> String { String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self) }
        var parameters: [String: JSON] = [:]
        _ = forEachParameter(in: bytes) { name, value in
            let key = String(decoding: name, as: UTF8.self)
            switch value {
            case .null: parameters[key] = .null
            case let .bool(flag): parameters[key] = .bool(flag)
            case let .int(number): parameters[key] = .int(number)
            case let .string(range): parameters[key] = .string(text(range))
            }
            return true
        }
        return (text(method), parameters)
    }
}

/// The byte walk under `FlatCall`: each method skips whitespace first (JSON's four bytes).
struct FlatScanner {
    let bytes: UnsafeBufferPointer<UInt8>
    var index: Int

    init(bytes: UnsafeBufferPointer<UInt8>, at index: Int = 0) {
        self.bytes = bytes
        self.index = index
    }

    var atEnd: Bool {
        mutating get {
            skipWhitespace()
            return index == bytes.count
        }
    }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return
            }
        }
    }

    /// Takes `byte` if it is next.
    mutating func take(_ byte: UInt8) -> Bool {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    mutating func take(literal: StaticString) -> Bool {
        skipWhitespace()
        guard index + literal.utf8CodeUnitCount <= bytes.count,
              equals(index..<(index + literal.utf8CodeUnitCount), literal) else { return false }
        index += literal.utf8CodeUnitCount
        return true
    }

    func equals(_ range: Range<Int>, _ text: StaticString) -> Bool {
        range.count == text.utf8CodeUnitCount && memcmp(bytes.baseAddress! + range.lowerBound, text.utf8Start, range.count) == 0
    }

    func equals(_ one: Range<Int>, _ other: Range<Int>) -> Bool {
        guard one.count == other.count else { return false }
        for offset in 0..<one.count where bytes[one.lowerBound + offset] != bytes[other.lowerBound + offset] { return false }
        return true
    }

    /// A string's bytes, between its quotes: printable ASCII (0x20…0x7F), no escape.
    mutating func string() -> Range<Int>? {
        guard take(UInt8(ascii: "\"")) else { return nil }
        // The closing quote by `memchr`, then the bytes before it checked in a loop with no
        // exit that the compiler vectorizes: a byte-by-byte walk was a third of the parse
        // (callgrind).
        guard let base = bytes.baseAddress, index < bytes.count,
              let found = memchr(base + index, Int32(UInt8(ascii: "\"")), bytes.count - index) else { return nil }
        let start = index, end = base.distance(to: found.assumingMemoryBound(to: UInt8.self))
        var refused: UInt8 = 0
        for at in start..<end {
            // Printable ASCII but the backslash: 0x20...0x7F in one comparison.
            let byte = base[at]
            refused |= (byte &- 0x20 >= 0x60 ? 1 : 0) | (byte == UInt8(ascii: "\\") ? 1 : 0)
        }
        guard refused == 0 else { return nil }
        index = end + 1
        return start..<end
    }

    /// `true`, `false` or `null` (`false`).
    mutating func flag() -> Bool? {
        if take(literal: "true") { return true }
        if take(literal: "false") || take(literal: "null") { return false }
        return nil
    }

    /// A scalar: what `JSON.parse` reads as `.null`, `.bool`, `.int` or `.string`.
    mutating func value() -> FlatCall.Value? {
        skipWhitespace()
        guard index < bytes.count else { return nil }
        switch bytes[index] {
        case UInt8(ascii: "\""): return string().map { .string($0) }
        case UInt8(ascii: "t"): return take(literal: "true") ? .bool(true) : nil
        case UInt8(ascii: "f"): return take(literal: "false") ? .bool(false) : nil
        case UInt8(ascii: "n"): return take(literal: "null") ? .null : nil
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return integer().map { .int($0) }
        default: return nil
        }
    }

    /// An integer as `JSON.parse` reads one: no leading zero, no fraction or exponent after
    /// it, within `Int64` (more than 18 digits: given up, not worth the care).
    mutating func integer() -> Int64? {
        let negative = bytes[index] == UInt8(ascii: "-")
        if negative { index += 1 }
        let start = index
        var magnitude: Int64 = 0
        while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
            // Past 18 digits the number is given up below; adding them in would overflow.
            if index - start < 18 { magnitude = magnitude * 10 + Int64(bytes[index] - UInt8(ascii: "0")) }
            index += 1
        }
        let digits = index - start
        guard digits > 0, digits <= 18, digits == 1 || bytes[start] != UInt8(ascii: "0") else { return nil }
        if index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil
            default: break
            }
        }
        return negative ? -magnitude : magnitude
    }

    /// An object of at most `maximumMembers` scalars with names given once: the bytes
    /// between its braces. `visit` is shown each member (false: give up).
    mutating func flatObject(_ visit: (_ name: UnsafeBufferPointer<UInt8>, _ value: FlatCall.Value) -> Bool) -> Range<Int>? {
        guard take(UInt8(ascii: "{")) else { return nil }
        let start = index
        if take(UInt8(ascii: "}")) { return start..<start }
        let end: Int? = withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: Self.maximumMembers) { names in
            var count = 0
            repeat {
                guard count < Self.maximumMembers, let key = string(), take(UInt8(ascii: ":")), let value = value(),
                      !names[..<count].contains(where: { equals($0, key) }),
                      visit(UnsafeBufferPointer(rebasing: bytes[key]), value) else { return nil }
                names[count] = key
                count += 1
            } while take(UInt8(ascii: ","))
            return index
        }
        guard let end, take(UInt8(ascii: "}")) else { return nil }
        return start..<end
    }

    /// More parameters than a hot method has: the general path's.
    static let maximumMembers = 8
}
