// SPDX-License-Identifier: Apache-2.0
extension BackgroundModel {
    /// A registered app, as the model keeps it.
    struct AppRecord {
        let identity: ProcessIdentity
        let uid: UInt32
        let command: String
        /// The unit cgroup the app is (`containment == .unit`).
        var unit: String?
        var containment: Containment
        /// The policy file that matched it (DESIGN.md §2b); `nil`: `bgtaskd.conf` alone. Boxed:
        /// most apps have none, and a policy (a whole configuration) is large.
        var policyBox: Shared<AppPolicy>?
        var policy: AppPolicy? {
            get { policyBox?.value }
            set { policyBox = newValue.map(Shared.init) }
        }
        /// What its daily background time is kept by: the app across relaunches.
        var quotaKey: String?
        /// Since when it has held a granted task in the background, for an app with a quota.
        var holdingSince: Instant?
        var state: AppState = .foreground
        var phase: BackgroundPhase?
        /// When background time runs out; set while background.
        var deadline: Instant?
        /// When an unfinished transition is terminated; set while in `transition`.
        var transitionDeadline: Instant?
        /// Whether the expiration warning went out for this background period.
        var warned = false
        /// Bumped on every change between foreground and background; timers armed in an
        /// earlier period are stale.
        var epoch: UInt64 = 0
        var subscribers = 0
        /// Who last moved it between foreground and background (`SetAppState`'s caller).
        var manager: String?
        /// The app key its scheduled requests are kept by (`BackgroundModel+Requests`).
        var requestKey: String?
        /// Active tasks, oldest first.
        var taskIDs: [TaskID] = []
    }
}

extension BackgroundModel.AppRecord {
    /// Rule 5: in the background past its transition (and not woken), no task left, not
    /// exempt: suspended now.
    var idleInBackground: Bool {
        state == .background && phase != .transition && phase != .woken && taskIDs.isEmpty && policyBox?.value.exempt != true
    }

    /// Whether its background time counts against a daily quota (`settleQuota`).
    var countsQuota: Bool { policyBox?.value.dailyBackground != nil && quotaKey != nil }
}
