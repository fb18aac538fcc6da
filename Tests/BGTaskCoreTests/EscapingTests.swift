// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

@Suite struct EscapingTests {
    /// The definition the fast path must agree with: any scalar `isControlCharacter`.
    static func definition(_ text: String) -> Bool { text.unicodeScalars.contains(where: \.isControlCharacter) }

    /// Every ASCII byte, alone and inside printable text of every length a small string and
    /// a large one have (the fast path is a loop over the bytes in place: its ends matter).
    @Test func everyASCIIByteAnywhereIsFoundAsTheDefinitionSays() {
        for length in [0, 1, 7, 15, 16, 31, 32, 33, 64, 100] {
            let filler = String(repeating: "a~ ", count: length).prefix(length)
            #expect(String(filler).containsControlCharacters == false)
            for byte in UInt8(0)...0x7F {
                let character = String(UnicodeScalar(byte))
                for text in [character + filler, filler + character, String(filler.prefix(length / 2)) + character + filler.dropFirst(length / 2)] {
                    #expect(text.containsControlCharacters == Self.definition(text), "byte \(byte) in \(length) bytes")
                }
            }
        }
    }

    /// Beyond ASCII the scalars decide: C1 controls and the line and paragraph separators
    /// are control characters, other letters are not.
    @Test(arguments: ["é", "naïve task", "\u{85}", "a\u{9F}b", "\u{A0}", "x\u{2028}", "\u{2029}", "漢字", "🙂 done", "\u{200B}"])
    func textBeyondASCIIIsReadByItsScalars(_ text: String) {
        #expect(text.containsControlCharacters == Self.definition(text))
    }
}
