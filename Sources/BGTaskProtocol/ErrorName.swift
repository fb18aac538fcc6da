// SPDX-License-Identifier: Apache-2.0
import Varlink

/// Every error bgtaskd answers with, by its Varlink name: the one table the daemon, the Swift
/// client and bgtaskctl read (libbgtask's copy, `bgtask-protocol.h`, is checked against it
/// by ProtocolTests). The io.bgtaskd errors are declared in io.bgtaskd.varlink; the others
/// are Varlink's own.
public enum ErrorName: String, CaseIterable, Sendable {
    /// No task with that id is active in the caller's app (`taskId`: the id given).
    case noSuchTask = "io.bgtaskd.App.NoSuchTask"
    /// The app's background time is used up.
    case noBackgroundTime = "io.bgtaskd.App.NoBackgroundTime"
    /// A configured limit was reached (`limit` says which).
    case limitExceeded = "io.bgtaskd.App.LimitExceeded"
    /// The state file (`path`) cannot be written, so nothing may change.
    case stateNotWritable = "io.bgtaskd.App.StateNotWritable"
    /// The app has as many requests of that `kind` pending as it may (1 refresh, 10 processing).
    case tooManyPendingTaskRequests = "io.bgtaskd.App.TooManyPendingTaskRequests"
    /// No request with that `identifier` is pending (or launched and not completed).
    case noSuchTaskRequest = "io.bgtaskd.App.NoSuchTaskRequest"
    /// No app contains that process (`pid`), or no unit app has that name (`unit`).
    case noSuchApp = "io.bgtaskd.Manager.NoSuchApp"
    /// `Reload` found the configuration wrong (`message`); nothing was changed.
    case invalidConfiguration = "io.bgtaskd.Manager.InvalidConfiguration"
    case interfaceNotFound = "org.varlink.service.InterfaceNotFound"
    case methodNotFound = "org.varlink.service.MethodNotFound"
    case methodNotImplemented = "org.varlink.service.MethodNotImplemented"
    case invalidParameter = "org.varlink.service.InvalidParameter"
    case permissionDenied = "org.varlink.service.PermissionDenied"
    case expectedMore = "org.varlink.service.ExpectedMore"

    /// The error a reply names; `nil` for one this version does not know.
    public init?(_ error: VarlinkError) {
        self.init(rawValue: error.name)
    }

    /// Whether `error` is this one.
    public func matches(_ error: VarlinkError?) -> Bool {
        error?.name == rawValue
    }

    /// The error with its parameters, for a reply.
    public func callAsFunction(_ parameters: [String: JSON] = [:]) -> VarlinkError {
        VarlinkError(rawValue, parameters: parameters)
    }
}
