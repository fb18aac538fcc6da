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

    /// Decimal digits, as `JSON.writeInteger` writes them: two at a time (a division by 100,
    /// then each digit of the pair by multiplication: a table of pairs cost a `swift_once` and
    /// two bounds checks per pair, callgrind), from the end of room for the longest, then
    /// moved to their place (nanosecond instants have 13–19).
    public func appendInteger(_ value: Int64) {
        reserve(41)  // the sign, and room for the digits written from the end
        if value < 0 {
            storage[written] = UInt8(ascii: "-")
            written += 1
        }
        var magnitude = value.magnitude
        let end = written + 40
        var at = end
        while magnitude >= 100 {
            let pair = UInt8(truncatingIfNeeded: magnitude % 100)
            magnitude /= 100
            at -= 2
            storage[at] = UInt8(ascii: "0") &+ pair / 10
            storage[at + 1] = UInt8(ascii: "0") &+ pair % 10
        }
        if magnitude >= 10 {
            let pair = UInt8(truncatingIfNeeded: magnitude)
            at -= 2
            storage[at] = UInt8(ascii: "0") &+ pair / 10
            storage[at + 1] = UInt8(ascii: "0") &+ pair % 10
        } else {
            at -= 1
            storage[at] = UInt8(ascii: "0") &+ UInt8(magnitude)
        }
        let count = end - at
        (storage + written).update(from: storage + at, count: count)
        written += count
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

    /// A copy of what was written from `start` on.
    public func bytes(from start: Int) -> [UInt8] { Array(UnsafeBufferPointer(start: storage + start, count: written - start)) }

    /// What was written.
    public func withBytes<Result, Failure: Error>(_ body: (UnsafeRawBufferPointer) throws(Failure) -> Result) throws(Failure) -> Result {
        try body(UnsafeRawBufferPointer(start: storage, count: written))
    }
}
