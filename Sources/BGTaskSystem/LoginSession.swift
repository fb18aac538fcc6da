// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A logind session on the system bus, watched: `changed` runs on the event loop whenever
/// its properties change (a screen locker's `SetLockedHint`, a VT or user switch), with its
/// `LockedHint` and `Active` read again. `org.freedesktop.login1(5)`
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
        let watched = bgtask_logind_watch(bus, path, { _, userdata, _ in
            let watcher = Unmanaged<Watcher>.fromOpaque(userdata!).takeUnretainedValue()
            if let session = watcher.session, let state = try? session.state() { watcher.changed(state) }
            return 0
        }, watcher.toOpaque())
        let attached = watched < 0 ? watched : sd_bus_attach_event(bus, loop.event, 0)
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
        return State(locked: locked != 0, active: active != 0)
    }

    private final class Watcher {
        let changed: (State) -> Void
        weak var session: LoginSession?
        init(_ changed: @escaping (State) -> Void) { self.changed = changed }
    }
}
