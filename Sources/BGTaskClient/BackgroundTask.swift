import Foundation

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

/// Receives the app's lifecycle, like `UIApplicationDelegate`. Called on the application's
/// queue. Returning from `applicationDidEnterBackground(_:)` reports the transition finished.
public protocol BackgroundApplicationDelegate: AnyObject {
    func applicationDidEnterBackground(_ application: BackgroundApplication)
    func applicationWillEnterForeground(_ application: BackgroundApplication)
}

extension BackgroundApplicationDelegate {
    public func applicationDidEnterBackground(_ application: BackgroundApplication) {}
    public func applicationWillEnterForeground(_ application: BackgroundApplication) {}
}

/// A value or reference used only where the library's contract confines it (the delegate
/// and the handlers run on the application's queue).
struct Confined<Value>: @unchecked Sendable {
    let value: Value
}

/// A small lock around a value.
final class Locked<Value>: @unchecked Sendable {
    private var value: Value
    private let lock = NSLock()

    init(_ value: Value) { self.value = value }

    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
