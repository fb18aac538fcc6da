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
    /// The duration in whole nanoseconds (saturating; durations here are far below 292 years).
    /// From `attoseconds`, not `components`: that getter divides a 128-bit number by 10^18
    /// out of line, ~190 instructions, and ran several times per call (callgrind); this is ~45.
    public var nanoseconds: Int64 { Int64(clamping: attoseconds / 1_000_000_000) }

    /// The duration in seconds, as the protocol reports it.
    public var seconds: Double { Double(nanoseconds) / 1e9 }
}
