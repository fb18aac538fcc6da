// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// The machine's sleep: what counts the calendar (scheduled requests' dates, the quota
/// window) counts it, what counts an app's running does not (`BackgroundModel+Sleep`).
extension Daemon {
    /// The least growth of the sleep read that is told to the model, in nanoseconds.
    static let sleepResolution = BackgroundModel.sleepResolution.nanoseconds

    /// Tells the model how long the machine has slept since it booted (checked in every
    /// pass: one subtraction, the clock read with the pass's `now`). Once at start-up too,
    /// after the state file is read: what was slept while no daemon ran counts.
    func noteSleep(at now: Instant) {
        let total = loop.slept
        if let slept = model.machineSlept(total: .nanoseconds(total), at: now) {
            let text = String(capacity: 160) { text in  // one span of at most 40 bytes
                text.append("The machine slept ")
                text.append(timeSpan: .milliseconds((slept.nanoseconds + 500_000) / 1_000_000))
                text.append(": scheduled requests' dates and the quota window count it, background time does not")
            }
            log(.info, text)
        }
        sleepCounted = model.machineSleepCounted?.nanoseconds ?? 0
    }

    /// Arms the sleep timer at the requests' next pass, on `CLOCK_BOOTTIME`: a machine
    /// asleep past it wakes the daemon as it wakes, and that pass counts the sleep (the
    /// requests' own timer, on `CLOCK_MONOTONIC`, would wait for the time not slept). Moved
    /// only when that pass moves; never re-armed for the same instant, so firing before it
    /// (the sleep read is a little short) costs one pass, not a loop.
    func armSleepTimer() {
        let at = inPlace { $0.requestPassAt }.map { $0.nanoseconds &+ sleepCounted }
        guard at != sleepTimerArmedAt else { return }
        sleepTimer.arm(at: at)
        sleepTimerArmedAt = at
    }
}
