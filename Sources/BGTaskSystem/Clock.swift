// SPDX-License-Identifier: Apache-2.0
import Glibc

/// The clocks the daemon reads: once per loop pass, never inside a decision.
public enum Clock {
    /// `CLOCK_MONOTONIC` in nanoseconds. `clock_gettime(2)`
    public static func monotonicNanoseconds() -> Int64 { read(CLOCK_MONOTONIC) }

    /// `CLOCK_REALTIME` in nanoseconds since the Unix epoch. `clock_gettime(2)`
    public static func realtimeNanoseconds() -> Int64 { read(CLOCK_REALTIME) }

    private static func read(_ clock: clockid_t) -> Int64 {
        var ts = timespec()
        clock_gettime(clock, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}
