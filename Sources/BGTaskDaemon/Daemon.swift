// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// The running daemon: one sd-event loop, the model, the clients, and the processes it
/// watches. Everything happens on the loop thread; nothing here blocks.
///
/// Split by concern: connections and calls (`Daemon+Connections`, `Daemon+Endpoint`), the
/// model's effects (`Daemon+Effects`), the state file (`Daemon+State`), `STATUS=` and reload
/// (`Daemon+Notify`), the journal (`Daemon+Journal`).
public final class Daemon {
    let options: DaemonOptions
    let loop: EventLoop
    var model: BackgroundModel
    var access: AccessPolicy
    /// The policy files in force (DESIGN.md §2b).
    var policies: PolicySet
    let resolver = ProcessResolver()
    var enforcer: Enforcer!
    /// Follows the forks of process apps (containment `tracked`); `nil` where the kernel's
    /// process-events connector is out of reach (no `CAP_NET_ADMIN`, or in a container).
    var tracker: Tracker?
    /// The process-events connector as the loop watches it, and whether it is left unwatched
    /// for now (`holdOffProcessEvents`).
    var processEventsSource: EventSource?
    var processEventsHeldOff = false
    /// Why there is no tracker, for the start-up log.
    var trackerUnavailable: String?
    /// Power and network, for scheduled requests.
    var conditions: SystemConditions?
    /// Connections to systemd managers awaiting their answer, for `IsolateApps=`; those
    /// answered (dropped at the next pass); sockets that could not be reached, until when.
    var managerRequests: [UInt64: (manager: ServiceManager, since: Int64)] = [:]
    var nextManagerRequest: UInt64 = 1
    var retiredConnections: [AnyObject] = []
    var unreachableManagers: [String: Int64] = [:]
    /// `KeepAwake=` (`Daemon+Awake`): what the model decided, logind's answer awaited, the
    /// inhibitor held, and whether a refusal was logged since the last lock.
    var awake = AwakeHold()
    var awakeRequest: InhibitorRequest?
    var awakeLock: FileDescriptor?
    /// Why logind's inhibitor was refused (or could not be asked for), while it is not held:
    /// logged once until the next lock, and said by `GetStatus` (`keepAwake`).
    var awakeRefusal: String?
    /// Waits for an app's processes to land in the scope asked for.
    /// Apps being moved into a scope of their own: its name, and how many more looks.
    var scopeChecks: [ProcessIdentity: (name: String, left: Int)] = [:]
    var history = History(capacity: 1024)
    /// Each uid's log records in the current window (`Daemon+Journal`).
    var logBudgets: [UInt32: (windowStart: Int64, logged: Int, suppressed: Int)] = [:]
    /// User names by uid, and when each was looked up (`userName(uid:)`).
    var userNames: [UInt32: (name: String?, at: Int64)] = [:]
    /// Cgroup directories each uid's unit lookups searched in the current second.
    var unitSearches: [UInt32: (second: Int64, directories: Int)] = [:]
    let startedAt = Clock.monotonicNanoseconds()

    let listener: FileDescriptor
    let socketPath: String?
    /// Where the state survives a restart.
    let stateFile: StateFile
    /// Whether the last write of the state file succeeded. While it does not, calls that
    /// change anything are refused and suspensions wait (`Daemon+State`).
    var stateWritable = true
    var stateRetryDelay: Int64 = 0
    /// Suspensions not carried out because they could not be recorded.
    var deferredSuspensions: Set<ProcessIdentity> = []
    /// A failed rewrite (no room for the copy) is not tried again before this.
    var nextRewriteAttempt: Int64 = 0
    /// Whether the log is due for a rewrite (`whenStateQuiet`).
    var rewriteDue = false
    /// Whether `Wait.stateQuiet` is scheduled (a flag, not the model's table: this is asked
    /// on every pass that writes).
    var stateQuietArmed = false
    /// When the log was last appended to.
    var lastStateWriteAt: Int64 = 0
    var rewriteDelay: Int64 = 0
    var sources: [EventSource] = []
    /// The clients' connections and the watched processes' pidfds: whatever is ready is
    /// handled in one pass, and committed once (`IOGroup`).
    var clients: IOGroup!
    var listenerSource: EventSource!
    /// Descriptors kept for when the daemon has none left (`DescriptorReserve`): to refuse a
    /// connection instead of spinning on it, and to name a tracked app's fork.
    let reserve = DescriptorReserve(count: 2)
    /// Runs of connections refused for want of descriptors: whether one is going on, whether
    /// its beginning was logged and when the last was, and how many were refused since the
    /// last line that said so.
    var shortage = (ongoing: false, reported: false, reportedAt: Int64.min / 2, refused: 0)
    /// Until when the listener is left unwatched, if it is (`refuseWaitingConnection`).
    var acceptPausedUntil: Int64?
    var acceptPauseReportedAt = Int64.min / 2
    var timer: EventSource!
    /// A timer on `CLOCK_BOOTTIME` at the requests' next pass (`armSleepTimer`), and where it
    /// is armed; how long the machine had slept when the model was last told (`noteSleep`):
    /// a copy of the model's, so that every pass compares without a read of the model.
    var sleepTimer: EventSource!
    var sleepTimerArmedAt: Int64?
    var sleepCounted: Int64 = 0

    var connections: [ConnectionID: Connection] = [:]
    /// Connections with output queued or events to update in this pass (`commit`).
    var touched: [Connection] = []
    /// Where every connection's bytes are read into, then handed to its framer: one buffer
    /// for the daemon's life, not an array per read.
    let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Connection.readSize, alignment: 16)
    /// Where each event frame is written before it is copied out to be shared (`Wire`):
    /// one buffer for the daemon's life, as large as the largest frame yet (a history entry
    /// naming an app's tasks, bounded by `MaxTasksPerApp`).
    let frameBuffer = ByteBuffer(capacity: 1024)
    /// The connections `commit` is writing out: `touched` as it began, swapped in.
    var committing: [Connection] = []
    /// What each user's connections share (`UserAccount`), while it has any.
    var accounts: [UInt32: UserAccount] = [:]
    var nextConnectionID: UInt64 = 1

    /// The processes the model asked to watch, each held by pidfd.
    var watches: [ProcessIdentity: (pidfd: Pidfd, source: EventSource)] = [:]
    /// The watched processes by pid: how a manager's call naming an app's own pid finds it
    /// without reading `/proc` (`managedApp`).
    var watchedByPID: [Int32: ProcessIdentity] = [:]
    /// Pidfds resolved for the call being handled, for `watch` effects to take.
    var callPidfds: [ProcessIdentity: Pidfd] = [:]
    /// The storage of the effects list `carryingOut` lends.
    var spareEffects: [Effect] = []
    /// Watched processes found already gone; fed to the model after the current effects.
    var exitedProcesses: [ProcessIdentity] = []

    var subscribers: [ProcessIdentity: [ConnectionID]] = [:]
    /// The connections whose calls were about each app (`readWaiting`).
    var connectionsByApp: [ProcessIdentity: [ConnectionID]] = [:]
    /// Lifecycle subscriptions one app may have at once (UIKit has one delegate; a helper
    /// or two besides it is plenty). Each holds a queue of every event (shared bytes).
    static let maximumSubscribersPerApp = 8
    /// `Monitor` streams one user other than root may have at once. Every event of the user's
    /// apps goes to each, and what a pass sent them is not part of the user's turn: uid
    /// 65534 flipping its own app beside 255 monitors (its connection limit) held root's
    /// `GetStatus` p50 3.7–4.1 ms, p99 8.7–14.8 ms, at worst 28.6 (beside a busy loop of its
    /// instead: p50 0.8–1.0, p99 4.0–4.2, at worst 7.5; with 16 monitors p50 1.7–1.9, p99
    /// 4.5–5.0, at worst 7.9; release build, by hand). A person watches with one or two.
    static let maximumMonitorsPerUser = 16
    var taskStreams: [TaskID: ConnectionID] = [:]
    var monitors = Monitors() {
        didSet { model.monitoredOwners = monitors.owners }
    }
    /// Connections with input answered and left in the socket (`settleInput`), by when it
    /// was left, from `inputLeftHead`; an entry whose instant is not its connection's `leftAt`
    /// any more was taken, or left again later.
    var inputLeft: [(connection: Connection, at: Int64)] = []
    var inputLeftHead = 0
    /// Connections whose pipelined calls used up their turn (`turnLength`), or whose user's
    /// calls used up its turn in the pass, in the order they did: each gets its next turn at
    /// the end of the loop's next iteration, after what else was ready (`EventLoop.runSoon`).
    var awaitingTurn: [Connection] = []
    /// The loop time after which a connection's pipelined calls wait for their next turn, and
    /// so do the calls of a user whose calls took that much of the pass (`processInput`; at
    /// least one call of a user's a turn). Each call is bounded, but 400 of them pipelined
    /// were handled in one go: uid 65534 flipping its own unit app above 5,000 cgroups (the
    /// kernel's freeze and thaw of them, ~5 ms each) held root's `GetStatus` 0.7–1.8 s.
    static let turnLength: Int64 = 2_000_000
    /// Counts passes (the outermost ones): what a user's loop time in a turn is counted in
    /// (`UserAccount`).
    var passNumber: UInt64 = 0
    /// How long a connection's answered input may stay in its socket once it is idle: long
    /// enough that a busy connection's is taken after its replies (a timer's take may find
    /// its client asleep for the next reply), short enough for a client that cannot send
    /// while its send buffer is full of small writes answered (a shrunken `SO_SNDBUF`).
    static let takeDelay: Int64 = 10_000_000
    /// When the timer is armed to fire (`nil`: off).
    var timerArmedAt: Int64?
    var statusPending = false
    var lastStatusSent: Int64 = 0
    static let statusInterval: Int64 = 250_000_000
    /// What the last `STATUS=` said (`nil`: none yet).
    var lastStatusCounts: StatusCounts?
    /// Whether a service manager listens for `STATUS=` (else it is not even formatted).
    let notifying = Host.environment("NOTIFY_SOCKET") != nil
    /// Debug records (every task begun and ended) only with `SYSTEMD_LOG_LEVEL=debug`.
    let logDebug = Host.environment("SYSTEMD_LOG_LEVEL") == "debug"

    /// Sets up the loop on `listener` (bound or passed by systemd). Nothing runs until `run()`.
    deinit { readBuffer.deallocate() }

    public init(options: DaemonOptions, configuration: Configuration, policies: PolicySet = PolicySet(),
                listener: FileDescriptor, socketPath: String?, stateDirectory: StateDirectory) throws(Errno) {
        self.options = options
        self.policies = policies
        self.listener = listener
        self.socketPath = socketPath
        self.stateFile = StateFile(directory: stateDirectory)
        self.loop = try EventLoop()
        self.model = BackgroundModel(configuration: configuration, seed: randomSeed())
        model.debugLogging = logDebug
        model.monitoredOwners = .nobody  // until a monitor connects (`monitors`)
        self.access = AccessPolicy(managerGID: Self.groupID(configuration.managerGroup))

        try listener.setNonBlocking()
        clients = try IOGroup(loop: loop) { [unowned self] in self.pass { _ in self.clients.dispatchReady() } }
        clients.membersPerPass = Self.membersPerPass
        listenerSource = try loop.addIO(listener.rawValue, events: IOEvents.readable) { [unowned self] _ in
            self.pass { _ in self.acceptConnections() }
        }
        timer = try loop.addTimer { [unowned self] in
            self.timerArmedAt = nil
            self.pass { _ in self.giveTurns() }
        }
        // A pass on waking from a sleep that passed the requests' next pass (it notes the sleep).
        sleepTimer = try loop.addTimer(clock: .boottime) { [unowned self] in self.pass { _ in } }
        loop.soon = { [unowned self] in self.pass { _ in self.giveTurns() } }
        enforcer = try Enforcer(group: clients, root: { [unowned self] app in self.watches[app]?.pidfd },
                                tracked: { [unowned self] app, known, reading in
                                    self.tracker.flatMap { $0.follows(app) ? $0.members(of: app, excluding: known, reading: reading) : nil }
                                }) { [unowned self] priority, uid, message in
            // About a user's app: within that user's records (`logBurst`), as the model's.
            if let uid, uid != 0, !self.allowLog(uid: uid) { return }
            Journal.log(priority: priority.rawValue, message: message.cEscaped)
        }
        enforcer.schedule = { [unowned self] wait, instant in
            if let instant { model.schedule(wait, at: Instant(nanoseconds: instant)) } else { model.cancel(wait) }
        }
        enforcer.scheduleAfter = { [unowned self] wait, delay in model.schedule(wait, at: Instant(nanoseconds: loop.now + delay)) }
        enforcer.holds = { [unowned self] app, processes in model.terminationHolds(app, processes: processes) }
        enforcer.signalled = { [unowned self] app, instant, whole in
            model.terminationSignalled(app, at: Instant(nanoseconds: instant), cgroup: whole.map {
                TerminatedCgroup(path: $0.cgroup.path, inode: $0.instance.inode, invocation: $0.instance.invocation)
            })
        }
        do {
            var losses = 0
            var lastReport: Int64?
            let tracker = try Tracker.open(reserve: reserve) {
                // Every loss is counted and reported, at most once every 10 s.
                losses += 1
                let now = Clock.monotonicNanoseconds()
                if let lastReport, now - lastReport < 10_000_000_000 { return }
                lastReport = now
                Journal.log(priority: LogEntry.Priority.warning.rawValue,
                            message: "The kernel dropped process events (a burst of forks; \(losses) time(s) so far): members still running were kept and every app's tree walked again, but a process that re-parented meanwhile may have left its app")
            }
            let source = try loop.addIO(tracker.events.descriptor.rawValue, events: IOEvents.readable) { [unowned self] _ in
                self.tracker?.drain()
                self.holdOffProcessEvents()
            }
            sources.append(source)
            processEventsSource = source
            self.tracker = tracker
            tracker.forked = { [unowned self] app, parent, child in self.enforcer.forked(into: app, parent: parent, child: child) }
            tracker.unopened = { [unowned self] pid in self.enforcer.unreached.insert(pid) }
            tracker.unheard = { [unowned self] error in
                self.log(.warning, "The kernel's process events could not be asked for again (\(error)): forks of the process apps followed now are not seen until the next app is followed")
            }
            model.processContainment = .tracked
        } catch {
            trackerUnavailable = "\(error)"
        }
        sources.append(try loop.addSignal(Signal.terminate) { [unowned self] in self.stop() })
        sources.append(try loop.addSignal(Signal.interrupt) { [unowned self] in self.stop() })
        sources.append(try loop.addSignal(Signal.hangup) { [unowned self] in
            self.pass { _ in _ = self.reload() }
        })
        let conditions = SystemConditions(powerSupplyPath: configuration.powerSupplyPath)
        self.conditions = conditions
        for descriptor in conditions.descriptors {
            sources.append(try loop.addIO(descriptor.rawValue, events: IOEvents.readable) { [unowned self] _ in
                conditions.drain(descriptor)
                self.pass { _ in self.readConditions() }
            })
        }
        Signal.ignoreBrokenPipe()
        loop.enableWatchdog()
        // Restored deadlines arm the timer (or fire, if they passed while no daemon ran) now,
        // not at the first call. (Not a whole pass: its opening write would replace the state
        // file with the empty model before it is read.)
        restore()
        readConditions()
        endPass(at: now)
    }

    /// Power and network as the system says now, for scheduled requests.
    func readConditions() {
        guard let conditions else { return }
        let now = Conditions(externalPower: conditions.externalPower, network: SystemConditions.network)
        guard now != model.conditions else { return }
        log(.info, "Conditions for scheduled requests: \(now.externalPower ? "on external power" : "on battery"), "
            + (now.network ? "a default route" : "no default route"))
        var effects: [Effect] = []
        model.setConditions(now, at: self.now, effects: &effects)
        carryOut(effects)
    }

    /// Serves until `SIGTERM`/`SIGINT`; returns the exit status.
    public func run() throws(Errno) -> Int32 {
        let served = socketPath ?? UnixSocket.boundPath(listener).map { "\($0), the socket passed by systemd" } ?? "the socket passed by systemd"
        log(.info, "bgtaskd \(InterfaceDescription.version) serving on \(served)")
        if let trackerUnavailable {
            log(.notice, "Forks of process apps are not followed (\(trackerUnavailable)): a process app is its process tree, which a double fork or setsid leaves; apps in a scope or service of their own are not affected")
        }
        notifyStatus(after: "READY=1\n")
        let code = try loop.run()
        shutdown()
        return code
    }

    var now: Instant { Instant(nanoseconds: loop.now) }

    // MARK: Loop pass

    /// One loop pass, around each handler: read the clock once, fire what is due at it, do
    /// the handler's work, settle work it made due now (a grant with no latency goes out
    /// after its reply, in this pass, rather than costing a timer wake-up), then arm the one
    /// timer at the next deadline and keep `STATUS=` current.
    func pass(_ body: (Instant) -> Void) {
        let now = self.now
        // The pass's log records go out together when it ends (`Journal.holding`).
        let outermost = !Journal.holding
        Journal.holding = true
        if outermost {
            passNumber &+= 1
            if loop.slept - sleepCounted >= Self.sleepResolution { noteSleep(at: now) }
        }
        defer {
            if outermost {
                Journal.flush()
                Journal.holding = false
            }
        }
        if !retiredConnections.isEmpty { retiredConnections.removeAll() }
        // Before an app is terminated for time, what it already sent is read (rule 7a).
        let facing = inPlace { $0.appsFacingTermination(at: now) }
        if !facing.isEmpty { readWaiting(from: facing) }
        // Many timers due at once (a thousand apps backgrounded together expire together) are
        // fired a slice at a time, each slice's events sent before the next: the first apps
        // warned do not wait for the last.
        while !advanceModel(to: now, limit: Self.timersPerSlice) { _ = commit() }
        body(now)
        var resumable: [Connection]
        repeat {
            endPass(at: now)
            resumable = commit()
        } while resumable.reduce(false, { processInput($1) || $0 })
    }

    /// The end of a pass: keep `STATUS=` current, settle what is due now, arm the one timer
    /// at the model's next deadline (the daemon's waits are among them: `Wait`).
    func endPass(at now: Instant) {
        if notifying, !statusPending, statusCounts != lastStatusCounts {
            statusPending = true
            // At most one STATUS= per interval: counts change with every call, and a datagram
            // per call would cost more than the call. Only when they changed: scheduled after
            // every pass, the status wait's own pass scheduled the next, and a daemon under
            // systemd woke 4 times a second for ever once it had served a call.
            model.schedule(.status, at: Instant(nanoseconds: max(now.nanoseconds, lastStatusSent + Self.statusInterval)))
        }
        keepAwakeIfNeeded(at: now)
        let armed = timerArmedAt.map(Instant.init(nanoseconds:))
        var next = inPlace { $0.nextDeadline(armedAt: armed) }
        if let due = next, due <= now {
            while !advanceModel(to: now, limit: Self.timersPerSlice) { _ = commit() }
            next = inPlace { $0.nextDeadline(armedAt: armed) }
        }
        if let next { armTimer(at: next.nanoseconds) }
        armSleepTimer()
        if acceptPausedUntil != nil {
            resumeAccepting(force: false)
            if let until = acceptPausedUntil { armTimer(at: until) }
        }
        if !inputLeft.isEmpty, let take = takeInputLeft(before: now.nanoseconds - Self.takeDelay) { armTimer(at: take) }
    }

    /// Arms the one timer at `instant` if it is armed for later or not at all. Only for an
    /// earlier deadline: firing early costs one idle pass, while moving the timer on every
    /// call (the oldest task changes with each EndTask) costs a timerfd_settime per call.
    /// A wait scheduled after `endPass` (by the pass's state write) arms it this way.
    func armTimer(at instant: Int64) {
        guard instant < (timerArmedAt ?? .max) else { return }
        timer.arm(at: instant)
        timerArmedAt = instant
    }

    /// A read of the model in place, for the reads on every call's path. A non-mutating
    /// method of `model` called from here (a class) that the optimizer does not inline is
    /// given a copy of the whole struct, destroyed after: callgrind measured ~2,000
    /// instructions per copy, three copies per call (a quarter of each call's instructions).
    /// An `inout` access lends the stored value itself, without retaining what it holds; a
    /// non-mutating method called on it is still handed its 688 bytes copied to the stack
    /// (a `memcpy`, ~130 instructions), so the reads on every pass's path are `mutating`
    /// (`nextDeadline`, `appsFacingTermination`, `app(containing:)`, `hasUnsavedChanges`).
    @inline(__always)
    func inPlace<T>(_ read: (inout BackgroundModel) -> T) -> T { read(&model) }

    /// Timers fired between two commits (`pass`).
    static let timersPerSlice = 16
    /// How long the listener is left unwatched when not even the reserve lets a connection
    /// be accepted (a connection closing ends it sooner).
    static let acceptPause: Int64 = 100_000_000
    /// The least time between two logged runs of connections refused for want of descriptors.
    static let shortageReportSpacing: Int64 = 60_000_000_000
    /// Connections accepted in one pass (each ~20 µs: its credentials, its peer's pidfd).
    static let acceptsPerPass = 32
    /// Ready connections and watched processes handled in one pass: more wait for the next
    /// pass, which fires what fell due first (a thousand apps warned together end their
    /// tasks together; the apps warned after them must not wait for all their ends).
    static let membersPerPass = 8

    /// Fires what is due at `now` (at most `limit` timers); returns whether all was.
    @discardableResult
    func advanceModel(to now: Instant, limit: Int = .max) -> Bool {
        carryingOut { effects in model.advance(to: now, limit: limit, effects: &effects) }
    }

    /// Runs `body` with an empty list of effects, then carries out what it listed (thrown or
    /// not). The list's storage is kept from one use to the next (`spareEffects`): growing a
    /// new array cost two or three allocations per call. A use inside another (effects that
    /// lead to more) starts an array of its own.
    func carryingOut<T, E>(_ body: (inout [Effect]) throws(E) -> T) throws(E) -> T {
        var effects: [Effect] = []
        swap(&effects, &spareEffects)
        defer {
            carryOut(effects)
            effects.removeAllKeepingCapacity()
            swap(&effects, &spareEffects)
        }
        return try body(&effects)
    }

    func stop() {
        ServiceNotify.send("STOPPING=1")
        loop.exit(code: 0)
    }

    /// A daemon that stops must not leave processes stopped with nobody in charge.
    func shutdown() {
        enforcer.signalStoppedTerminations(at: loop.now, waiting: false)
        // Those signals saved as sent: the next daemon must not send them again.
        writeState()
        for app in enforcer.resumeAll(at: loop.now) {
            log(.notice, "App \(app) resumed: bgtaskd is stopping")
        }
        for connection in connections.values { connection.close(now: true) }
        connections.removeAll()
        if let socketPath, SocketActivation.listeningSockets().isEmpty { FileSystem.remove(socketPath) }
    }
}
