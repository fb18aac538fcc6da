// SPDX-License-Identifier: Apache-2.0
/// How a process is suspended (rule 10).
public enum SuspendMode: String, CaseIterable, Sendable {
    /// The cgroup freezer when the app has a cgroup of its own, else signals.
    case auto
    /// Always the cgroup v2 freezer (falls back to signals, logged, when impossible).
    case freezer
    /// Always `SIGSTOP`/`SIGCONT`.
    case signal
}

/// Whether the machine is kept from idle-suspending while apps run in the background
/// (`AwakeHold`).
public enum KeepAwake: String, CaseIterable, Sendable {
    /// logind's `idle` inhibitor (block mode) is held while any app runs in the background.
    case yes
    case no
}

/// Whether a process app is moved into a transient scope of its own (containment `scope`).
public enum IsolateApps: String, CaseIterable, Sendable {
    /// Only processes of a user's own manager (`user@UID.service`), through that manager.
    case auto
    /// Also processes of login sessions and system services, through the system manager.
    case yes
    /// Never.
    case no
}

/// A signal the daemon may terminate apps with, by its Linux number.
public struct TerminateSignal: Hashable, Sendable, CustomStringConvertible {
    /// The Linux signal number.
    public var number: Int32
    /// The signal's name without the `SIG` prefix.
    public var name: String

    public static let kill = TerminateSignal(number: 9, name: "KILL")
    public static let term = TerminateSignal(number: 15, name: "TERM")
    /// Every signal accepted for `TerminateSignal=`.
    public static let all: [TerminateSignal] = [
        TerminateSignal(number: 1, name: "HUP"), TerminateSignal(number: 2, name: "INT"),
        TerminateSignal(number: 3, name: "QUIT"), .kill,
        TerminateSignal(number: 10, name: "USR1"), TerminateSignal(number: 12, name: "USR2"), .term,
    ]

    /// Parses `SIGTERM`, `TERM` or `15`.
    public init?(parsing text: String) {
        let upper = text.uppercased()
        let bare = upper.hasPrefix("SIG") ? String(upper.dropFirst(3)) : upper
        guard let found = Self.all.first(where: { $0.name == bare || String($0.number) == bare }) else {
            return nil
        }
        self = found
    }

    private init(number: Int32, name: String) {
        self.number = number
        self.name = name
    }

    public var description: String { "SIG" + name }
}

/// The daemon's configuration (DESIGN.md §4). Defaults are the built-in values.
public struct Configuration: Equatable, Sendable {
    // [Background]
    /// The background time budget shared by an app's tasks.
    public var backgroundTime: Duration = .seconds(30)
    /// How long before the deadline tasks are warned.
    public var expirationWarning: Duration = .seconds(5)
    /// How long a lifecycle-aware app has to report its transition finished.
    public var transitionTimeout: Duration = .seconds(5)
    /// The shortest grant latency.
    public var grantLatencyMin: Duration = .zero
    /// The longest grant latency.
    public var grantLatencyMax: Duration = .milliseconds(50)
    /// Seed for the grant latency; `nil` draws one at start.
    public var grantLatencySeed: UInt64? = nil
    /// Tasks older than this are logged, as UIKit does.
    public var taskAgeWarning: Duration = .seconds(30)
    /// How long a woken app runs before the usual rules apply (DESIGN.md §2c).
    public var wakeTime: Duration = .seconds(30)
    /// The rolling window a policy's `DailyBackgroundSec` counts over.
    public var quotaWindow: Duration = .seconds(24 * 3600)
    /// Whether apps running in the background keep the machine from idle-suspending.
    public var keepAwake: KeepAwake = .yes
    // [Scheduling]
    /// A refresh launch's window (`BGAppRefreshTaskRequest`: iOS gives about 30 s).
    public var refreshTime: Duration = .seconds(30)
    /// A processing launch's window (`BGProcessingTaskRequest`: minutes).
    public var processingTime: Duration = .seconds(600)
    /// How long after its date a request may wait to be launched with others.
    public var coalesceWindow: Duration = .seconds(60)
    /// Launches per app key in the quota window; `nil`: no limit.
    public var dailyLaunches: Int? = nil
    /// A key none of whose processes ran for this long loses its requests.
    public var requestRetention: Duration = .seconds(7 * 24 * 3600)
    /// Where the power supplies are (a test points it at a directory of its own).
    public var powerSupplyPath: String = "/sys/class/power_supply"
    // [Enforcement]
    public var suspendMode: SuspendMode = .auto
    public var isolateApps: IsolateApps = .auto
    public var terminateSignal: TerminateSignal = .kill
    /// With a catchable `terminateSignal`, `SIGKILL` follows after this.
    public var terminateGrace: Duration = .seconds(2)
    // [Limits]
    public var maxApps: Int = 8192
    /// Apps one unprivileged uid may own. Root-owned apps are not limited, and a privileged
    /// manager may register an app for a uid at its limit (that app then counts too).
    public var maxAppsPerUser: Int = 1024
    public var maxTasksPerApp: Int = 1000
    /// Active tasks of all the apps one unprivileged uid owns.
    public var maxTasksPerUser: Int = 4096
    public var maxConnectionsPerUser: Int = 256
    /// Pending scheduled requests of all the apps one unprivileged uid owns, and in all.
    public var maxTaskRequestsPerUser: Int = 1024
    public var maxTaskRequests: Int = 65536
    /// The largest Varlink message accepted, in bytes.
    public var maxMessageBytes: Int = 64 * 1024
    // [Access]
    /// A group whose members may manage every app; empty for none.
    public var managerGroup: String = ""

    public init() {}

    /// Apps kept back for root and `ManagerGroup`: unprivileged callers may register only up
    /// to `maxApps - reservedApps`, so several users at their limits still leave room.
    public var reservedApps: Int { maxApps / 16 }
}
