// SPDX-License-Identifier: Apache-2.0
// The client's value types that the rules (ClientState) speak in; they depend on nothing, so
// the rules build alone (scripts/fuzz's clientstate target).

/// Why an expiration handler runs. UIKit's handlers are not told; these are.
public enum ExpirationReason: Equatable, Sendable, CustomStringConvertible {
    /// The app's background time is about to run out (`taskExpiring`): end the task now.
    case backgroundTimeExpiring(remaining: Double)
    /// Time ran out while the task was still held (`taskExpired`).
    case backgroundTimeExpired
    /// The grant was denied; the reason is the daemon's (e.g. `suspendedBeforeGrant`).
    case denied(String)
    /// The connection to bgtaskd was lost; the task is gone with it.
    case daemonUnavailable

    public var description: String {
        switch self {
        case let .backgroundTimeExpiring(remaining): "background time expiring (\(remaining)s left)"
        case .backgroundTimeExpired: "background time expired"
        case let .denied(reason): "denied: \(reason)"
        case .daemonUnavailable: "bgtaskd unavailable"
        }
    }
}

/// The app's state, shaped like `UIApplication.State` (same cases, same raw values).
/// bgtaskd's `foreground` is `.active`; `background` and `suspended` are `.background`
/// (a suspended app runs no code to see it); `.inactive` is the moment UIKit has it:
/// while `applicationWillEnterForeground(_:)` runs.
public enum ApplicationState: Int, Sendable, CustomStringConvertible {
    case active
    case inactive
    case background

    public var description: String {
        switch self {
        case .active: "active"
        case .inactive: "inactive"
        case .background: "background"
        }
    }
}
