// SPDX-License-Identifier: Apache-2.0
import Foundation
import BGTaskSystem

/// A background task's identifier, like `UIBackgroundTaskIdentifier`.
public struct BackgroundTaskIdentifier: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int

    public init(rawValue: Int) { self.rawValue = rawValue }

    /// No task: what `beginBackgroundTask` returns when it was refused.
    public static let invalid = BackgroundTaskIdentifier(rawValue: 0)

    public var description: String { self == .invalid ? "invalid" : String(rawValue) }
}

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

/// How a wake's work went, like `UIBackgroundFetchResult`.
public enum BackgroundFetchResult: Sendable {
    case newData, noData, failed
}

/// Receives the app's lifecycle, like `UIApplicationDelegate`. Called on the application's
/// queue. Returning from `applicationDidEnterBackground(_:)` reports the transition finished.
///
/// A wake (`bgtaskctl wake`, `Manager.Wake`) arrives as UIKit's background fetch (no payload)
/// or remote notification (with one); the manager's reason is `application.wakeReason`. Calling the completion handler sends `FinishWake`,
/// once however often it is called; if it is never called, the library sends it just before
/// the wake's window ends. A delegate that does not implement them completes at once
/// (`.noData`).
public protocol BackgroundApplicationDelegate: AnyObject {
    func applicationDidEnterBackground(_ application: BackgroundApplication)
    func applicationWillEnterForeground(_ application: BackgroundApplication)
    func application(_ application: BackgroundApplication,
                     performFetchWithCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void)
    func application(_ application: BackgroundApplication, didReceiveRemoteNotification userInfo: [String: Any],
                     fetchCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void)
}

extension BackgroundApplicationDelegate {
    public func applicationDidEnterBackground(_ application: BackgroundApplication) {}
    public func applicationWillEnterForeground(_ application: BackgroundApplication) {}
    public func application(_ application: BackgroundApplication,
                            performFetchWithCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void) {
        completionHandler(.noData)
    }
    public func application(_ application: BackgroundApplication, didReceiveRemoteNotification userInfo: [String: Any],
                            fetchCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void) {
        completionHandler(.noData)
    }
}

/// A wake's completion handler: the first call finishes the wake, later ones only log.
final class WakeCompletion: @unchecked Sendable {
    private let finish: @Sendable () -> Void
    private let called = Locked(false)

    init(_ finish: @escaping @Sendable () -> Void) { self.finish = finish }

    var call: @Sendable (BackgroundFetchResult) -> Void {
        { [self] _ in
            let first = called.withLock { called in
                defer { called = true }
                return !called
            }
            if first { finish() } else { BackgroundApplication.emit("A wake's completion handler was called again; ignored") }
        }
    }
}

extension BackgroundApplication {
    /// The app's state, shaped like `UIApplication.State` (same cases, same raw values).
    /// bgtaskd's `foreground` is `.active`; `background` and `suspended` are `.background`
    /// (a suspended app runs no code to see it); `.inactive` is the moment UIKit has it:
    /// while `applicationWillEnterForeground(_:)` runs.
    public enum State: Int, Sendable, CustomStringConvertible {
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
}

/// A value or reference used only where the library's contract confines it (the delegate
/// and the handlers run on the application's queue).
struct Confined<Value>: @unchecked Sendable {
    let value: Value
}
