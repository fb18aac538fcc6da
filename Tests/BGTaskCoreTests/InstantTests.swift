// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// `Duration.nanoseconds`, which every deadline the model computes goes through, is the
/// 128-bit division it replaced: truncated toward zero, saturating.
@Suite struct InstantTests {
    /// The definition: `attoseconds / 10^9` in 128 bits, clamped to 64.
    func reference(_ duration: Duration) -> Int64 { Int64(clamping: duration.attoseconds / 1_000_000_000) }

    @Test func nanosecondsAreTheAttosecondsDividedTowardZeroAndSaturated() {
        var values: [Int128] = [0, 1, -1, 999_999_999, -999_999_999, 1_000_000_000, -1_000_000_000, 1_999_999_999, -1_999_999_999,
                                Int128(Int64.max) * 1_000_000_000, Int128(Int64.max) * 1_000_000_000 + 999_999_999,
                                (Int128(Int64.max) + 1) * 1_000_000_000, Int128(Int64.min) * 1_000_000_000,
                                Int128(Int64.min) * 1_000_000_000 - 1, Int128(Int64.min) * 1_000_000_000 - 1_000_000_000,
                                Int128(UInt64.max) * 1_000_000_000, (Int128(1) << 64) * 1_000_000_000,
                                -(Int128(1) << 64) * 1_000_000_000, Int128(500_000_000) << 64, (Int128(500_000_000) << 64) - 1,
                                -(Int128(500_000_000) << 64), -(Int128(500_000_000) << 64) + 1, Int128.max, Int128.min, Int128.min + 1]
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<10_000 {
            let bits = Int.random(in: 0...126, using: &generator)
            let magnitude = Int128(truncatingIfNeeded: UInt128(generator.next()) << 64 | UInt128(generator.next())) & ((Int128(1) << bits) - 1)
            values.append(Bool.random(using: &generator) ? magnitude : -magnitude)
        }
        for attoseconds in values {
            let duration = Duration(attoseconds: attoseconds)
            #expect(duration.nanoseconds == reference(duration), "\(attoseconds) attoseconds")
        }
        #expect(Duration.seconds(30).nanoseconds == 30_000_000_000)
        #expect(Duration.milliseconds(-1500).nanoseconds == -1_500_000_000)
    }

    /// `half`, which the late-warning and transition rules compare against, is the standard
    /// library's `/ 2` to the nanosecond (which it replaced: generic and out of line).
    @Test func halfIsTheDivisionByTwoToTheNanosecond() {
        for duration: Duration in [.zero, .nanoseconds(1), .nanoseconds(3), .nanoseconds(-3), .seconds(1), .milliseconds(1500),
                                   .seconds(-7), .nanoseconds(Int64.max), .nanoseconds(Int64.min + 1)] {
            #expect(duration.half == .nanoseconds((duration / 2).nanoseconds), "\(duration)")
        }
        #expect(BackgroundModel.minimumGrace.half == .milliseconds(500))
    }
}
