// SPDX-License-Identifier: Apache-2.0
/// An error the model answers a request with. Each maps to one Varlink error name
/// (`BGTaskProtocol.ErrorName`, by the daemon's `Wire`).
public enum BGTaskError: Error, Equatable, Sendable {
    /// No task with that id is active in the caller's app.
    case noSuchTask(TaskID)
    /// The app's background time is used up (warned, or suspended).
    case noBackgroundTime
    /// A configured limit was reached; says which.
    case limitExceeded(String)
    /// No app contains that process.
    case noSuchApp(Int32)
    /// No unit app (nor any cgroup) has that unit name.
    case noSuchUnit(String)
    /// A parameter was refused (pid 1, the daemon itself, a kernel thread, a bad value).
    case invalidParameter(String)
    /// The state file (named) cannot be written, so nothing may change (a full disk).
    case stateNotWritable(String)
    /// The app has as many requests of that kind (named) pending as it may.
    case tooManyPendingTaskRequests(String)
    /// No request with that identifier is pending, or launched and not completed.
    case noSuchTaskRequest(String)
}
