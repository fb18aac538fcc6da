// SPDX-License-Identifier: Apache-2.0
/// Pieces of text written one after another into a new string's own storage: the log lines
/// and time spans made for every app backgrounded, warned or suspended. Grown a piece at a
/// time, a `String` cost ~300 instructions an append (callgrind: eight for a warning's log
/// line, eight more for its "5s 999ms 993us"); here a piece is a copy.
public struct TextAssembly: ~Copyable {
    private let room: UnsafeMutableBufferPointer<UInt8>
    /// Bytes written.
    public private(set) var count = 0

    fileprivate init(room: UnsafeMutableBufferPointer<UInt8>) {
        self.room = room
    }

    private mutating func copy(_ bytes: UnsafeBufferPointer<UInt8>) {
        precondition(bytes.count <= room.count - count, "TextAssembly: more text than its capacity")
        guard let base = bytes.baseAddress else { return }
        (room.baseAddress! + count).update(from: base, count: bytes.count)
        count += bytes.count
    }

    public mutating func append(_ text: StaticString) {
        copy(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    public mutating func append(_ text: String) {
        var text = text
        text.withUTF8 { copy($0) }
    }

    /// `value` in decimal.
    public mutating func append(decimal value: Int64) {
        let magnitude = value.magnitude
        var scale: UInt64 = 1, digits = 1
        while magnitude / scale >= 10 {
            scale *= 10
            digits += 1
        }
        precondition((value < 0 ? 1 : 0) + digits <= room.count - count, "TextAssembly: more text than its capacity")
        if value < 0 {
            room[count] = UInt8(ascii: "-")
            count += 1
        }
        repeat {
            room[count] = UInt8(ascii: "0") + UInt8(magnitude / scale % 10)
            count += 1
            scale /= 10
        } while scale > 0
    }

    /// `span` as systemd prints one (`ConfigurationValue.formatTimeSpan`): "1min 5s", "0".
    /// At most 40 bytes ("106751d 23h 47min 16s 854ms 775us 807ns"); nothing if negative.
    public mutating func append(timeSpan span: Duration) {
        var ns = span.nanoseconds
        if ns == 0 { return append("0") }
        var first = true
        func part(_ value: Int64, _ unit: StaticString, _ text: inout TextAssembly) {
            if !first { text.append(" ") }
            first = false
            text.append(decimal: value)
            text.append(unit)
        }
        for (unit, size) in Self.timeSpanUnits where ns >= size {
            part(ns / size, unit, &self)
            ns %= size
        }
        if ns > 0 { part(ns, "ns", &self) }
    }

    private static let timeSpanUnits: [(StaticString, Int64)] = [
        ("d", 86_400_000_000_000), ("h", 3_600_000_000_000), ("min", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000),
    ]
}

extension String {
    /// The text `body` writes, of at most `capacity` bytes (more is a programming error,
    /// caught), in one allocation.
    public init(capacity: Int, assembling body: (inout TextAssembly) -> Void) {
        self.init(unsafeUninitializedCapacity: capacity) { room in
            var text = TextAssembly(room: room)
            body(&text)
            return text.count
        }
    }
}
