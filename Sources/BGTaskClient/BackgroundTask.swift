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
    /// The app's state, shaped like `UIApplication.State` (`ApplicationState`).
    public typealias State = ApplicationState
}

/// A value or reference used only where the library's contract confines it (the delegate
/// and the handlers run on the application's queue).
struct Confined<Value>: @unchecked Sendable {
    let value: Value
}
