// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// The kernel's process events (`Tracker`), read a batch at a time on a busy machine.
extension Daemon {
    /// After a read of the connector, it is left unwatched for `processEventsHoldOff`. While
    /// a process app is followed, every process started anywhere on the machine is a fork and
    /// an exit there: read as they came, each woke the daemon twice (~40 µs of its CPU per
    /// process, measured: a build's thousands a second). Held off, a burst costs a wake-up per
    /// hold-off, and a quiet machine none. Nothing waits for the events meanwhile: every
    /// action on a followed app reads them first (`Tracker.members(of:reading:)`), and a pass
    /// that suspended followed apps watches them again at once (`finishStops`), so a fork that
    /// completes after its parent's stop is stopped as soon as it is read, as before.
    func holdOffProcessEvents() {
        guard !processEventsHeldOff, let source = processEventsSource else { return }
        processEventsHeldOff = true
        source.setIOEvents(0)
        let until = loop.now + Self.processEventsHoldOff
        model.schedule(.processEvents, at: Instant(nanoseconds: until))
        armTimer(at: until)
    }

    /// The connector is watched again: events waiting are reported at once.
    func watchProcessEvents() {
        guard processEventsHeldOff else { return }
        processEventsHeldOff = false
        model.cancel(.processEvents)
        processEventsSource?.setIOEvents(IOEvents.readable)
    }

    /// Sends the queued stops and reads what the suspended tracked apps forked before them
    /// (`Enforcer.finishStops`); after such stops the connector is watched again.
    func finishStops() {
        if enforcer.finishStops() { watchProcessEvents() }
    }

    /// At most 20 reads a second of events nobody waits for.
    static let processEventsHoldOff: Int64 = 50_000_000
}
