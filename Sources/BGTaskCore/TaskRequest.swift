// SPDX-License-Identifier: Apache-2.0
/// iOS's two kinds of scheduled work (`BGAppRefreshTaskRequest`, `BGProcessingTaskRequest`).
public enum TaskRequestKind: String, CaseIterable, Sendable {
    /// Refresh content: a short window (`RefreshTimeSec`).
    case refresh
    /// Deferrable work: a long window (`ProcessingTimeSec`), under conditions.
    case processing
}

/// A request to be launched later: `SubmitTaskRequest` (DESIGN.md, scheduled work).
public struct TaskRequest: Equatable, Sendable {
    public var identifier: String
    public var kind: TaskRequestKind
    /// Never launched before this.
    public var earliestBegin: Instant
    public var requiresExternalPower: Bool
    public var requiresNetworkConnectivity: Bool
    /// Periodic: submitted again this long after each launch (at least `minimumInterval`).
    public var interval: Duration?

    /// The shortest period (Android's, for periodic work).
    public static let minimumInterval = Duration.seconds(15 * 60)
    /// The longest period, and the furthest `earliestBeginDate`, a submission may ask for.
    public static let maximumSeconds: Double = 366 * 86_400
    /// iOS's limits: pending requests of one app, by kind.
    public static func maximumPending(_ kind: TaskRequestKind) -> Int { kind == .refresh ? 1 : 10 }

    public init(identifier: String, kind: TaskRequestKind, earliestBegin: Instant, requiresExternalPower: Bool = false,
                requiresNetworkConnectivity: Bool = false, interval: Duration? = nil) {
        self.identifier = identifier
        self.kind = kind
        self.earliestBegin = earliestBegin
        self.requiresExternalPower = requiresExternalPower
        self.requiresNetworkConnectivity = requiresNetworkConnectivity
        self.interval = interval
    }

    /// Identifiers are names in tables and logs: 1 to 256 bytes, no control characters.
    public static func validate(identifier: String) throws(BGTaskError) -> String {
        guard !identifier.isEmpty, identifier.utf8.count <= 256, !identifier.containsControlCharacters else {
            throw .invalidParameter("identifier")
        }
        return identifier
    }
}

/// What the system says of the conditions a processing request may require.
public struct Conditions: Equatable, Sendable {
    /// On mains or USB power (a machine with no power supply at all counts as on power).
    public var externalPower: Bool
    /// A default route exists.
    public var network: Bool

    public init(externalPower: Bool = true, network: Bool = true) {
        self.externalPower = externalPower
        self.network = network
    }
}

/// What a pending request waits for, as `bgtaskctl requests` says it.
public enum RequestWait: String, Sendable {
    /// Its earliest begin date.
    case date
    case power
    case network
    /// The app's daily background time or `DailyLaunches` is used up for now.
    case quota
    /// Due, and gathered with others due within `CoalesceWindowSec`: launched together.
    case coalescing
    /// The app is in the foreground: it can do the work itself.
    case foreground
    /// No process of the app runs (it is launched when one does).
    case app
}

/// A pending request as listed.
public struct TaskRequestSnapshot: Equatable, Sendable {
    public var key: String
    public var uid: UInt32
    /// The process of the app, if one runs.
    public var app: ProcessIdentity?
    public var request: TaskRequest
    public var waitingFor: RequestWait
}

/// A request saved with its app key (the state file): what survives a restart.
public struct SavedRequests: Equatable, Sendable {
    public var uid: UInt32
    public var requests: [TaskRequest]
    /// When a process of the app last ran (`RequestRetentionSec` counts from it).
    public var lastSeen: Instant
    /// Launches in the quota window, for `DailyLaunches`.
    public var launches: [Instant]

    public init(uid: UInt32, requests: [TaskRequest], lastSeen: Instant, launches: [Instant]) {
        self.uid = uid
        self.requests = requests
        self.lastSeen = lastSeen
        self.launches = launches
    }
}
