// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A logind session on the system bus, watched: `changed` runs on the event loop whenever
/// its `LockedHint` or `Active` changes (a screen locker's `SetLockedHint`, a VT or user
/// switch), with both. `org.freedesktop.login1(5)`
public final class LoginSession {
    private let bus: OpaquePointer
    private let loop: EventLoop
    public let path: String
    private let watcher: Unmanaged<Watcher>

    public struct State: Equatable, Sendable {
        public var locked: Bool
        public var active: Bool
    }

    /// The session `id` (`$XDG_SESSION_ID`), else the display session of user `uid`.
    public init(id: String?, uid: UInt32, loop: EventLoop, changed: @escaping (State) -> Void) throws(Errno) {
        var bus: OpaquePointer?
        try systemdCall("connect to the system bus") { sd_bus_open_system(&bus) }
        var raw: UnsafeMutablePointer<CChar>?
        let found = bgtask_logind_session_path(bus, id, uid, &raw)
        guard found >= 0, let raw else {
            sd_bus_flush_close_unref(bus)
            throw Errno(-found, id.map { "logind session \($0)" } ?? "the display session of uid \(uid)")
        }
        path = String(cString: raw)
        free(raw)
        self.bus = bus!
        self.loop = loop
        let watcher = Unmanaged.passRetained(Watcher(changed))
        self.watcher = watcher
        watcher.takeUnretainedValue().session = nil
        let watched = bgtask_logind_watch(bus, path, { message, userdata, _ in
            let watcher = Unmanaged<Watcher>.fromOpaque(userdata!).takeUnretainedValue()
            if let session = watcher.session, session.isFromLogind(message), let state = session.state(changedBy: message) {
                watcher.changed(state)
            }
            return 0
        }, watcher.toOpaque())
        // Who logind is on the bus, and again whenever that changes (a restart): its signals
        // are told from others' by their sender (`isFromLogind`).
        let owned = watched < 0 ? watched : bgtask_bus_watch_owner(bus, "org.freedesktop.login1", { message, userdata, _ in
            let watcher = Unmanaged<Watcher>.fromOpaque(userdata!).takeUnretainedValue()
            if let owner = bgtask_bus_new_owner(message) { watcher.session?.logind = owner.pointee == 0 ? nil : String(cString: owner) }
            return 0
        }, watcher.toOpaque())
        var owner: UnsafeMutablePointer<CChar>?
        if owned >= 0, bgtask_bus_name_owner(bus, "org.freedesktop.login1", &owner) >= 0, let owner {
            logind = String(cString: owner)
            free(owner)
        }
        let attached = owned < 0 ? owned : sd_bus_attach_event(bus, loop.event, 0)
        guard attached >= 0 else {
            sd_bus_flush_close_unref(bus)
            watcher.release()
            throw Errno(-attached, "watch \(path)")
        }
        watcher.takeUnretainedValue().session = self
        loop.eventSourcesChanged()
    }

    deinit {
        sd_bus_flush_close_unref(bus)
        watcher.release()
    }

    /// `LockedHint` and `Active`, read now (a round trip to logind).
    public func state() throws(Errno) -> State {
        var locked: Int32 = 0, active: Int32 = 0
        // A call of its own on the attached bus may read other messages into its queue.
        defer { loop.eventSourcesChanged() }
        try systemdCall("read \(path)") { bgtask_logind_session_state(bus, path, &locked, &active) }
        let state = State(locked: locked != 0, active: active != 0)
        last = state
        return state
    }

    /// The state as last read or signalled.
    private var last: State?

    /// logind's unique name on the bus: asked at the start, then as the bus reports it
    /// changed (`bgtask_bus_watch_owner`, only from the bus itself).
    private var logind: String?
    /// Signals ignored since the last line that said so, and when that was.
    private var ignored = 0
    private var ignoredLoggedAt: Int64?
    static let ignoredLogSpacing: Int64 = 60_000_000_000

    /// Whether `message` comes from logind. The system bus lets any user send a signal, and
    /// one addressed to the agent's connection reaches it past the match's sender: uid 65534
    /// sending the agent a `PropertiesChanged` of its session with `LockedHint` true had
    /// every one of the user's apps on the screen suspended (`session-test.sh`,
    /// `spoofed-lock-ignored`). A string comparison, no round trip: another's signal costs
    /// the agent nothing more, and its lines are one a minute.
    func isFromLogind(_ message: OpaquePointer?) -> Bool {
        guard let raw = sd_bus_message_get_sender(message) else { return false }
        let sender = String(cString: raw)
        if sender == logind { return true }
        ignored += 1
        let now = Clock.monotonicNanoseconds()
        if ignoredLoggedAt.map({ now - $0 >= Self.ignoredLogSpacing }) ?? true {
            let more = ignored > 1 ? " (and \(ignored - 1) more since the last such line)" : ""
            Journal.log(priority: 4, message: "a PropertiesChanged of \(path) from \(sender), not from logind (\(logind ?? "not on the bus")): ignored\(more)")
            ignoredLoggedAt = now
            ignored = 0
        }
        return false
    }

    /// The state after a `PropertiesChanged` of the session; `nil` if it changed neither
    /// property. The values come with the signal (logind sends them), so a lock reaches the
    /// agent's calls with no round trip to logind (two reads cost ~1.5 ms of every lock's
    /// way to the apps suspended, measured in the session lock bench); a property named
    /// without its value, a signal that cannot be read, or no state known yet are read.
    func state(changedBy message: OpaquePointer?) -> State? {
        var locked: Int32 = 0, active: Int32 = 0
        let found = bgtask_logind_changed(message, &locked, &active)
        if found == 0 { return nil }
        guard found > 0, found & 4 == 0, var state = last else { return try? state() }
        if found & 1 != 0 { state.locked = locked != 0 }
        if found & 2 != 0 { state.active = active != 0 }
        last = state
        return state
    }

    private final class Watcher {
        let changed: (State) -> Void
        weak var session: LoginSession?
        init(_ changed: @escaping (State) -> Void) { self.changed = changed }
    }
}
