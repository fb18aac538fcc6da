// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskCore
import BGTaskProtocol
import BGTaskSession
import BGTaskSystem
import CSystemd
import CWayland
import Glibc
import Varlink

typealias AppKey = SessionModel.AppKey
typealias Decision = SessionModel.Decision

func log(_ priority: Int, _ message: String) { Journal.log(priority: priority, message: message) }

/// The session agent: the compositor's windows and logind's lock in, `SetAppState` calls
/// out, through `SessionModel`. Single-threaded on one sd-event loop; nothing waits except
/// the last calls when it stops.
final class Agent {
    let loop: EventLoop
    var model: SessionModel
    let settings: SessionSettings
    let socketPath: String
    let uid = getuid()

    // The daemon: calls pipelined, replies matched in order.
    var daemon: PipelinedConnection<Decision>?
    var daemonSource: EventSource?
    /// Decisions not yet acknowledged, the latest per app: sent again after a reconnect.
    var outbox: [AppKey: Decision] = [:]
    var daemonRetry: EventSource!
    var daemonRetryDelay: Int64 = 100_000_000
    var adopted = false

    /// Where windows come from.
    enum Source { case sway(String), wlr, none }
    let source: Source

    // The compositor: sway's IPC.
    var swayPath: String? { if case let .sway(path) = source { path } else { nil } }
    var sway: FileDescriptor?
    var swaySource: EventSource?
    var framer = SwayIPC.Framer()
    var swayOutput: [UInt8] = []
    var treeInFlight = false
    var treeDirty = false
    var swayRetry: EventSource!
    /// The unit the compositor runs in, if it is one an app could be (sway.service, a
    /// scope): a window in it is left alone, or the daemon would suspend the compositor too.
    var compositorUnit: String?
    /// The compositor socket last refused, path and uid (`refuseCompositor`): logged once.
    var refusedCompositor: String?

    /// The processes of the windows, watched for their exit by pidfd.
    var processes: [Int32: (pidfd: Pidfd, source: EventSource)] = [:]

    // The compositor: wlr-foreign-toplevel-management.
    var wlr: OpaquePointer?
    var wlrSource: EventSource?
    var toplevels: [UInt32: (appID: String?, activated: Bool, minimized: Bool)] = [:]
    /// app_ids with no unit (or several): logged once each.
    var unmatched: Set<String> = []
    /// Windows refused (another user's, pid 1, gone): logged once each.
    var refused: Set<Int32> = []

    /// Compositor events since the suspended apps were last let drain theirs (see `drain`).
    var compositorEvents = 0
    static let drainEvery = 100

    var login: LoginSession?
    var delayTimer: EventSource!
    var signals: [EventSource] = []

    init(settings: SessionSettings, socketPath: String, source: Source) throws {
        loop = try EventLoop()
        self.settings = settings
        self.socketPath = socketPath
        self.source = source
        model = SessionModel(focusMode: settings.focusMode, backgroundDelay: settings.backgroundDelay)
        delayTimer = try loop.addTimer { [unowned self] in apply(model.tick(at: now)); armDelay() }
        daemonRetry = try loop.addTimer { [unowned self] in connectDaemon() }
        swayRetry = try loop.addTimer { [unowned self] in connectCompositor() }
        for signal in [SIGTERM, SIGINT] {
            signals.append(try loop.addSignal(signal) { [unowned self] in stop(reason: "bgtask-session stopping") })
        }
    }

    var now: Instant { Instant(nanoseconds: Clock.monotonicNanoseconds()) }

    func run() throws -> Int32 {
        connectDaemon()
        connectCompositor()
        watchLogin()
        return try loop.run()
    }

    // MARK: decisions

    /// Sends the decisions in one write: a lock that backgrounds 200 apps is one round trip,
    /// handled by the daemon in one pass.
    func apply(_ decisions: [Decision]) {
        // The lines of one change go out together, after the calls (`Journal.holding`).
        Journal.holding = true
        defer {
            Journal.flush()
            Journal.holding = false
        }
        for decision in decisions {
            log(6, "\(decision.app): \(decision.state.rawValue), \(decision.reason)")
            outbox[decision.app] = decision
        }
        send(decisions)
    }

    func send(_ decisions: [Decision]) {
        // A window's pid is sent only while its pidfd says that process lives: a pid reused
        // by another of the user's processes is never moved.
        let live = decisions.filter { decision in
            guard case let .pid(pid) = decision.app, processes[pid]?.pidfd.hasExited == true else { return true }
            forget(decision.app)
            return false
        }
        guard let daemon else { return }  // kept in the outbox for the reconnect
        do {
            for decision in live { try daemon.send(call(for: decision), tag: decision, flush: false) }
            try daemon.flush()
            updateDaemonEvents()
        } catch {
            daemonLost("\(error)")
        }
    }

    func call(for decision: Decision) -> VarlinkCall {
        var parameters: [String: JSON] = ["state": .string(decision.state.rawValue), "reason": .string(decision.reason)]
        switch decision.app {
        case let .pid(pid): parameters["pid"] = .int(Int64(pid))
        case let .unit(unit): parameters["unit"] = .string(unit)
        }
        return VarlinkCall(.setAppState, parameters: parameters)
    }

    func armDelay() {
        delayTimer.arm(at: model.nextDeadline?.nanoseconds)
    }

    // MARK: the daemon

    func connectDaemon() {
        do {
            if !adopted { try adopt() }
            let connection = try PipelinedConnection<Decision>(path: socketPath)
            daemon = connection
            daemonSource = try loop.addIO(connection.fileDescriptor, events: UInt32(EPOLLIN.rawValue | EPOLLRDHUP.rawValue)) {
                [unowned self] _ in daemonReady()
            }
            daemonRetryDelay = 100_000_000
            log(6, "connected to bgtaskd at \(socketPath)")
            // What did not reach the daemon before it went away (or before it was up).
            send(outbox.values.sorted(by: { $0.app.description < $1.app.description }))
        } catch {
            if daemonRetryDelay == 100_000_000 { log(4, "bgtaskd at \(socketPath): \(error); trying again") }
            daemon = nil
            daemonRetry.arm(at: Clock.monotonicNanoseconds() + daemonRetryDelay)
            daemonRetryDelay = min(daemonRetryDelay * 2, 2_000_000_000)
        }
    }

    /// Apps an earlier run of the agent put in the background are this run's to bring back.
    func adopt() throws {
        let connection = try VarlinkConnection(path: socketPath)
        defer { connection.close() }
        let reply = try connection.call(.manager(.listApps), timeoutMilliseconds: 5000)
        let mine = (reply["apps"]?.arrayValue ?? []).compactMap { app -> AppKey? in
            guard app["uid"]?.intValue == Int64(uid), app["manager"]?.stringValue?.hasPrefix("bgtask-session[") == true,
                  app["state"]?.stringValue == "background" || app["state"]?.stringValue == "suspended",
                  let pid = app["pid"]?.intValue else { return nil }
            return .pid(Int32(pid))
        }
        if !mine.isEmpty { log(6, "taking over \(mine.count) apps an earlier bgtask-session put in the background") }
        model.adopt(mine)
        adopted = true
    }

    func updateDaemonEvents() {
        guard let daemon else { return }
        var events = UInt32(EPOLLIN.rawValue | EPOLLRDHUP.rawValue)
        if daemon.wantsWrite { events |= UInt32(EPOLLOUT.rawValue) }
        daemonSource?.setIOEvents(events)
    }

    func daemonReady() {
        guard let daemon else { return }
        do {
            try daemon.flush()
            for (decision, reply) in try daemon.receiveAvailable() { answered(decision, reply) }
            updateDaemonEvents()
        } catch {
            daemonLost("\(error)")
        }
    }

    func answered(_ decision: Decision, _ reply: VarlinkReply) {
        if outbox[decision.app] == decision { outbox[decision.app] = nil }
        guard let error = reply.error else { return }
        let name = error.split(separator: ".").last.map(String.init) ?? error
        switch name {
        case "NoSuchApp", "NoSuchProcess", "NoSuchUnit":
            forget(decision.app)  // it exited
        default:
            log(4, "bgtaskd refused \(decision.app) \(decision.state.rawValue): \(error)")
            if name == "PermissionDenied" { forget(decision.app) }
        }
    }

    func daemonLost(_ why: String) {
        guard daemon != nil else { return }
        log(4, "lost bgtaskd (\(why)); reconnecting")
        daemonSource = nil
        daemon?.close()
        daemon = nil
        daemonRetry.arm(at: Clock.monotonicNanoseconds() + daemonRetryDelay)
    }

    // MARK: the compositor (wlr-foreign-toplevel-management)

    func connectWlr() {
        var raw: OpaquePointer?
        var peerUID = -1
        let result = bgtask_wlr_connect(nil, { userdata, kind, id, appID, activated, minimized in
            let agent = Unmanaged<Agent>.fromOpaque(userdata!).takeUnretainedValue()
            agent.toplevelChanged(kind, id, appID.map { String(cString: $0) }, activated: activated != 0, minimized: minimized != 0)
        }, Unmanaged.passUnretained(self).toOpaque(), &raw, &peerUID)
        guard result == 0, let raw else {
            if result == -ENOTSUP { return log(3, "this bgtask-session was built without wlr-foreign-toplevel support") }
            // Logged once until a compositor is followed, as for sway: a display that comes and
            // goes between two looks does not log its refusal again each time.
            if result == -EPERM {
                refuseCompositor(at: "Wayland display \(Host.environment("WAYLAND_DISPLAY") ?? "wayland-0")", uid: peerUID < 0 ? nil : UInt32(peerUID))
            }
            if result == -ENOENT { log(4, "the compositor offers no zwlr_foreign_toplevel_manager_v1; looking again in a second") }
            swayRetry.arm(at: Clock.monotonicNanoseconds() + 1_000_000_000)
            return
        }
        wlr = raw
        refusedCompositor = nil
        compositorUnit = unit(of: bgtask_wlr_peer_pid(raw))
        do {
            wlrSource = try loop.addIO(bgtask_wlr_fd(raw), events: UInt32(EPOLLIN.rawValue | EPOLLRDHUP.rawValue)) { [unowned self] _ in
                wlrReady()
            }
        } catch {
            return compositorGone("\(error)")
        }
        log(6, "following the compositor's toplevels (wlr-foreign-toplevel-management) at \(Host.environment("WAYLAND_DISPLAY") ?? "wayland-0")")
        observeToplevels()
    }

    func toplevelChanged(_ kind: Int32, _ id: UInt32, _ appID: String?, activated: Bool, minimized: Bool) {
        countCompositorEvent()
        switch kind {
        case 1: toplevels[id] = (appID, activated, minimized)
        case 2: toplevels[id] = nil
        default: break  // finished: the dispatch says the compositor is gone
        }
    }

    func wlrReady() {
        guard let wlr else { return }
        let result = bgtask_wlr_dispatch(wlr)
        if result < 0 { return compositorGone("the compositor's toplevel stream ended (\(String(cString: strerror(-result))))") }
        observeToplevels()
    }

    /// The toplevels as windows of the units they are instances of.
    func observeToplevels() {
        let units = userUnits()
        var report: [SessionModel.Window] = []
        for toplevel in toplevels.values {
            guard let appID = toplevel.appID else { continue }
            let matching = units.filter { UnitNaming.unit(AppUnit.name(ofPath: $0), isInstanceOf: appID) }
            guard matching.count == 1, let path = matching.first, path != compositorUnit else {
                if unmatched.count >= 4096 { unmatched.removeAll() }
                if unmatched.insert(appID).inserted {
                    let why = matching.isEmpty ? "no unit of yours is named for it (app-…-\(UnitNaming.escape(appID).cEscaped)-….scope)"
                        : matching.count > 1 ? "\(matching.count) units are named for it; a toplevel does not say which"
                        : "it shares the compositor's unit"
                    log(5, "toplevel '\(String(appID.prefix(256)).cEscaped)' left alone: \(why)")
                }
                continue
            }
            report.append(.init(app: .unit(path), visible: !toplevel.minimized, focused: toplevel.activated && !toplevel.minimized,
                                place: "app_id \(String(appID.prefix(64)).cEscaped)"))
        }
        apply(model.observe(report, at: now))
        armDelay()
    }

    /// The units of the user's own manager (cgroup paths), where launchers start apps: at
    /// most 10,000 cgroups looked at.
    func userUnits() -> [String] {
        guard let base = Cgroup.at(path: "/user.slice/user-\(uid).slice/user@\(uid).service") else { return [] }
        return base.find(where: { path in
            let name = AppUnit.name(ofPath: path)
            return name.hasPrefix("app-") && (name.hasSuffix(".scope") || name.hasSuffix(".service"))
        }, limit: 10_000).found.map(\.path)
    }

    // MARK: a suspended client's backlog

    func countCompositorEvent() {
        compositorEvents += 1
        if compositorEvents >= Self.drainEvery {
            compositorEvents = 0
            drain()
        }
    }

    /// A suspended Wayland client reads nothing; what the compositor sends it (configures on
    /// every workspace flip, output changes, clipboard offers) piles up in its socket, and once
    /// the socket and libwayland's buffer are full (about 200 KB: some 300 workspace flips, see
    /// the README) the compositor disconnects it: the app loses its windows. So every 100
    /// compositor events the agent wakes the apps it suspended (`Wake`, reason
    /// "compositor-backlog": they run for WakeTimeSec, read their backlog, and are suspended
    /// again). Waits at most 2 s for the daemon.
    func drain() {
        guard !model.backgrounded.isEmpty else { return }
        do {
            let connection = try VarlinkConnection(path: socketPath)
            defer { connection.close() }
            let reply = try connection.call(.manager(.listApps), timeoutMilliseconds: 2000)
            let suspended = (reply["apps"]?.arrayValue ?? []).filter {
                $0["uid"]?.intValue == Int64(uid) && $0["state"]?.stringValue == "suspended"
                    && $0["manager"]?.stringValue?.hasPrefix("bgtask-session[") == true
            }
            for app in suspended {
                var parameters: [String: JSON] = ["reason": .string("compositor-backlog")]
                if let unit = app["unit"]?.stringValue { parameters["unit"] = .string(unit) } else { parameters["pid"] = app["pid"] ?? .null }
                try connection.send(VarlinkCall(.wake, parameters: parameters))
            }
            for _ in suspended { _ = try connection.receive(timeoutMilliseconds: 2000) }
            if !suspended.isEmpty { log(7, "woke \(suspended.count) suspended apps to read their compositor backlog") }
        } catch {
            log(4, "could not let suspended apps read their compositor backlog: \(error)")
        }
    }

    // MARK: logind

    func watchLogin() {
        let id = Host.environment("XDG_SESSION_ID")
        do {
            let session = try LoginSession(id: id, uid: uid, loop: loop) { [unowned self] state in sessionChanged(state) }
            login = session
            log(6, "following logind session \(session.path)")
            sessionChanged(try session.state())
        } catch {
            log(6, "no logind session followed: \(error)")
        }
    }

    func sessionChanged(_ state: LoginSession.State) {
        let off = state.locked || !state.active
        let reason = state.locked ? "session locked" : !state.active ? "session no longer active" : "session unlocked and active"
        apply(model.setLocked(off, reason: reason, at: now))
        armDelay()
    }

    // MARK: stopping

    /// Brings back what the agent backgrounded, waiting (at most 2 s) for the daemon to
    /// answer, then leaves the loop.
    func stop(reason: String) {
        let decisions = model.releaseAll(reason: reason)
        let calls = decisions + outbox.values.filter { $0.state == .foreground && !decisions.map(\.app).contains($0.app) }
        if !calls.isEmpty {
            do {
                let connection = try VarlinkConnection(path: socketPath)
                for decision in calls {
                    log(6, "\(decision.app): foreground, \(decision.reason)")
                    try connection.send(call(for: decision))
                }
                for _ in calls { _ = try connection.receive(timeoutMilliseconds: 2000) }
                connection.close()
            } catch {
                log(3, "could not bring back \(calls.count) apps: \(error)")
            }
        }
        loop.exit(code: 0)
    }
}
