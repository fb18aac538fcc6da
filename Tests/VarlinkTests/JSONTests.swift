// SPDX-License-Identifier: Apache-2.0
import Testing
import Varlink

@Suite struct JSONTests {
    @Test(arguments: [
        ("null", JSON.null), ("true", .bool(true)), ("false", .bool(false)), ("0", .int(0)), ("-12", .int(-12)),
        ("1.5", .double(1.5)), ("1e3", .double(1000)), ("-0.25E-2", .double(-0.0025)),
        ("\"a\\\"b\\\\c\\/d\\n\"", .string("a\"b\\c/d\n")), ("\"\\u00e9\\ud83d\\ude00\"", .string("é😀")),
        (" [1, \"x\", {\"k\": null}] ", .array([.int(1), .string("x"), .object(["k": .null])])),
        ("9223372036854775807", .int(.max)), ("9223372036854775808", .double(9223372036854775808)),
        ("-9223372036854775808", .int(.min)), ("999999999999999999", .int(999_999_999_999_999_999)),
        ("-999999999999999999", .int(-999_999_999_999_999_999)), ("1000000000000000000", .int(1_000_000_000_000_000_000)),
        ("-0", .int(0)), ("[-7,8e1]", .array([.int(-7), .double(80)])),
        // A member named twice: the last one counts; objects nested in objects keep their own.
        ("{\"a\":1,\"b\":{\"a\":2,\"c\":[{\"d\":3}]},\"a\":4}",
         .object(["a": .int(4), "b": .object(["a": .int(2), "c": .array([.object(["d": .int(3)])])])])),
        ("[{\"x\":{}},{\"y\":[]},{}]", .array([.object(["x": .object([:])]), .object(["y": .array([])]), .object([:])])),
    ] as [(String, JSON)])
    func parses(text: String, value: JSON) throws {
        #expect(try JSON.parse(text) == value)
    }

    @Test(arguments: ["", "{", "[1,]", "{\"a\" 1}", "tru", "nul", "01", "1.", "-", "\"abc", "\"\\x\"",
                      "\"\\ud800\"", "\"\\udc00x\"", "{}x", "[1 2]", "\"tab\there\"", "1e", "{1:2}", "NaN"])
    func rejects(text: String) {
        #expect(throws: JSONError.self) { try JSON.parse(text) }
    }

    /// A message is parsed in place, as the framer hands it over: offsets count from its start.
    @Test func parsesASliceInPlaceWithOffsetsFromItsStart() throws {
        let bytes = Array("xx{\"k\":[1,2]}yy{\"k\" 1}".utf8)
        #expect(try JSON.parse(bytes[2..<13]) == .object(["k": .array([.int(1), .int(2)])]))
        let error = #expect(throws: JSONError.self) { try JSON.parse(bytes[15...]) }
        #expect(error?.offset == 5)
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: JSONError.self) { try JSON.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONError.self) { try JSON.parse([0x22, 0xFF, 0x22]) }
    }

    @Test func refusesDeepNestingWithoutCrashing() {
        let deep = String(repeating: "[", count: 100_000)
        #expect(throws: JSONError.self) { try JSON.parse(deep) }
        let ok = String(repeating: "[", count: 60) + String(repeating: "]", count: 60)
        #expect((try? JSON.parse(ok)) != nil)
    }

    @Test func serializesCompactlyWithSortedKeysAndEscapes() {
        let value = JSON.object(["b": .array([.int(1), .double(0.5), .double(2), .null]), "a": .string("x\"\n\u{1}\u{1b}é")])
        #expect(value.serialized == #"{"a":"x\"\n\u0001\u001bé","b":[1,0.5,2.0,null]}"#)
        #expect(JSON.double(.infinity).serialized == "null")
    }

    @Test func roundTrips() throws {
        let value = JSON.object(["s": .string("ü\t\u{7f}"), "n": .int(-5), "d": .double(0.125), "o": .object([:]),
                                 "a": .array([]), "t": .bool(true)])
        #expect(try JSON.parse(value.serialized) == value)
    }
}

/// `ByteBuffer` writes what `JSON` writes, and grows past its first capacity.
@Suite struct ByteBufferTests {
    @Test func numbersAndStringsAreJSONsText() {
        let buffer = ByteBuffer(capacity: 1)
        var expected: [UInt8] = []
        // Every pair of digits at every place (each written from a division by 100), the ends.
        let powers = (0...18).map { (0..<$0).reduce(Int64(1)) { product, _ in product * 10 } }
        let edges = powers.flatMap { [$0 - 1, $0, $0 + 1, -$0, $0 * 7 + 3] } + Array(0...1_000)
        for value: Int64 in [0, 7, 9, 10, 99, 100, -1, -10, 41_564_912_882_000, .max, .min, .min + 1] + edges {
            buffer.appendInteger(value)
            JSON.writeInteger(value, to: &expected)
            buffer.append(",")
            expected.append(UInt8(ascii: ","))
        }
        for text in ["", "bench", "a\"b", "back\\slash", "tab\there", "\u{7F}", "é ✓", String(repeating: "x", count: 5000)] {
            buffer.appendString(text)
            JSON.writeString(text, to: &expected)
        }
        let values: [JSON] = [.null, .bool(true), .bool(false), .int(-3), .double(0.000001), .double(12.5), .double(30),
                              .double(-0.0), .double(1e15), .double(.infinity), .double(123456.789012), .string("x\n"),
                              .array([.int(1)]), .object(["a": .null])]
        for value in values {
            buffer.appendJSON(value)
            value.write(to: &expected)
        }
        #expect(buffer.bytes(from: 0) == expected)
        #expect(buffer.count == expected.count)
        buffer.removeAll()
        #expect(buffer.isEmpty)
    }

    /// Every ASCII byte first, in the middle and last of strings of 0 to 40 bytes (kept in
    /// the string itself up to 15, in storage of their own past it), and non-ASCII text, is
    /// written as `JSON.writeString` writes it: a string needing no escape is copied where
    /// it lies, any other escaped.
    @Test func stringsAreJSONsTextWhateverTheirBytes() {
        let buffer = ByteBuffer(capacity: 1)
        var expected: [UInt8] = []
        var texts = ["\u{80}", "é", "\u{2028}", "✓ \u{1F600}", "\u{9F}x"]
        for length in [0, 1, 2, 15, 16, 40] {
            let filler = String(repeating: "a", count: max(0, length - 1))
            for byte in UInt8(0)...0x7F {
                let character = String(UnicodeScalar(byte))
                texts += [character + filler, String(filler.prefix(length / 2)) + character + String(filler.dropFirst(length / 2)),
                          filler + character]
            }
        }
        for text in texts {
            buffer.appendString(text)
            JSON.writeString(text, to: &expected)
        }
        #expect(buffer.bytes(from: 0) == expected)
    }

    /// Times in seconds rounded to the microsecond (every duration the daemon sends) are
    /// written from their digits (`appendMillionths`), any other number as `String` writes
    /// it: both exactly as `JSON.write` writes them. Millionths of every length from 1 to 16
    /// digits (0.000001 to 2^32 s and past it), both signs, and the `Double`s either side of
    /// each, which are not millionths.
    @Test func millionthsAreWrittenAsJSONWritesThem() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func next() -> UInt64 {  // a fixed sequence (SplitMix64): a failure is found again
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        var millionths: [Int64] = [1, 99, 100, 101, 120, 123, 999, 1_000, 500_000, 999_999, 1_000_001, 5_999_993, 10_000_010,
                                   4_294_967_295_999_999, 4_294_967_296_000_001, 4_294_967_296_500_000]
        var scale: UInt64 = 10
        for _ in 1...16 {
            for _ in 0..<400 { millionths.append(Int64(next() % scale)) }
            scale *= 10
        }
        let buffer = ByteBuffer(capacity: 16)
        var differing: [String] = []
        for count in millionths {
            let number = Double(count) / 1e6
            for value in [number, -number, number.nextUp, number.nextDown, -number.nextUp] {
                var expected: [UInt8] = []
                JSON.double(value).write(to: &expected)
                buffer.removeAll()
                buffer.appendJSON(.double(value))
                if buffer.bytes(from: 0) != expected {
                    differing.append("\(String(decoding: buffer.bytes(from: 0), as: UTF8.self)) for \(String(decoding: expected, as: UTF8.self))")
                }
            }
        }
        #expect(differing.isEmpty, "\(differing.count) differ, the first: \(differing.prefix(5))")
    }
}
