import BGTaskCore
import BGTaskSystem
import Glibc
import Varlink

/// The running daemon: one sd-event loop, the model, the clients, and the processes it
/// watches. Everything happens on the loop thread; nothing here blocks.
public final class Daemon {
    let options: DaemonOptions
    let loop: EventLoop
    var model: BackgroundModel
    var access: AccessPolicy
    let resolver = ProcessResolver()
    var enforcer: Enforcer!
    var history = History(capacity: 1024)
    let startedAt = Clock.monotonicNanoseconds()

    let listener: FileDescriptor
    let socketPath: String?
    /// Where the state survives a restart.
    let stateFile: StateFile
    /// Set once a write failed, so the failure is logged once, not per call.
    var stateWriteFailed = false
    var sources: [EventSource] = []
    var timer: EventSource!

    var connections: [ConnectionID: Connection] = [:]
    var connectionsPerUID: [UInt32: Int] = [:]
    var nextConnectionID: UInt64 = 1

    /// The processes the model asked to watch, each held by pidfd.
    var watches: [ProcessIdentity: (pidfd: Pidfd, source: EventSource)] = [:]
    /// Pidfds resolved for the call being handled, for `watch` effects to take.
    var callPidfds: [ProcessIdentity: Pidfd] = [:]
    /// Watched processes found already gone; fed to the model after the current effects.
    var exitedProcesses: [ProcessIdentity] = []

    var subscribers: [ProcessIdentity: [ConnectionID]] = [:]
    var taskStreams: [TaskID: ConnectionID] = [:]
    var monitors: [ConnectionID] = []
    /// When the timer is armed to fire (`nil`: off).
    var timerArmedAt: Int64?
    var statusTimer: EventSource!
    var statusPending = false
    var lastStatusSent: Int64 = 0
    static let statusInterval: Int64 = 250_000_000
    var lastStatus = ""
    /// Whether a service manager listens for `STATUS=` (else it is not even formatted).
    let notifying = getenv("NOTIFY_SOCKET") != nil
    /// Debug records (every task begun and ended) only with `SYSTEMD_LOG_LEVEL=debug`.
    let logDebug = getenv("SYSTEMD_LOG_LEVEL").map { String(cString: $0) == "debug" } ?? false

    /// Sets up the loop on `listener` (bound or passed by systemd). Nothing runs until `run()`.
    public init(options: DaemonOptions, configuration: Configuration, listener: FileDescriptor,
                socketPath: String?, stateDirectory: String) throws(Errno) {
        self.options = options
        self.listener = listener
        self.socketPath = socketPath
        self.stateFile = try StateFile(directory: stateDirectory)
        self.loop = try EventLoop()
        self.model = BackgroundModel(configuration: configuration, seed: randomSeed())
        model.debugLogging = logDebug
        self.access = AccessPolicy(managerGID: Self.groupID(configuration.managerGroup))

        try listener.setNonBlocking()
        sources.append(try loop.addIO(listener.rawValue, events: IOEvents.readable) { [unowned self] _ in
            self.acceptConnections()
        })
        timer = try loop.addTimer { [unowned self] in
            self.timerArmedAt = nil
            self.afterPass()
        }
        statusTimer = try loop.addTimer { [unowned self] in self.sendStatus() }
        enforcer = try Enforcer(loop: loop, root: { [unowned self] app in self.watches[app]?.pidfd }) { priority, message in
            Journal.log(priority: priority.rawValue, message: message)
        }
        sources.append(try loop.addSignal(SIGTERM) { [unowned self] in self.stop() })
        sources.append(try loop.addSignal(SIGINT) { [unowned self] in self.stop() })
        sources.append(try loop.addSignal(SIGHUP) { [unowned self] in
            _ = self.reload()
            self.afterPass()
        })
        signal(SIGPIPE, SIG_IGN)
        loop.enableWatchdog()
        restore()
    }

    /// Serves until `SIGTERM`/`SIGINT`; returns the exit status.
    public func run() throws(Errno) -> Int32 {
        log(.info, "bgtaskd \(InterfaceDescription.version) serving on \(socketPath ?? "the socket passed by systemd")")
        ServiceNotify.send("READY=1\nSTATUS=\(statusLine())")
        let code = try loop.run()
        shutdown()
        return code
    }

    var now: Instant { Instant(nanoseconds: loop.now) }

    // MARK: Loop pass

    /// Ends every handler's pass: fire due timers, run their effects, arm the one timer at
    /// the next deadline, and keep `STATUS=` current. (Called by each handler rather than as
    /// an sd-event post source, which would cost an extra loop iteration per call.)
    func afterPass() {
        let now = self.now
        var effects: [Effect] = []
        model.advance(to: now, effects: &effects)
        run(effects)
        // Re-arm only for an earlier deadline: firing early costs one idle pass, while moving
        // the timer on every call (the oldest task changes with each EndTask) costs a
        // timerfd_settime per call.
        if let next = model.nextDeadline()?.nanoseconds, next < (timerArmedAt ?? .max) {
            timer.arm(at: next)
            timerArmedAt = next
        }
        if notifying, !statusPending {
            statusPending = true
            // At most one STATUS= per interval: counts change with every call, and a datagram
            // per call would cost more than the call.
            statusTimer.arm(at: max(Clock.monotonicNanoseconds(), lastStatusSent + Self.statusInterval))
        }
    }

    /// Sends `STATUS=` if it changed since the last one.
    func sendStatus() {
        statusPending = false
        lastStatusSent = Clock.monotonicNanoseconds()
        let status = statusLine()
        if status != lastStatus {
            lastStatus = status
            ServiceNotify.send("STATUS=\(status)")
        }
    }

    func statusLine() -> String {
        let counts = model.stateCounts
        return "\(model.appCount) apps (\(counts[.background, default: 0]) background, "
            + "\(counts[.suspended, default: 0]) suspended), \(model.taskCount) tasks"
    }

    func stop() {
        ServiceNotify.send("STOPPING=1")
        loop.exit(code: 0)
    }

    /// A daemon that stops must not leave processes stopped with nobody in charge.
    func shutdown() {
        for app in enforcer.resumeAll() {
            log(.notice, "App \(app) resumed: bgtaskd is stopping")
        }
        for connection in connections.values { connection.close() }
        connections.removeAll()
        if let socketPath, SocketActivation.listeningSockets().isEmpty { unlink(socketPath) }
    }

    // MARK: Configuration

    /// Re-reads the configuration; on error keeps the old one and says why.
    func reload() -> ConfigurationError? {
        ServiceNotify.send("RELOADING=1\nMONOTONIC_USEC=\(Clock.monotonicNanoseconds() / 1000)")
        defer { ServiceNotify.send("READY=1\nSTATUS=\(statusLine())") }
        do {
            let configuration = try options.loadConfiguration()
            model.reload(configuration)
            access = AccessPolicy(managerGID: Self.groupID(configuration.managerGroup))
            log(.info, "Configuration reloaded")
            return nil
        } catch {
            log(.warning, "Configuration not reloaded, keeping the old one: \(error)")
            return error
        }
    }

    static func groupID(_ name: String) -> UInt32? {
        guard !name.isEmpty else { return nil }
        if let number = UInt32(name) { return number }
        return getgrnam(name).map { $0.pointee.gr_gid }
    }

    // MARK: Connections

    func acceptConnections() {
        while true {
            let socket: FileDescriptor
            do {
                guard let accepted = try UnixSocket.accept(listener) else { return }
                socket = accepted
            } catch {
                log(.warning, "accept failed: \(error)")
                return
            }
            guard let credentials = try? UnixSocket.peerCredentials(socket) else { continue }
            let open = connectionsPerUID[credentials.uid, default: 0]
            guard open < model.configuration.maxConnectionsPerUser else {
                let error = BGTaskError.limitExceeded("MaxConnectionsPerUser=\(model.configuration.maxConnectionsPerUser) reached")
                _ = try? socket.write(VarlinkReply(error: error.varlink).json.varlinkFrame)
                continue
            }
            let pidfd = UnixSocket.peerPidfd(socket).flatMap { try? Pidfd.adopt($0) }
            let id = ConnectionID(nextConnectionID)
            nextConnectionID += 1
            let connection = Connection(id: id, socket: socket, credentials: credentials, peerPidfd: pidfd,
                                        maximumMessageBytes: model.configuration.maxMessageBytes)
            do {
                connection.source = try loop.addIO(socket.rawValue, events: IOEvents.readable) {
                    [unowned self, unowned connection] events in
                    self.handleIO(connection, events: events)
                }
            } catch {
                log(.warning, "cannot watch a new connection: \(error)")
                continue
            }
            connections[id] = connection
            connectionsPerUID[credentials.uid, default: 0] += 1
        }
    }

    func handleIO(_ connection: Connection, events: UInt32) {
        if events & IOEvents.writable != 0, !connection.flush() {
            close(connection)
            return afterPass()
        }
        guard events & (IOEvents.readable | IOEvents.hangup | IOEvents.error) != 0 else { return }
        do {
            guard let bytes = try connection.socket.readAvailable(upTo: 65536) else { return }
            if bytes.isEmpty {
                close(connection)
                return afterPass()
            }
            connection.framer.append(bytes)
        } catch {
            close(connection)
            return afterPass()
        }
        processInput(connection)
        afterPass()
    }

    /// Handles every complete call in order, stopping while a call streams.
    func processInput(_ connection: Connection) {
        while connection.stream == nil, !connection.isClosed {
            let message: ArraySlice<UInt8>
            do {
                guard let next = try connection.framer.next() else { return }
                message = next
            } catch {
                log(.notice, "Closing \(connection.id) (uid \(connection.credentials.uid)): message over MaxMessageBytes=\(error.limit)")
                return close(connection)
            }
            let call: VarlinkCall
            do {
                call = try VarlinkCall(message: JSON.parse(message))
            } catch {
                // Not a Varlink call: the stream cannot be trusted past this point.
                log(.notice, "Closing \(connection.id) (uid \(connection.credentials.uid)): \(error)")
                return close(connection)
            }
            handle(call, on: connection)
        }
    }

    func handle(_ call: VarlinkCall, on connection: Connection) {
        let now = self.now
        var effects: [Effect] = []
        model.advance(to: now, effects: &effects)
        let reply: VarlinkReply
        do throws(VarlinkError) {
            if call.upgrade { throw VarlinkError.methodNotImplemented(call.method) }
            reply = try dispatch(call, on: connection, at: now, effects: &effects)
        } catch {
            reply = VarlinkReply(error: error)
        }
        run(effects)
        callPidfds.removeAll()
        if !call.oneway || reply.continues, !connection.send(reply) {
            drop(connection)
        }
        // A grant due now (no latency) goes out in this pass, after the reply, rather than
        // costing the loop a timer wake-up.
        if let next = model.nextDeadline(), next <= now {
            var due: [Effect] = []
            model.advance(to: now, effects: &due)
            run(due)
        }
    }

    func close(_ connection: Connection) {
        guard !connection.isClosed else { return }
        connection.close()
        connections[connection.id] = nil
        connectionsPerUID[connection.credentials.uid, default: 1] -= 1
        if connectionsPerUID[connection.credentials.uid] == 0 { connectionsPerUID[connection.credentials.uid] = nil }
        var effects: [Effect] = []
        switch connection.stream {
        case let .subscription(app)?:
            subscribers[app]?.removeAll { $0 == connection.id }
            if subscribers[app]?.isEmpty == true { subscribers[app] = nil }
            model.unsubscribe(app, at: now, effects: &effects)
        case let .task(id)?:
            taskStreams[id] = nil
        case .monitor?:
            monitors.removeAll { $0 == connection.id }
        case nil:
            break
        }
        model.connectionClosed(connection.id, at: now, effects: &effects)
        run(effects)
    }

    /// Ends a connection's stream and lets its queued calls through.
    func endStream(of connection: Connection) {
        connection.stream = nil
        processInput(connection)
    }

    // MARK: Effects

    /// Carries out the model's effects in order, then feeds it any exits found meanwhile.
    /// What changed is written to the state file first: on disk is never behind what was
    /// done to a process.
    func run(_ effects: [Effect]) {
        writeState()
        defer { writeState() }
        for effect in effects {
            switch effect {
            case let .lifecycle(app, event):
                let parameters = Wire.event(event)
                for id in subscribers[app] ?? [] {
                    if let connection = connections[id] { send(VarlinkReply(parameters: parameters, continues: true), to: connection) }
                }
                if !monitors.isEmpty {
                    var monitored = parameters
                    monitored["pid"] = .int(Int64(app.pid))
                    broadcast(monitored, uid: model.snapshot(of: app, at: now)?.uid)
                }
            case let .taskChanged(task):
                if task.state != .pending, let id = taskStreams[task.id], let connection = connections[id] {
                    let ended = !task.state.isActive
                    if ended { taskStreams[task.id] = nil }
                    send(VarlinkReply(parameters: Wire.taskState(task), continues: !ended), to: connection)
                    if ended, !connection.isClosed { endStream(of: connection) }
                }
                if !monitors.isEmpty {
                    broadcast(["event": .string("taskChanged"), "task": Wire.task(task)], uid: task.uid)
                }
            case let .act(record, signal):
                enforce(record, signal: signal)
                let entry = HistoryEntry(realtimeNanoseconds: Clock.realtimeNanoseconds(), record: record)
                history.append(entry)
                stateFile.record(entry)
                broadcast(["event": .string(record.action.rawValue), "entry": Wire.historyEntry(entry)], uid: record.uid)
            case let .kill(process):
                enforcer.kill(process)
            case let .watch(process):
                watch(process)
            case let .unwatch(process):
                watches[process] = nil
            case let .log(entry):
                log(entry)
            }
        }
        while !exitedProcesses.isEmpty {
            let process = exitedProcesses.removeFirst()
            var more: [Effect] = []
            model.processExited(process, at: now, effects: &more)
            run(more)
        }
    }

    func send(_ reply: VarlinkReply, to connection: Connection) {
        if !connection.send(reply) { drop(connection) }
    }

    /// Closes a connection whose peer is gone or stopped reading, saying which.
    func drop(_ connection: Connection) {
        if connection.pendingOutputBytes > Connection.maximumPendingOutput {
            log(.notice, "Dropping \(connection.id) (uid \(connection.credentials.uid)): over \(Connection.maximumPendingOutput >> 20) MiB of unread replies")
        }
        close(connection)
    }

    /// Sends a monitor event to every monitor allowed to see an app of `uid`.
    func broadcast(_ parameters: [String: JSON], uid: UInt32?) {
        guard !monitors.isEmpty else { return }
        for id in monitors {
            guard let connection = connections[id] else { continue }
            let credentials = connection.credentials
            if let uid, !access.mayManage(appUID: uid, uid: credentials.uid, gid: credentials.gid, groups: credentials.groups) {
                continue
            }
            send(VarlinkReply(parameters: parameters, continues: true), to: connection)
        }
    }

    /// Starts watching `process` through the pidfd resolved for this call (every watch starts
    /// with a call about that process). Never by opening its pid again: a pid can be recycled
    /// within one start-time tick. A process already gone is reported as exited.
    func watch(_ process: ProcessIdentity) {
        guard watches[process] == nil else { return }
        guard let pidfd = callPidfds[process], !pidfd.hasExited,
              let source = try? loop.addIO(pidfd.descriptor.rawValue, events: IOEvents.readable, { [unowned self] _ in
                  self.processExited(process)
              }) else {
            exitedProcesses.append(process)
            return
        }
        watches[process] = (pidfd, source)
    }

    func processExited(_ process: ProcessIdentity) {
        watches[process] = nil
        enforcer.forget(process)
        var effects: [Effect] = []
        model.processExited(process, at: now, effects: &effects)
        run(effects)
        afterPass()
    }

    /// Suspends, resumes or terminates the whole app (rule 10).
    func enforce(_ record: AppActionRecord, signal: TerminateSignal?) {
        switch record.action {
        case .suspended: enforcer.suspend(record.app, command: record.command, mode: model.configuration.suspendMode)
        case .resumed: enforcer.resume(record.app)
        case .terminated: enforcer.terminate(record.app, command: record.command, signal: signal?.number ?? SIGKILL)
        }
    }

    // MARK: Logging

    func log(_ entry: LogEntry) {
        if entry.priority == .debug, !logDebug { return }
        var fields: [(String, String)] = [("BGTASKD_EVENT", entry.kind.rawValue),
                                          ("MESSAGE_ID", LogMessageID.id(for: entry.kind))]
        if let app = entry.app { fields.append(("BGTASKD_PID", String(app.pid))) }
        if let command = entry.command { fields.append(("BGTASKD_COMMAND", command)) }
        if let id = entry.taskID { fields.append(("BGTASKD_TASK_ID", String(id))) }
        if let name = entry.taskName { fields.append(("BGTASKD_TASK_NAME", name)) }
        if let reason = entry.reason { fields.append(("BGTASKD_REASON", reason)) }
        Journal.log(priority: entry.priority.rawValue, message: entry.message, fields: fields)
    }

    func log(_ priority: LogEntry.Priority, _ message: String) {
        Journal.log(priority: priority.rawValue, message: message)
    }
}

/// Journal `MESSAGE_ID`s, one per kind of event, so `journalctl MESSAGE_ID=...` finds them.
enum LogMessageID {
    static func id(for kind: LogKind) -> String {
        // A fixed 128-bit prefix with the kind's index in the last byte.
        let index = LogKind.allCases.firstIndex(of: kind)!
        let hex = String(index + 1, radix: 16)
        return "6b3f0e2a9c4d4e1f8a5b7c9d0e1f2a" + String(repeating: "0", count: 2 - hex.count) + hex
    }
}
