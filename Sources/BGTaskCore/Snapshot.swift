// SPDX-License-Identifier: Apache-2.0
/// An app as listed by `ListApps`, computed at one instant.
public struct AppSnapshot: Equatable, Sendable {
    /// The app's own process.
    public var identity: ProcessIdentity
    public var uid: UInt32
    public var command: String
    /// The unit's cgroup path, for a unit app.
    public var unit: String?
    public var containment: Containment
    /// The policy file that matched it, without `.policy`.
    public var policy: String?
    /// Never suspended or terminated for background time (its policy says so).
    public var exempt: Bool
    /// Daily background time left; `nil` without a quota.
    public var backgroundQuotaRemaining: Duration?
    public var state: AppState
    /// Set while `background`.
    public var phase: BackgroundPhase?
    /// Active tasks (pending, granted, expiring).
    public var taskCount: Int
    /// `nil` means unlimited (foreground).
    public var backgroundTimeRemaining: Duration?
    /// Whether a lifecycle subscriber is connected.
    public var subscribed: Bool
    /// Who last moved it between foreground and background with `SetAppState`.
    public var manager: String?
}

/// A task as listed by `ListTasks` or streamed to its `more` caller.
public struct TaskSnapshot: Equatable, Sendable {
    public var id: TaskID
    /// The app's own process.
    public var app: ProcessIdentity
    /// The process that began the task.
    public var owner: ProcessIdentity
    public var uid: UInt32
    public var name: String
    public var state: TaskState
    /// Set once the task left the active states.
    public var reason: TaskReason?
    /// Time since the task was begun.
    public var age: Duration
    public var expirationHandler: Bool
}
