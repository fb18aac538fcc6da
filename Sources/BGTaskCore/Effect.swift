// SPDX-License-Identifier: Apache-2.0
/// A lifecycle event delivered to an app's subscribers (`io.bgtaskd.App.Subscribe`).
public enum LifecycleEvent: Equatable, Sendable {
    /// `backgroundTimeRemaining` is `nil` for an exempt app: unlimited.
    case didEnterBackground(transitionTimeout: Duration, backgroundTimeRemaining: Duration?)
    case willEnterForeground
    case taskGranted(TaskID)
    case taskDenied(TaskID, TaskReason)
    case taskExpiring([TaskID], backgroundTimeRemaining: Duration)
    case taskExpired([TaskID])
    /// A manager woke the app (DESIGN.md §2c): `payload` is a JSON object's text, if any.
    case didWake(reason: String, payload: String?, backgroundTimeRemaining: Duration?)
    /// A scheduled request is launched: its task is `taskID` (`SetTaskCompleted` ends it).
    case launchTask(identifier: String, kind: TaskRequestKind, taskID: TaskID, backgroundTimeRemaining: Duration?)
}

/// A suspension, resumption or termination the daemon must carry out and record.
public struct AppActionRecord: Equatable, Sendable {
    public var app: ProcessIdentity
    public var uid: UInt32
    public var command: String
    public var action: AppAction
    public var reason: ActionReason
    /// The names of the tasks involved (for a termination: the tasks still held).
    public var taskNames: [String]
    /// The unit's cgroup path, for a unit app: what to act on (the model may have forgotten
    /// the app by the time the action is carried out).
    public var unit: String?
    /// Words from whoever asked, for history (a wake's reason).
    public var detail: String?

    public init(app: ProcessIdentity, uid: UInt32, command: String, unit: String? = nil, action: AppAction,
                reason: ActionReason, taskNames: [String], detail: String? = nil) {
        self.unit = unit
        self.detail = detail
        self.app = app
        self.uid = uid
        self.command = command
        self.action = action
        self.reason = reason
        self.taskNames = taskNames
    }
}

/// The kinds of log line, each with its own journal `MESSAGE_ID`.
public enum LogKind: String, CaseIterable, Sendable {
    case appRegistered, appBackgrounded, appForegrounded, appExited
    case appSuspended, appResumed, appTerminated
    case taskGranted, taskDenied, taskWarned, taskExpired, taskEnded, taskAgeWarning
    case appExpired, appIsolated, appWoken
    case requestSubmitted, requestLaunched, requestCompleted
}

extension LogKind {
    /// The journal `MESSAGE_ID`, so `journalctl MESSAGE_ID=...` finds every record of a kind.
    /// Each is fixed here, once, like systemd's `sd-messages.h`: an ID never changes once
    /// shipped, whatever cases are added to `LogKind` or in what order.
    public var messageID: String {
        switch self {
        case .appRegistered: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a01"
        case .appBackgrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a02"
        case .appForegrounded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a03"
        case .appExited: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a04"
        case .appSuspended: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a05"
        case .appResumed: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a06"
        case .appTerminated: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a07"
        case .taskGranted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a08"
        case .taskDenied: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a09"
        case .taskWarned: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0a"
        case .taskExpired: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0b"
        case .taskEnded: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0c"
        case .taskAgeWarning: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0d"
        case .appExpired: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0e"
        case .appIsolated: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a0f"
        case .appWoken: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a10"
        case .requestSubmitted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a11"
        case .requestLaunched: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a12"
        case .requestCompleted: "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a13"
        }
    }
}

/// A log line with its structured fields; the daemon sends it to the journal.
public struct LogEntry: Equatable, Sendable {
    public enum Priority: Int, Sendable { case warning = 4, notice = 5, info = 6, debug = 7 }
    public var priority: Priority
    public var kind: LogKind
    /// The sentence, leading with its subject: "Task 42 (upload) of pid 1234 expired".
    public var message: String
    public var app: ProcessIdentity?
    public var command: String?
    public var taskID: TaskID?
    public var taskName: String?
    public var reason: String?
    /// The uid of the app the record is about: the journal's records are shared by every
    /// user, so each uid's are rate-limited (`Daemon.log`).
    public var uid: UInt32?
}

extension LogEntry {
    /// A record about an app: "App pid 1234 (upload) `text`".
    static func app(_ kind: LogKind, _ priority: Priority, _ app: ProcessIdentity, uid: UInt32, command: String, _ text: String,
                    reason: ActionReason? = nil) -> LogEntry {
        // Written in one string (`TextAssembly`): every app backgrounded, warned or suspended
        // logs one.
        let message = String(capacity: 32 + command.utf8.count + text.utf8.count) { message in
            message.append("App pid ")
            message.append(decimal: Int64(app.pid))
            message.append(" (")
            message.append(command)
            message.append(") ")
            message.append(text)
        }
        return LogEntry(priority: priority, kind: kind, message: message, app: app,
                        command: command, reason: reason?.rawValue, uid: uid)
    }

    /// A record about a task: "Task 42 (upload) of pid 1234 `text`".
    static func task(_ kind: LogKind, _ priority: Priority, _ id: TaskID, name: String, app: ProcessIdentity, uid: UInt32,
                     command: String?, _ text: String, reason: TaskReason? = nil) -> LogEntry {
        task(kind, priority, id, name: name, app: app, uid: uid, command: command, textCapacity: text.utf8.count, reason: reason) {
            $0.append(text)
        }
    }

    /// The same, its text written by `text` (at most `textCapacity` bytes) into the line
    /// itself: a warning's, one a task, is not made a string of its own first.
    static func task(_ kind: LogKind, _ priority: Priority, _ id: TaskID, name: String, app: ProcessIdentity, uid: UInt32,
                     command: String?, textCapacity: Int, reason: TaskReason? = nil,
                     _ text: (inout TextAssembly) -> Void) -> LogEntry {
        let message = String(capacity: 64 + name.utf8.count + textCapacity) { message in
            message.append("Task ")
            message.append(decimal: Int64(id))
            message.append(" (")
            message.append(name)
            message.append(") of pid ")
            message.append(decimal: Int64(app.pid))
            message.append(" ")
            text(&message)
        }
        return LogEntry(priority: priority, kind: kind, message: message, app: app,
                        command: command, taskID: id, taskName: name, reason: reason?.rawValue, uid: uid)
    }
}

/// Everything the model asks the daemon to do. The daemon runs effects in order.
public enum Effect: Equatable, Sendable {
    /// Deliver to the app's lifecycle subscribers (and to monitors allowed to see `uid`, the
    /// app's owner: carried here because the app may be gone by the time it is delivered).
    case lifecycle(ProcessIdentity, uid: UInt32, LifecycleEvent)
    /// A task changed state (its `more` stream and monitors: only for a streamed task or one
    /// whose owner is among `BackgroundModel.monitoredOwners`).
    case taskChanged(TaskSnapshot)
    /// Suspend, resume or terminate the app (`terminate` carries the signal), and record it.
    case act(AppActionRecord, signal: TerminateSignal?)
    /// Send `SIGKILL`: the grace after a catchable terminate signal ran out.
    case kill(ProcessIdentity, uid: UInt32)
    /// Start or stop watching a process for its exit.
    case watch(ProcessIdentity)
    case unwatch(ProcessIdentity)
    case log(LogEntry)
    /// A wait the daemon armed (`schedule(_:at:)`) fell due.
    case due(Wait)
}
