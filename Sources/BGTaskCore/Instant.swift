// SPDX-License-Identifier: Apache-2.0
/// A point on the monotonic clock, in nanoseconds since an arbitrary origin.
///
/// The model never reads a clock: every decision takes `now` as an argument, so tests
/// pass explicit instants and the daemon passes `CLOCK_MONOTONIC`.
public struct Instant: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Nanoseconds since the clock's origin.
    public var nanoseconds: Int64

    /// An instant `nanoseconds` after the clock's origin.
    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    /// The clock's origin; handy in tests.
    public static let zero = Instant(nanoseconds: 0)

    /// An instant `seconds` after the origin (tests and conversions).
    public static func seconds(_ seconds: Double) -> Instant {
        Instant(nanoseconds: Int64((seconds * 1e9).rounded()))
    }

    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    public static func + (a: Instant, d: Duration) -> Instant {
        Instant(nanoseconds: a.nanoseconds &+ d.nanoseconds)
    }

    public static func - (a: Instant, d: Duration) -> Instant {
        Instant(nanoseconds: a.nanoseconds &- d.nanoseconds)
    }

    /// The span from `b` to `a` (negative if `a` is earlier).
    public static func - (a: Instant, b: Instant) -> Duration {
        .nanoseconds(a.nanoseconds &- b.nanoseconds)
    }

    public var description: String { "\(Double(nanoseconds) / 1e9)s" }
}

extension Duration {
    /// The duration in whole nanoseconds, truncated toward zero (saturating; durations here
    /// are far below 292 years). From `attoseconds`, not `components`: that getter divides
    /// a 128-bit number by 10^18 out of line, ~190 instructions, and ran several times per
    /// call (callgrind). Nor `attoseconds / 10^9`: a 128-bit division out of line too
    /// (`__divti3`, ~45 instructions, five a call). The magnitude's two 64-bit halves
    /// divided instead, each by the constant (a multiplication), with 2^64 = 10^9 ·
    /// 18,446,744,073 + 709,551,616: below 2^63 nanoseconds no sum overflows.
    public var nanoseconds: Int64 {
        let attoseconds = attoseconds
        let magnitude = attoseconds.magnitude
        let high = UInt64(truncatingIfNeeded: magnitude >> 64), low = UInt64(truncatingIfNeeded: magnitude)
        guard high < 500_000_000 else { return attoseconds < 0 ? .min : .max }  // 2^63 ns or more
        let quotient = high &* 18_446_744_073 &+ low / 1_000_000_000
            &+ (high &* 709_551_616 &+ low % 1_000_000_000) / 1_000_000_000
        return attoseconds < 0 ? -Int64(quotient) : Int64(quotient)
    }

    /// Half the duration, to the nanosecond. Not `self / 2`: the standard library's division
    /// by an integer is generic and out of line (`_Int128(exactly:)` through its witness
    /// tables), and its first call in the daemon's life resolved those by name — in the first
    /// warning of the first deadline burst (`perf`: part of that slice's ~230 µs).
    public var half: Duration { .nanoseconds(nanoseconds / 2) }

    /// The duration in seconds, as the protocol reports it.
    public var seconds: Double { Double(nanoseconds) / 1e9 }
}
