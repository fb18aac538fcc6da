// SPDX-License-Identifier: Apache-2.0
/// A wait the daemon has in flight besides the rules' own deadlines: the enforcement's (a
/// freeze the kernel has not confirmed, the next look for a stray `SIGCONT`, an app being
/// moved into a scope) and its housekeeping (retrying the state file, `STATUS=`). Timed by
/// the model with its other deadlines, so the daemon reads the clock once per pass and arms
/// one timer; when one falls due, `advance(to:)` says so (`Effect.due`) and the daemon
/// carries it out. Not saved: a restarted daemon has none in flight.
public enum Wait: Hashable, Sendable {
    /// A freeze not confirmed yet (`cgroup.events` says `frozen 1`): when due, an app still
    /// not frozen is suspended with signals instead.
    case freeze(ProcessIdentity)
    /// Signal-suspended apps are looked at for a stray `SIGCONT` (a few per wake-up).
    case stopCheck
    /// Terminations waiting for their walks' stops to take: each app's processes, once all
    /// are stopped (no fork under way), are looked at for a child the walk missed, then
    /// signalled.
    case terminationStops
    /// An app the service manager was asked to move into a scope of its own: has it?
    case isolation(ProcessIdentity)
    /// A frozen app thawed by someone else and frozen again: is it being stopped (a kill
    /// signal pending, as systemd sends one right after it thaws a unit it stops)?
    case thawCheck(ProcessIdentity)
    /// The state file could not be written: try again.
    case stateRetry
    /// The state log's work left for when calls have paused: a rewrite once it has grown past
    /// its bound, the page faults of its next appends (`StateFile.prepareRoom`).
    case stateQuiet
    /// `STATUS=` for the service manager (at most one per interval).
    case status
    /// The kernel's process events, left unwatched for a while after a read, are watched again.
    case processEvents
    /// `KeepAwake=`: the inhibitor's linger or its retry delay is over (`AwakeHold`).
    case keepAwake
}

extension Wait {
    /// One word for the hasher, as `ProcessIdentity`'s: the case, and its app's word. A wait is
    /// looked up after every pass (`BackgroundModel.isCurrent`: the state's writes re-arm one
    /// with every call), ~370 instructions a call through the `Hasher` (callgrind).
    var hashWord: UInt64 {
        switch self {
        case let .freeze(app): app.hashWord &<< 4 ^ 1
        case .stopCheck: 2
        case .terminationStops: 3
        case let .isolation(app): app.hashWord &<< 4 ^ 4
        case let .thawCheck(app): app.hashWord &<< 4 ^ 5
        case .stateRetry: 6
        case .stateQuiet: 7
        case .status: 8
        case .processEvents: 9
        case .keepAwake: 10
        }
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(hashWord) }
    public func _rawHashValue(seed: Int) -> Int { seededHash(hashWord, seed: seed) }
}

extension BackgroundModel {
    /// Arms `wait` to fall due at `instant` (re-arming replaces the earlier instant).
    public mutating func schedule(_ wait: Wait, at instant: Instant) {
        waitSerial += 1
        waits[wait] = waitSerial
        timers.insert(.wait(wait, serial: waitSerial), at: instant)
    }

    /// Disarms `wait` (its timer entry, left in place, fires as stale: nothing happens).
    public mutating func cancel(_ wait: Wait) {
        waits[wait] = nil
    }

    /// Whether `wait` is armed.
    public func isScheduled(_ wait: Wait) -> Bool { waits[wait] != nil }

    /// A wait's timer fired: due if it is still the one armed.
    mutating func waitFired(_ wait: Wait, serial: UInt64, effects: inout [Effect]) {
        guard waits[wait] == serial else { return }
        waits[wait] = nil
        effects.append(.due(wait))
    }
}
