// SPDX-License-Identifier: Apache-2.0
import BGTaskCore

/// What the session agent decides, and nothing else: which of the user's apps are on the
/// screen (from the compositor's windows and the login session's lock), and which to move
/// to the background or back. No I/O and no clock reads: time is an argument, as in the
/// daemon's model, so the rules are tested without a compositor.
///
/// The rules (bgtask-session(1)):
/// - an app is *shown* while the session is unlocked and active and, with `visible`, one of
///   its windows is visible, or, with `focused`, one of them is focused (activated and not
///   minimized);
/// - it goes to the background `backgroundDelay` after it stopped being shown (at once on a
///   lock); shown again within the delay cancels that; foreground is immediate;
/// - the agent manages only apps it has seen with a window, and moves to the foreground
///   only apps it moved to the background (undoing its own decisions, never another's).
public struct SessionModel {
    public enum FocusMode: String, Sendable, CaseIterable {
        /// Desktops: every app with a visible window is in the foreground.
        case visible
        /// Phones: only the focused (activated) app is.
        case focused
    }

    /// An app as the compositor knows it: by process (sway's windows carry a pid) or by unit
    /// (a wlr toplevel's app_id, matched to the unit the launcher started it in).
    public enum AppKey: Hashable, Sendable, CustomStringConvertible {
        case pid(Int32)
        case unit(String)
        public var description: String {
            switch self {
            case let .pid(pid): "pid \(pid)"
            case let .unit(unit): unit
            }
        }
    }

    /// One window (or toplevel) as last reported.
    public struct Window: Equatable, Sendable {
        public var app: AppKey
        public var visible: Bool
        public var focused: Bool
        /// Where it is, for the journal: "workspace 1", "the scratchpad".
        public var place: String
        public init(app: AppKey, visible: Bool, focused: Bool, place: String) {
            self.app = app
            self.visible = visible
            self.focused = focused
            self.place = place
        }
    }

    public enum Target: String, Sendable { case foreground, background }

    /// A `SetAppState` to make, with the reason the journal gets.
    public struct Decision: Equatable, Sendable, CustomStringConvertible {
        public var app: AppKey
        public var state: Target
        public var reason: String
        public init(app: AppKey, state: Target, reason: String) {
            self.app = app
            self.state = state
            self.reason = reason
        }
        public var description: String { "\(app) → \(state.rawValue) (\(reason))" }
    }

    public var focusMode: FocusMode
    public var backgroundDelay: Duration

    /// The windows of the last report, by app. An app seen once stays known (with no
    /// windows) until it exits: a process whose windows all closed goes to the background.
    private(set) var windows: [AppKey: [Window]] = [:]
    /// Apps the agent put in the background and has not brought back.
    public private(set) var backgrounded: Set<AppKey> = []
    /// Apps going to the background when the delay ends, with why.
    private(set) var pending: [AppKey: (due: Instant, reason: String)] = [:]
    /// Locked, or not the active session (a VT or user switch): nothing is shown.
    public private(set) var locked = false
    /// Why, as `setLocked` was told: the reason of an app that arrives meanwhile.
    private var lockReason = ""

    public init(focusMode: FocusMode = .visible, backgroundDelay: Duration = .seconds(5)) {
        self.focusMode = focusMode
        self.backgroundDelay = backgroundDelay
    }

    /// Every app the agent has seen with a window and not seen exit.
    public var knownApps: Set<AppKey> { Set(windows.keys) }

    /// When `tick` has something to do.
    public var nextDeadline: Instant? { pending.values.map(\.due).min() }

    public func isShown(_ app: AppKey) -> Bool { !locked && isOnScreen(app) }

    /// Shown but for the lock.
    func isOnScreen(_ app: AppKey) -> Bool {
        guard let list = windows[app] else { return false }
        switch focusMode {
        case .visible: return list.contains { $0.visible }
        case .focused: return list.contains { $0.focused }
        }
    }

    /// The compositor's whole current picture (sway's tree, wlr's toplevels): apps not in it
    /// have no window now.
    public mutating func observe(_ report: [Window], at now: Instant) -> [Decision] {
        let before = windows
        var next: [AppKey: [Window]] = [:]
        for window in report { next[window.app, default: []].append(window) }
        for app in before.keys where next[app] == nil { next[app] = [] }
        let wasShown = Set(before.keys.filter { isShown($0) })
        windows = next
        var decisions: [Decision] = []
        for app in next.keys.sorted(by: { $0.description < $1.description }) {
            let shown = isShown(app)
            if shown {
                pending[app] = nil
                if backgrounded.remove(app) != nil {
                    decisions.append(Decision(app: app, state: .foreground, reason: "window shown on \(place(of: app))"))
                }
            } else if wasShown.contains(app) || (before[app] == nil && !backgrounded.contains(app)) {
                // It left the screen (or arrived off it): background after the delay.
                guard !backgrounded.contains(app), pending[app] == nil else { continue }
                if locked, before[app] == nil, isOnScreen(app) {
                    // On the screen, which is locked (an agent started in a locked session):
                    // as the lock did to the apps there, at once.
                    backgrounded.insert(app)
                    decisions.append(Decision(app: app, state: .background, reason: lockReason))
                    continue
                }
                let reason = next[app]!.isEmpty ? "its windows closed"
                    : wasShown.contains(app) ? "window left \(place(of: app, in: before[app]!))"
                    : "window on \(place(of: app)) not shown"
                pending[app] = (now + backgroundDelay, reason)
            }
        }
        return decisions + tick(at: now)
    }

    /// The session was locked or left (`true`), or unlocked and active again (`false`).
    public mutating func setLocked(_ locked: Bool, reason: String, at now: Instant) -> [Decision] {
        guard locked != self.locked else { return [] }
        let shownBefore = Set(windows.keys.filter { isShown($0) })
        self.locked = locked
        lockReason = reason
        var decisions: [Decision] = []
        if locked {
            // iOS's lock button: every app on the screen goes now, without the delay.
            for app in windows.keys.sorted(by: { $0.description < $1.description })
            where shownBefore.contains(app) || pending[app] != nil {
                pending[app] = nil
                if backgrounded.insert(app).inserted {
                    decisions.append(Decision(app: app, state: .background, reason: reason))
                }
            }
        } else {
            for app in windows.keys.sorted(by: { $0.description < $1.description }) where isShown(app) {
                if backgrounded.remove(app) != nil {
                    decisions.append(Decision(app: app, state: .foreground, reason: reason))
                }
            }
        }
        return decisions
    }

    /// The backgrounds whose delay has ended.
    public mutating func tick(at now: Instant) -> [Decision] {
        let due = pending.filter { $0.value.due <= now }.sorted { $0.value.due < $1.value.due }
        var decisions: [Decision] = []
        for (app, entry) in due {
            pending[app] = nil
            if backgrounded.insert(app).inserted {
                decisions.append(Decision(app: app, state: .background, reason: entry.reason))
            }
        }
        return decisions
    }

    /// The app's process exited (or the daemon no longer knows it): forgotten.
    public mutating func forget(_ app: AppKey) {
        windows[app] = nil
        pending[app] = nil
        backgrounded.remove(app)
    }

    /// Apps a previous run of the agent put in the background (the daemon lists them with
    /// the agent as their manager): they are this run's to bring back.
    public mutating func adopt(_ apps: [AppKey]) {
        for app in apps where windows[app] == nil || !isShown(app) {
            backgrounded.insert(app)
            if windows[app] == nil { windows[app] = [] }
        }
    }

    /// Nobody will be in charge any more (the agent stops, the compositor went away): every
    /// app the agent backgrounded comes back, and nothing is pending.
    public mutating func releaseAll(reason: String) -> [Decision] {
        pending = [:]
        let decisions = backgrounded.sorted(by: { $0.description < $1.description })
            .map { Decision(app: $0, state: .foreground, reason: reason) }
        backgrounded = []
        return decisions
    }

    private func place(of app: AppKey) -> String { place(of: app, in: windows[app] ?? []) }

    private func place(of app: AppKey, in list: [Window]) -> String {
        let shown = list.first { focusMode == .visible ? $0.visible : $0.focused }
        return (shown ?? list.first)?.place ?? "no window"
    }
}
