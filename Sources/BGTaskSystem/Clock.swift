// SPDX-License-Identifier: Apache-2.0
import Glibc

/// The clocks the daemon reads: once per loop pass, never inside a decision.
public enum Clock {
    /// `CLOCK_MONOTONIC` in nanoseconds. `clock_gettime(2)`
    public static func monotonicNanoseconds() -> Int64 { read(CLOCK_MONOTONIC) }

    /// `CLOCK_BOOTTIME` in nanoseconds: `CLOCK_MONOTONIC` and the time the machine slept.
    public static func boottimeNanoseconds() -> Int64 { read(CLOCK_BOOTTIME) }

    /// How long the machine has slept (suspended) since it booted: `CLOCK_BOOTTIME` less
    /// `CLOCK_MONOTONIC`, read in that order, so never more than it is (less by the time
    /// between the two reads, tens of nanoseconds, more if preempted between them; never
    /// below zero).
    public static func sleptNanoseconds() -> Int64 {
        let boottime = read(CLOCK_BOOTTIME)
        return slept(boottime: boottime, monotonic: read(CLOCK_MONOTONIC))
    }

    /// The sleep from the two clocks read in that order (`sleptNanoseconds`).
    public static func slept(boottime: Int64, monotonic: Int64) -> Int64 { max(0, boottime - monotonic) }

    /// `CLOCK_REALTIME` in nanoseconds since the Unix epoch. `clock_gettime(2)`
    public static func realtimeNanoseconds() -> Int64 { read(CLOCK_REALTIME) }

    private static func read(_ clock: clockid_t) -> Int64 {
        var ts = timespec()
        clock_gettime(clock, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}
