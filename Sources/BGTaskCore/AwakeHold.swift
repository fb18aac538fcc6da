// SPDX-License-Identifier: Apache-2.0
/// Whether the machine is kept from idle-suspending for the apps running in the background
/// (`KeepAwake=`), as iOS keeps the device awake for background tasks: logind's `idle`
/// inhibitor is asked for when the first app runs in the background and released once none
/// has for `linger` (an app going back and forth costs logind one inhibitor, not one per
/// move). One request at a time; after a refusal (or no logind at all) it is asked again no
/// sooner than `retryDelay`. Pure: the daemon carries out its steps (`Daemon+Awake`).
public struct AwakeHold: Sendable {
    public enum Step: Equatable, Sendable {
        case nothing
        /// Ask logind for the inhibitor; `answered` follows.
        case take
        /// Close the inhibitor's descriptor.
        case release
        /// Call `update` again at this instant.
        case recheck(Instant)
    }

    public enum Holding: Equatable, Sendable {
        case none, asking, held
    }

    public private(set) var holding: Holding = .none
    /// Whether apps ran in the background, as last told.
    public private(set) var wanted = false
    /// Since when no app has run in the background while the inhibitor is held.
    private var unwantedSince: Instant?
    /// When logind last refused (or could not be reached).
    private var refusedAt: Instant?
    /// Whether logind's last answer was a refusal (or it could not be reached): asked again
    /// `retryDelay` after it while apps run in the background.
    public var refused: Bool { refusedAt != nil }

    public static let linger = Duration.seconds(2)
    public static let retryDelay = Duration.seconds(60)

    public init() {}

    /// Whether apps run in the background at `now`.
    public mutating func update(wanted: Bool, at now: Instant) -> Step {
        self.wanted = wanted
        if wanted { unwantedSince = nil }
        switch holding {
        case .asking:
            return .nothing
        case .none:
            guard wanted else { return .nothing }
            if let refusedAt, now < refusedAt + Self.retryDelay { return .recheck(refusedAt + Self.retryDelay) }
            holding = .asking
            return .take
        case .held:
            guard !wanted else { return .nothing }
            let since = unwantedSince ?? now
            guard now >= since + Self.linger else {
                unwantedSince = since
                return .recheck(since + Self.linger)
            }
            holding = .none
            unwantedSince = nil
            return .release
        }
    }

    /// logind's answer to `take`: whether the inhibitor came. What the apps did meanwhile
    /// decides the next step (a lock that came too late lingers, then goes).
    public mutating func answered(taken: Bool, at now: Instant) -> Step {
        holding = taken ? .held : .none
        refusedAt = taken ? nil : now
        return update(wanted: wanted, at: now)
    }
}
