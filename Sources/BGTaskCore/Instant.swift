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
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (ns, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return ns &+ attoseconds / 1_000_000_000
    }

    /// The duration in seconds, as the protocol reports it.
    public var seconds: Double { Double(nanoseconds) / 1e9 }
}
