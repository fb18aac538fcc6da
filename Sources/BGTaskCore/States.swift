// SPDX-License-Identifier: Apache-2.0
/// An app's lifecycle state (DESIGN.md §2). A terminated app is kept only in history.
public enum AppState: String, CaseIterable, Sendable {
    case foreground, background, suspended, terminated
}

/// Where a background app stands.
public enum BackgroundPhase: String, CaseIterable, Sendable {
    /// Waiting for `FinishBackgroundTransition`.
    case transition
    /// Holding granted tasks.
    case running
    /// Woken by a manager, until `FinishWake` or the end of its window (DESIGN.md §2c).
    case woken
    /// Warned: its tasks are expiring.
    case expiring
}

/// A background task's state: `pending` → `granted` → `expiring` → `ended` | `expired`;
/// `pending` → `denied`.
public enum TaskState: String, CaseIterable, Sendable {
    case pending, granted, expiring, ended, expired, denied

    /// Whether the task still holds (or waits for) an assertion.
    public var isActive: Bool { self == .pending || self == .granted || self == .expiring }
    /// Whether the task keeps its app from being suspended.
    public var isAssertion: Bool { self == .granted || self == .expiring }
}

/// Why a task left the active states.
public enum TaskReason: String, CaseIterable, Sendable {
    /// The app called `EndTask`.
    case endedByApp
    /// The process that began it exited.
    case ownerExited
    /// The app's own process exited.
    case appExited
    /// It was begun with `more` and that connection closed.
    case connectionClosed
    /// The app finished its transition (or ran out of tasks) before the grant came.
    case suspendedBeforeGrant
    /// Requested or still pending once the expiration warning was sent.
    case noBackgroundTime
    /// The app was terminated.
    case appTerminated
    /// Still held when background time ran out.
    case backgroundTimeExpired
}

/// Why an app was suspended, resumed or terminated; recorded in history.
public enum ActionReason: String, CaseIterable, Sendable {
    /// Transition finished with no granted task.
    case transitionFinished
    /// Its last task ended.
    case tasksEnded
    /// Its background time ran out with no task held.
    case backgroundTimeExpired
    /// Brought back to the foreground.
    case foreground
    /// It did not finish its background transition in time.
    case transitionTimeout
    /// It still held tasks when background time ran out.
    case assertionsBeyondPermittedTime
    /// A manager asked for it.
    case manager
    /// A manager woke it (the history entry's detail says why).
    case wake
    /// It called `FinishWake` holding no task.
    case wakeFinished
    /// Resumed for scheduled requests (the history entry's detail names them).
    case launch
    /// Suspended, it was thawed and sent a signal to stop by someone else — its service
    /// manager stopping its unit (`systemctl stop`, a logout): let go to handle it, and
    /// killed if it has not exited when `TerminateGraceSec` runs out.
    case stoppedWhileSuspended
}

/// Where `Expire` moves an app: to its expiration warning, or past its deadline.
public enum ExpireTarget: String, CaseIterable, Sendable {
    case warning, deadline
}

/// What happened to an app, for history and enforcement.
public enum AppAction: String, CaseIterable, Sendable {
    case suspended, resumed, terminated, woken
}
