// SPDX-License-Identifier: Apache-2.0
/// A reusable, growable byte buffer written through its pointer, for JSON text made on every
/// call (the state file's task and app lines). An `Array` append checks uniqueness and
/// capacity and calls `memcpy` for every few bytes: ~90 instructions each (callgrind), 26
/// per task line, and a number went through a temporary allocation; here each is a few.
public final class ByteBuffer {
    @usableFromInline var storage: UnsafeMutablePointer<UInt8>
    @usableFromInline var capacity: Int
    @usableFromInline var written = 0
    /// Bytes written.
    public var count: Int { written }

    public init(capacity: Int = 4096) {
        self.capacity = max(capacity, 64)
        storage = .allocate(capacity: self.capacity)
    }

    deinit { storage.deallocate() }

    public var isEmpty: Bool { written == 0 }

    /// Forgets what was written; the storage stays.
    public func removeAll() { written = 0 }

    /// Forgets what was written, and gives back storage grown past `limit` (a burst's).
    public func removeAll(keepingCapacityUpTo limit: Int) {
        written = 0
        guard capacity > limit else { return }
        storage.deallocate()
        capacity = max(limit, 64)
        storage = .allocate(capacity: capacity)
    }

    /// Makes room for `more` bytes past what was written.
    @inlinable @inline(__always)
    func reserve(_ more: Int) {
        if written + more > capacity { grow(to: written + more) }
    }

    @usableFromInline func grow(to needed: Int) {
        var capacity = self.capacity * 2
        while capacity < needed { capacity *= 2 }
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        bigger.initialize(from: storage, count: written)
        storage.deallocate()
        storage = bigger
        self.capacity = capacity
    }

    @inlinable @inline(__always)
    public func append(_ byte: UInt8) {
        reserve(1)
        storage[written] = byte
        written += 1
    }

    @inlinable @inline(__always)
    public func append(_ text: StaticString) {
        append(UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    @inlinable
    public func append(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        reserve(bytes.count)
        UnsafeMutableRawPointer(storage + written).copyMemory(from: base, byteCount: bytes.count)
        written += bytes.count
    }

    public func append(contentsOf bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// Decimal digits, as `JSON.writeInteger` writes them: counted first (`decimalDigits`),
    /// then written in their place from the last, two at a time — a division by 100 and the
    /// pair's two characters copied from a literal table ("00"…"99": a literal is a constant
    /// in the binary, read through its pointer, where an array cost a `swift_once` and two
    /// bounds checks per pair; working out the pair's two digits cost two multiplications
    /// more). Written from the end of room for the longest and then moved, they cost a
    /// `memmove` call each (nanosecond instants have 13–19 digits; a warning writes about 16
    /// integers; callgrind).
    public func appendInteger(_ value: Int64) {
        reserve(20)  // the sign and 19 digits
        if value < 0 {
            storage[written] = UInt8(ascii: "-")
            written += 1
        }
        var magnitude = value.magnitude
        var at = written + Self.decimalDigits(magnitude)
        written = at
        let pairs: StaticString = """
            00010203040506070809101112131415161718192021222324252627282930313233343536373839\
            40414243444546474849505152535455565758596061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899
            """
        assert(pairs.utf8CodeUnitCount == 200)
        let table = UnsafeRawPointer(pairs.utf8Start)
        while magnitude >= 100 {
            let pair = Int(truncatingIfNeeded: magnitude % 100)
            magnitude /= 100
            at -= 2
            UnsafeMutableRawPointer(storage + at).storeBytes(of: table.loadUnaligned(fromByteOffset: 2 * pair, as: UInt16.self),
                                                           as: UInt16.self)
        }
        if magnitude >= 10 {
            UnsafeMutableRawPointer(storage + at - 2).storeBytes(
                of: table.loadUnaligned(fromByteOffset: 2 * Int(truncatingIfNeeded: magnitude), as: UInt16.self), as: UInt16.self)
        } else {
            storage[at - 1] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: magnitude)
        }
    }

    /// How many decimal digits `value` has (1 for 0): at most five comparisons with
    /// constants, no table.
    @inline(__always)
    static func decimalDigits(_ value: UInt64) -> Int {
        if value < 10_000_000_000 {
            if value < 100_000 {
                if value < 100 { return value < 10 ? 1 : 2 }
                return value < 1_000 ? 3 : value < 10_000 ? 4 : 5
            }
            if value < 10_000_000 { return value < 1_000_000 ? 6 : 7 }
            return value < 100_000_000 ? 8 : value < 1_000_000_000 ? 9 : 10
        }
        if value < 1_000_000_000_000_000 {
            if value < 1_000_000_000_000 { return value < 100_000_000_000 ? 11 : 12 }
            return value < 10_000_000_000_000 ? 13 : value < 100_000_000_000_000 ? 14 : 15
        }
        return value < 10_000_000_000_000_000 ? 16 : value < 100_000_000_000_000_000 ? 17 : value < 1_000_000_000_000_000_000 ? 18
            : value < 10_000_000_000_000_000_000 ? 19 : 20
    }

    /// A JSON string, as `JSON.writeString` writes it.
    public func appendString(_ text: String) {
        var text = text
        text.withUTF8 { bytes in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == 0x7F || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
                var escaped: [UInt8] = []  // rare: a name with a quote or a control character
                JSON.writeString(String(decoding: bytes, as: UTF8.self), to: &escaped)
                escaped.withUnsafeBytes { append($0) }
                return
            }
            reserve(bytes.count + 2)
            append(UInt8(ascii: "\""))
            append(UnsafeRawBufferPointer(bytes))
            append(UInt8(ascii: "\""))
        }
    }

    /// A JSON value, as `JSON.write` writes it; numbers, strings, booleans and null without
    /// an array in between.
    public func appendJSON(_ value: JSON) {
        switch value {
        case .null: append("null")
        case let .bool(flag): flag ? append("true") : append("false")
        case let .int(number): appendInteger(number)
        case let .double(number) where !number.isFinite: append("null")
        case let .double(number) where number.rounded(.towardZero) == number && abs(number) < 1e15:
            appendInteger(Int64(number))
            append(".0")
        case let .double(number) where appendMillionths(number): break
        case let .double(number):
            var text = String(number)  // shortest round-trip digits; short enough to live inline
            text.withUTF8 { append(UnsafeRawBufferPointer($0)) }
        case let .string(text): appendString(text)
        case .array, .object:
            var text: [UInt8] = []
            value.write(to: &text)
            text.withUnsafeBytes { append($0) }
        }
    }

    /// Appends `number` as `String(number)` writes it (its shortest round-trip digits) when it
    /// is the `Double` nearest a whole number of millionths, not a whole number, from 0.0001 to
    /// 2^32 — what the daemon sends: times in seconds, rounded to the microsecond — written
    /// from the integer's digits (~150 instructions where `String(number)` took ~700, twice
    /// an app's warning and end, callgrind); returns false, having written nothing, for any
    /// other number. Such a number's shortest digits are its millionths' without trailing
    /// zeros: the number is within half a spacing of `Double`s of them, a shorter decimal at
    /// least a millionth from them, and below 2^32 the spacing is under half a millionth, so
    /// a shorter decimal is more than a spacing away and reads back as another number; from
    /// 0.0001 up `String` writes no exponent. Debug builds check each.
    func appendMillionths(_ number: Double) -> Bool {
        let magnitude = number.magnitude
        guard magnitude >= 0.0001, magnitude < 4_294_967_296 else { return false }
        let rounded = (magnitude * 1e6).rounded()
        guard rounded / 1e6 == magnitude else { return false }
        let millionths = Int64(rounded)
        var fraction = millionths % 1_000_000, digits = 6
        guard fraction != 0 else { return false }
        let start = written
        if number < 0 { append(UInt8(ascii: "-")) }
        appendInteger(millionths / 1_000_000)
        while fraction % 10 == 0 {
            fraction /= 10
            digits -= 1
        }
        reserve(digits + 1)
        storage[written] = UInt8(ascii: ".")
        var at = written + digits
        written = at + 1
        while at > written - digits - 1 {
            storage[at] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: fraction % 10)
            fraction /= 10
            at -= 1
        }
        assert(bytes(from: start) == Array(String(number).utf8), "ByteBuffer.appendMillionths differs from String(\(number))")
        return true
    }

    /// A copy of what was written from `start` on.
    public func bytes(from start: Int) -> [UInt8] { Array(UnsafeBufferPointer(start: storage + start, count: written - start)) }

    /// What was written.
    public func withBytes<Result, Failure: Error>(_ body: (UnsafeRawBufferPointer) throws(Failure) -> Result) throws(Failure) -> Result {
        try body(UnsafeRawBufferPointer(start: storage, count: written))
    }
}
