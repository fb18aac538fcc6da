// SPDX-License-Identifier: Apache-2.0

/// The events of an app's `Subscribe` stream (the `event` field), in the order an app meets
/// them. A client ignores one it does not know (a newer daemon's).
public enum EventName: String, CaseIterable, Sendable {
    /// The first reply: `state`, `backgroundTimeRemaining`, the tasks held (`taskIds`) and
    /// those of them already warned (`expiringTaskIds`).
    case subscribed
    case didEnterBackground
    case willEnterForeground
    case taskGranted
    case taskDenied
    /// `taskIds`, `backgroundTimeRemaining`: the warning (rule 7a). Without a time (not one
    /// bgtaskd sends) a client reads 0 s: the time is up.
    case taskExpiring
    case taskExpired
    case didWake
    /// A scheduled request launched: `identifier`, `kind`, `taskId` (its task:
    /// `SetTaskCompleted` ends it), `backgroundTimeRemaining`.
    case launchTask
}

/// The fields of those events and of the App replies, by name.
public enum Field {
    @inlinable public static var event: String { "event" }
    @inlinable public static var state: String { "state" }
    @inlinable public static var taskId: String { "taskId" }
    @inlinable public static var taskIds: String { "taskIds" }
    @inlinable public static var expiringTaskIds: String { "expiringTaskIds" }
    @inlinable public static var reason: String { "reason" }
    @inlinable public static var payload: String { "payload" }
    @inlinable public static var transitionTimeout: String { "transitionTimeout" }
    @inlinable public static var backgroundTimeRemaining: String { "backgroundTimeRemaining" }
    @inlinable public static var backgroundQuotaRemaining: String { "backgroundQuotaRemaining" }
    @inlinable public static var identifier: String { "identifier" }
    @inlinable public static var kind: String { "kind" }
}

/// What both client libraries (BGTaskClient's ClientState, libbgtask's bgtask-state.c) go by.
/// Nanoseconds. libbgtask's `bgtask-protocol.h` holds the same numbers, checked by a test.
public enum ClientRules {
    /// How early, before the daemon's transition (or wake) deadline, the library finishes it
    /// when a grant is still outstanding: the event reached the app a little late.
    public static let finishMargin: Int64 = 25_000_000
    /// The first reconnection waits this long, each next one twice as long, up to the maximum.
    public static let reconnectFirst: Int64 = 50_000_000
    public static let reconnectMaximum: Int64 = 1_000_000_000
    /// How long tasks held when the daemon went away wait for it (it keeps them across a
    /// restart) before their handlers run with "daemon unavailable".
    public static let restartGrace: Int64 = 3_000_000_000
    /// A daemon-sent time is read within [0, this]: no window bgtaskd gives is longer.
    public static let maximumSeconds: Double = 86_400
    /// Bounds on what a client keeps for a daemon: one message, tasks ended while it was
    /// away, task events that beat `BeginTask`'s reply.
    public static let maximumMessageBytes = 1 << 20
    public static let maximumPendingEnds = 4096
    public static let maximumEarlyEvents = 256

    /// Seconds a daemon sent as nanoseconds within [0, `maximumSeconds`]: negative, NaN and
    /// huge values cannot trap the app (`Int64(x * 1e9)` does).
    public static func nanoseconds(_ seconds: Double) -> Int64 {
        guard seconds > 0 else { return 0 }  // NaN too
        return seconds > maximumSeconds ? Int64(maximumSeconds) * 1_000_000_000 : Int64(seconds * 1e9)
    }

    /// A time as the app sees it: within [0, `maximumSeconds`].
    public static func seconds(_ seconds: Double) -> Double {
        guard seconds > 0 else { return 0 }
        return min(seconds, maximumSeconds)
    }
}
