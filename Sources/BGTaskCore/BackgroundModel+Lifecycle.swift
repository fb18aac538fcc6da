// SPDX-License-Identifier: Apache-2.0
extension BackgroundModel {
    /// `SetAppState`: moves an app to the background (rule 3) or the foreground (rule 8).
    /// Only `foreground` and `background` can be asked for; asking for the state the app is
    /// in changes nothing (a suspended app is already in the background).
    /// `manager` names who asked (its command and pid, e.g. `bgtask-session[812]`) and
    /// `reason` why ("window left workspace 1"): both are listed with the app and logged.
    public mutating func setState(of app: ProcessIdentity, to state: AppState, by manager: String? = nil,
                                  reason: String? = nil, at now: Instant,
                                  effects: inout [Effect]) throws(BGTaskError) -> AppSnapshot {
        guard apps.contains(app) else { throw .noSuchApp(app.pid) }
        var cause = ""
        if let manager {
            cause.reserveCapacity(8 + manager.utf8.count + (reason?.utf8.count ?? 0))
            cause += " (by "
            cause += manager
            if let reason {
                cause += ": "
                cause += reason
            }
            cause += ")"
        }
        if state == .background || state == .foreground, let manager { apps.update(app) { $0.manager = manager } }
        switch state {
        case .background: enterBackground(app, cause: cause, at: now, effects: &effects)
        case .foreground: enterForeground(app, cause: cause, at: now, effects: &effects)
        case .suspended, .terminated:
            throw .invalidParameter("state must be foreground or background, not \(state.rawValue)")
        }
        let record = apps[app]!
        return snapshot(record, at: now)
    }

    /// `Expire` (DESIGN.md §2c), the hook iOS developers get from the debugger: a background
    /// app's warning comes now (its deadline moves to now + `ExpirationWarningSec`, if that is
    /// sooner), or its deadline passes now (warning first, if it had none). A foreground app
    /// has no background time to expire: `InvalidParameter`, nothing changes.
    public mutating func expireNow(_ app: ProcessIdentity, to target: ExpireTarget, at now: Instant,
                                   effects: inout [Effect]) throws(BGTaskError) {
        guard var record = apps[app] else { throw .noSuchApp(app.pid) }
        guard record.state == .background, let deadline = record.deadline else {
            throw .invalidParameter("pid \(app.pid) is \(record.state.rawValue): only a background app has background time to expire")
        }
        // A new epoch makes the timers armed for the old deadline stale; those still needed
        // are armed again.
        record.epoch += 1
        record.deadline = target == .deadline ? now : min(deadline, now + settings(record).expirationWarning)
        apps[app] = record
        if target == .warning { timers.insert(.deadline(app, epoch: record.epoch), at: record.deadline!) }
        if record.phase == .transition, let transitionDeadline = record.transitionDeadline {
            timers.insert(.transitionTimeout(app, epoch: record.epoch), at: transitionDeadline)
        }
        effects.append(.log(.app(.appExpired, .notice, app, uid: record.uid, command: record.command,
                                 "expired by a manager: \(target == .warning ? "warned" : "deadline passed") now")))
        if !record.warned { warn(app, at: now, effects: &effects) }
        if target == .deadline { deadlinePassed(app, at: now, effects: &effects) }
    }

    /// `Terminate` from a manager.
    public mutating func terminate(_ app: ProcessIdentity, at now: Instant, effects: inout [Effect]) throws(BGTaskError) {
        guard apps[app] != nil else { throw .noSuchApp(app.pid) }
        terminateNow(app, reason: .manager, at: now, effects: &effects)
    }

    /// A suspended app was thawed by someone else who sent it `signal` to stop (systemd
    /// thaws a frozen unit it stops, then sends its `KillSignal=`): frozen again, it could
    /// never act on it, and the stop would hang until systemd's own `SIGKILL` (90 s by
    /// default). It is terminated with that signal instead — which it handles once thawed —
    /// and `SIGKILL` when `TerminateGraceSec` runs out: let go, but not for longer than any
    /// termination (an owner who signals and thaws their own suspended app ends it; it does
    /// not run on). Only a suspended app; `SIGKILL` needs no grace.
    public mutating func stoppedWhileSuspended(_ app: ProcessIdentity, signal: TerminateSignal, at now: Instant,
                                               effects: inout [Effect]) {
        guard apps[app]?.state == .suspended else { return }
        terminateNow(app, reason: .stoppedWhileSuspended, signal: signal, at: now, effects: &effects)
    }

    /// A watched process exited (rule 9): an app's own process takes the app and its tasks
    /// with it; any other process takes the tasks it began.
    public mutating func processExited(_ process: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        // A terminating app stays until its grace runs out, even if its own process exited
        // first: descendants that ignored the signal still get SIGKILL.
        let watched = needsWatch(process)
        if let app = apps[process] {
            for id in app.taskIDs {
                if let task = tasks[id] {
                    finish(task, as: task.state == .pending ? .denied : .ended, reason: .appExited,
                           at: now, effects: &effects)
                }
            }
            removeApp(process, at: now)
            effects.append(.log(.app(.appExited, .info, process, uid: app.uid, command: app.command, "exited; forgotten")))
        }
        var affected: [ProcessIdentity] = []
        for id in (tasksByOwner[process].map(Array.init) ?? []).sorted() {
            guard let task = tasks[id] else { continue }
            finish(task, as: task.state == .pending ? .denied : .ended, reason: .ownerExited, at: now, effects: &effects)
            if !affected.contains(task.app) { affected.append(task.app) }
        }
        settleWatch(process, before: watched, effects: &effects)
        for app in affected { suspendIfIdle(app, at: now, effects: &effects) }
    }

    // MARK: Transitions

    /// Rule 7a, warned before killed: the shortest a background period may be. An app is
    /// warned `ExpirationWarningSec` before its deadline; when less than that is left as its
    /// period begins (a quota nearly spent, a short wake window), the warning comes at once
    /// and the deadline is at least this long after it, so the expiration handlers can run
    /// and the tasks end. (`ExpirationWarningSec` shorter than this is the grace instead;
    /// `0` turns warnings off.) The quota may be overspent by at most this much.
    public static let minimumGrace = Duration.seconds(1)

    /// How long a `SIGKILL` termination waits for the app's processes to stop at most: the
    /// daemon sends the signal once they have (a fork under way finished, its child on its
    /// parent's list), within a millisecond or so; one continued by someone else, or in the
    /// kernel for long, is killed at this bound all the same.
    public static let terminationStopBound = Duration.seconds(1)

    /// A period of `length` (budget, quota or window), no shorter than rule 7a allows.
    static func periodLength(_ length: Duration, _ settings: Configuration) -> Duration {
        max(length, min(minimumGrace, settings.expirationWarning))
    }

    mutating func enterBackground(_ app: ProcessIdentity, cause: String = "", at now: Instant, effects: inout [Effect]) {
        guard var record = apps[app], record.state == .foreground else { return }
        if record.requestKey != nil { replan(at: now) }  // its due requests waited for this
        let settings = settings(record)
        let exempt = record.policy?.exempt == true
        record.state = .background
        count(from: .foreground, to: .background)
        record.phase = .transition
        record.warned = false
        record.epoch += 1
        // An exempt app has no deadline: no warning, no suspension or termination for time.
        // With a quota, the period ends when the budget or the quota left does, the earlier.
        let quotaLeft = quotaRemaining(record, at: now)
        record.deadline = exempt ? nil
            : now + Self.periodLength(min(settings.backgroundTime, quotaLeft ?? settings.backgroundTime), settings)
        if let deadline = record.deadline {
            timers.insert(.warning(app, epoch: record.epoch), at: max(now, deadline - settings.expirationWarning))
            timers.insert(.deadline(app, epoch: record.epoch), at: deadline)
        }
        // One string written in place (`TextAssembly`): pieces joined by `+` and
        // interpolation were eight appends of their own, a quarter of an app's way to the
        // background (callgrind).
        let policyName = exempt ? record.policy!.name : ""
        let message = String(capacity: 192 + policyName.utf8.count + cause.utf8.count) { message in
            message.append("entered the background with ")
            if exempt {
                message.append("no time limit (exempt by ")
                message.append(policyName)
                message.append(")")
            } else {
                message.append(timeSpan: record.deadline! - now)
                message.append(" of background time")
                if let quotaLeft {
                    message.append(" (")
                    message.append(timeSpan: quotaLeft)
                    message.append(" of its daily quota left)")
                }
            }
            message.append(cause)
        }
        effects.append(.log(.app(.appBackgrounded, .info, app, uid: record.uid, command: record.command, message)))
        if record.subscribers > 0 {
            record.transitionDeadline = now + settings.transitionTimeout
            if !exempt { timers.insert(.transitionTimeout(app, epoch: record.epoch), at: record.transitionDeadline!) }
            apps[app] = record
            effects.append(.lifecycle(app, uid: record.uid, .didEnterBackground(transitionTimeout: settings.transitionTimeout,
                                                               backgroundTimeRemaining: record.deadline.map { $0 - now })))
        } else {
            // No subscriber: the app counts as having returned from its handler at once.
            apps[app] = record
            finishTransition(of: app, at: now, effects: &effects)
        }
        settleQuota(app, at: now)
    }

    mutating func enterForeground(_ app: ProcessIdentity, cause: String = "", at now: Instant, effects: inout [Effect]) {
        guard var record = apps[app], record.state != .foreground else { return }
        let wasSuspended = record.state == .suspended
        count(from: record.state, to: .foreground)
        record.state = .foreground
        record.phase = nil
        record.deadline = nil
        record.transitionDeadline = nil
        record.warned = false
        record.epoch += 1
        apps[app] = record
        if wasSuspended {
            effects.append(.act(AppActionRecord(app: app, uid: record.uid, command: record.command, unit: record.unit,
                                                action: .resumed, reason: .foreground, taskNames: []), signal: nil))
            effects.append(.log(.app(.appResumed, .notice, app, uid: record.uid, command: record.command, "resumed: foreground\(cause)",
                                     reason: .foreground)))
        } else {
            effects.append(.log(.app(.appForegrounded, .info, app, uid: record.uid, command: record.command, "returned to the foreground\(cause)")))
        }
        for id in record.taskIDs {
            guard var task = tasks[id], task.state == .expiring else { continue }
            task.state = .granted
            tasks[id] = task
            reportChange(of: task, at: now, effects: &effects)
        }
        effects.append(.lifecycle(app, uid: record.uid, .willEnterForeground))
        settleQuota(app, at: now)
    }

    /// Rule 6: the warning timer fired.
    mutating func warn(_ app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app], record.state == .background, let deadline = record.deadline else { return }
        apps.update(app) { record in
            record.warned = true
            if record.phase == .running { record.phase = .expiring }
        }
        let left = max(.zero, deadline - now)
        var expiring: [TaskID] = []
        for id in record.taskIDs {
            guard var task = tasks[id] else { continue }
            if task.state == .pending {
                finish(task, as: .denied, reason: .noBackgroundTime, at: now, effects: &effects)
                continue
            }
            guard task.state == .granted else { continue }
            task.state = .expiring
            tasks[id] = task
            expiring.append(id)
            reportChange(of: task, at: now, effects: &effects)
            let handler = task.expirationHandler
            effects.append(.log(.task(.taskWarned, handler ? .info : .warning, id, name: task.name, app: app, uid: task.uid,
                                      command: record.command, textCapacity: 96) { text in
                text.append("expires in ")
                text.append(timeSpan: left)
                if !handler { text.append("; it has no expiration handler") }
            }))
        }
        if !expiring.isEmpty {
            effects.append(.lifecycle(app, uid: record.uid, .taskExpiring(expiring, backgroundTimeRemaining: left)))
        }
        suspendIfIdle(app, at: now, effects: &effects)
    }

    /// Rule 7a when the daemon is late: a warning due at `due` goes out at `now`, and a loop
    /// held up past an app's warning and its deadline (stopped, starved of CPU) would send it
    /// with the kill in one pass. The app is warned now, with the time truly left; when that
    /// is less than half the shortest period (a pass's usual lateness, a millisecond or so,
    /// never is), its deadline moves to the whole shortest period after the warning, as for
    /// one warned at once as its period begins.
    mutating func warnLate(_ app: ProcessIdentity, dueAt due: Instant, now: Instant, effects: inout [Effect]) {
        // (One look in the usual case: the shortest period is at most `minimumGrace`.)
        if let deadline = apps.peek(app, { $0.state == .background ? $0.deadline : nil }) ?? nil,
           deadline - now < Self.minimumGrace.half, var record = apps[app] {
            let least = Self.periodLength(.zero, settings(record))
            if deadline - now < least.half {
                record.deadline = now + least
                apps[app] = record
                timers.insert(.deadline(app, epoch: record.epoch), at: now + least)
                let text = String(capacity: 192) { text in  // two spans of at most 40 bytes
                    text.append("warned ")
                    text.append(timeSpan: now - due)
                    text.append(" late (the daemon was held up): its deadline moved to ")
                    text.append(timeSpan: least)
                    text.append(" after the warning")
                }
                effects.append(.log(.app(.taskWarned, .warning, app, uid: record.uid, command: record.command, text)))
            }
        }
        warn(app, at: now, effects: &effects)
    }

    /// Rule 7: background time ran out.
    mutating func deadlinePassed(_ app: ProcessIdentity, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app], record.state == .background else { return }
        let held = record.taskIDs.contains { tasks[$0]?.state.isAssertion == true }
        if held {
            terminateNow(app, reason: .assertionsBeyondPermittedTime, at: now, effects: &effects)
        } else {
            suspend(app, reason: .backgroundTimeExpired, at: now, effects: &effects)
        }
    }

    /// Rule 3: the transition was not reported finished in time. Unless the daemon was held
    /// up past its end by half its length or more (its length up to a second, the minimum
    /// grace): a delegate that calls the daemon as it runs (`beginBackgroundTask` in
    /// `applicationDidEnterBackground`, iOS's way) waited for the answer all that time, and
    /// reports its end only once it has it. Its end moves to that length after now.
    mutating func transitionTimedOut(_ app: ProcessIdentity, dueAt due: Instant, now: Instant, effects: inout [Effect]) {
        guard var record = apps[app], record.state == .background, record.phase == .transition else { return }
        let length = min(Self.minimumGrace, settings(record).transitionTimeout)
        guard now - due < length.half || length == .zero else {
            record.transitionDeadline = now + length
            apps[app] = record
            timers.insert(.transitionTimeout(app, epoch: record.epoch), at: now + length)
            let text = String(capacity: 192) { text in  // two spans of at most 40 bytes
                text.append("is given ")
                text.append(timeSpan: length)
                text.append(" more to finish its background transition: its end came ")
                text.append(timeSpan: now - due)
                text.append(" late (the daemon was held up)")
            }
            effects.append(.log(.app(.appBackgrounded, .warning, app, uid: record.uid, command: record.command, text)))
            return
        }
        terminateNow(app, reason: .transitionTimeout, at: due, effects: &effects)
    }

    mutating func suspend(_ app: ProcessIdentity, reason: ActionReason, at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app] else { return }
        endedLaunches[app] = nil
        for id in record.taskIDs {
            if let task = tasks[id], task.state == .pending {
                finish(task, as: .denied, reason: .suspendedBeforeGrant, at: now, effects: &effects)
            }
        }
        count(from: record.state, to: .suspended)
        apps.update(app) { record in
            record.state = .suspended
            record.phase = nil
            record.transitionDeadline = nil
        }
        effects.append(.act(AppActionRecord(app: app, uid: record.uid, command: record.command, unit: record.unit,
                                            action: .suspended, reason: reason, taskNames: []), signal: nil))
        effects.append(.log(.app(.appSuspended, .notice, app, uid: record.uid, command: record.command, "suspended: " + reason.rawValue,
                                 reason: reason)))
        settleQuota(app, at: now)
    }

    /// Terminates an app: its tasks expire (or end), it is forgotten, and the daemon signals
    /// it. A catchable signal is followed by `SIGKILL` after `TerminateGraceSec`; `SIGKILL`
    /// itself by a `kill` after `terminationStopBound`.
    mutating func terminateNow(_ app: ProcessIdentity, reason: ActionReason, signal chosen: TerminateSignal? = nil,
                               at now: Instant, effects: inout [Effect]) {
        guard let record = apps[app] else { return }
        let signal = chosen ?? settings(record).terminateSignal
        var names: [String] = []
        var expired: [TaskID] = []
        let watched = needsWatch(app)
        for id in record.taskIDs {
            guard let task = tasks[id] else { continue }
            if task.state.isAssertion { names.append(task.name) }
            if task.state.isAssertion, reason == .assertionsBeyondPermittedTime {
                expired.append(id)
                finish(task, as: .expired, reason: .backgroundTimeExpired, at: now, effects: &effects)
            } else {
                finish(task, as: task.state == .pending ? .denied : .ended, reason: .appTerminated, at: now, effects: &effects)
            }
        }
        if !expired.isEmpty { effects.append(.lifecycle(app, uid: record.uid, .taskExpired(expired))) }
        removeApp(app, at: now)
        // `SIGKILL` is the daemon's to send once the app's processes have stopped (a process
        // app's: `Enforcer.signalStoppedTerminations`), and is sent at this `kill` at the latest;
        // a daemon restarted meanwhile kills what its predecessor left stopped.
        let grace = signal == .kill ? nil : settings(record).terminateGrace
        let killAt = now + (grace ?? Self.terminationStopBound)
        terminating[app] = Termination(killAt: killAt, uid: record.uid, grace: grace, unsent: grace == nil ? nil : signal)
        timers.insert(.kill(app), at: killAt)
        effects.append(.act(AppActionRecord(app: app, uid: record.uid, command: record.command, unit: record.unit,
                                            action: .terminated, reason: reason,
                                            taskNames: History.bounded(names)), signal: signal))
        let held = names.isEmpty ? "" : "holding \(History.bounded(names).map { "'\($0)'" }.joined(separator: ", ")) "
        effects.append(.log(.app(.appTerminated, .warning, app, uid: record.uid, command: record.command,
                                 "\(held)terminated with \(signal): \(reason.rawValue)", reason: reason)))
        settleWatch(app, before: watched, effects: &effects)
    }

    /// The record of a termination's `SIGKILL` put off (`advance`): "App pid 1234 was still to
    /// be sent its SIGTERM when its terminate grace ran out, 2.3s late (the daemon was held
    /// up): the grace from now, 3s".
    static func killPutOff(_ process: ProcessIdentity, uid: UInt32, signal: TerminateSignal, late: Duration, grace: Duration) -> LogEntry {
        let message = String(capacity: 192) { message in  // two spans of at most 40 bytes
            message.append("App pid ")
            message.append(decimal: Int64(process.pid))
            message.append(" was still to be sent its ")
            message.append(signal.description)
            message.append(" when its terminate grace ran out, ")
            message.append(timeSpan: late)
            message.append(" late (the daemon was held up): the grace from now, ")
            message.append(timeSpan: grace)
        }
        return LogEntry(priority: .warning, kind: .appTerminated, message: message, app: process, uid: uid)
    }

    /// A catchable termination's grace (`nil`: a `SIGKILL` termination, or none under way).
    public func terminationGrace(of app: ProcessIdentity) -> Duration? { terminating[app]?.grace }

    /// A catchable termination's signal went out, to the processes it holds
    /// (`terminationHolds`: a restarted daemon kills them) and to `cgroup`, the app's whole
    /// (saved likewise): no longer `unsent` (a restart does not send it again). Its grace runs from the signal, so one sent
    /// after the termination (its processes' stops took long,
    /// `Enforcer.signalStoppedTerminations`) still gives the handler all of it: the `SIGKILL`
    /// comes no earlier than the grace after the signal. A `SIGKILL` termination, or one not
    /// known, is left as it is.
    public mutating func terminationSignalled(_ app: ProcessIdentity, at now: Instant, cgroup: TerminatedCgroup? = nil) {
        guard var termination = terminating[app], let grace = termination.grace else { return }
        let later = now + grace > termination.killAt
        guard later || termination.unsent != nil || cgroup != nil else { return }
        termination.unsent = nil
        if let cgroup { termination.cgroup = cgroup }
        if later {
            termination.killAt = now + grace
            timers.insert(.kill(app), at: termination.killAt)
        }
        terminating[app] = termination
        apps.touch(app)
    }

    /// The processes a termination holds, all of them so far: those stopped for a signal
    /// still to go out (`unsent`, or a `SIGKILL` one), or, after it, those it went to and
    /// what the app was found to have forked since (a tracked app's forks when its own
    /// process exited within the grace). Saved, so that a restarted daemon signals or kills
    /// them even where the app's own process is gone (its stopped or forked children,
    /// re-parented, are found by no walk).
    public mutating func terminationHolds(_ app: ProcessIdentity, processes: [ProcessIdentity]) {
        guard var termination = terminating[app] else { return }
        termination.signalled = Array(processes.prefix(Self.signalledSavedAtMost))
        terminating[app] = termination
        apps.touch(app)
    }

    /// The processes of a termination saved for a restarted daemon's kill, at most: ~60 bytes
    /// each in the state file, whose lines are read up to 1 MiB (a longer one is skipped,
    /// and with it the termination). The app's own process is first.
    static let signalledSavedAtMost = 4096

    /// The catchable terminations whose signal has not gone out: after a restart, those the
    /// previous daemon was still waiting to send (its processes' stops), for the daemon to
    /// send now. Their `SIGKILL` comes no earlier than the grace after the restart.
    public var unsentTerminations: [(process: ProcessIdentity, uid: UInt32, signal: TerminateSignal, grace: Duration,
                                     stopped: [ProcessIdentity])] {
        terminating.compactMap { process, termination in
            guard let signal = termination.unsent, let grace = termination.grace else { return nil }
            return (process, termination.uid, signal, grace, termination.signalled)
        }
    }

    // MARK: Time

    /// The earliest instant at which `advance(to:)` has work; `nil` when nothing is armed.
    /// Never late. Mutating only to be read in place (`BackgroundModel.uid(of:)`): the daemon
    /// asks after every pass, between calls (the model whole), so the timers made stale
    /// meanwhile are dropped here: the first ones, so that the daemon does not wake for
    /// nothing (an app back in the foreground or suspended had its warning and deadline wake
    /// it, 25 and 30 s later: a desktop whose 50 windows were hidden one by one and shown
    /// again woke it 106 times in the next 36 s; so did an ended task's age warning), and
    /// all of them once they pile up (`TimerQueue.hasPiledUp`).
    ///
    /// `armedAt`: where the caller's timer is armed already, if it moves only earlier (the
    /// daemon's `armTimer`): a first timer at or after it is returned unchecked, since the
    /// answer moves nothing — it is looked at again when that timer fires and nothing is
    /// armed. The look costs a record's lookup (~400 instructions of every call, callgrind:
    /// the first timer is most often the state's write, re-armed with each call).
    public mutating func nextDeadline(armedAt armed: Instant? = nil) -> Instant? {
        if timers.hasPiledUp {
            var queue = TimerQueue()
            swap(&queue, &timers)
            queue.dropStale { isCurrent($0) }
            swap(&queue, &timers)
        }
        let unmoved = armed?.nanoseconds ?? .max
        while let first = timers.first, first.instant.nanoseconds < unmoved, !isCurrent(first) { timers.removeFirst() }
        // Likewise a task ended before its age warning (each short task woke it 30 s after it began).
        while ageQueueHead < ageQueue.count, !tasks.contains(ageQueue[ageQueueHead].id) { _ = popAgeQueue() }
        let age = nextAgeWarning()
        guard let timer = timers.first?.instant else { return age }
        return age.map { min($0, timer) } ?? timer
    }

    /// Whether a timer would do something when it fires: `advance`'s checks, and the state
    /// what it fires needs (a grant's task still pending; a warning, deadline or transition's
    /// end of the app's background period of that epoch, while it lasts: every return to the
    /// background is a new epoch; a kill at or after the termination's; a wait's or the
    /// requests' current serial). Only where the model is whole: a timer armed for a record
    /// not yet written back would read as stale.
    mutating func isCurrent(_ entry: TimerQueue.Entry) -> Bool {
        switch entry.kind {
        case let .grant(id):
            tasks.peek(id) { $0.state == .pending } == true
        case let .transitionTimeout(app, epoch):
            apps.peek(app) { $0.epoch == epoch && $0.state == .background && $0.phase == .transition && $0.transitionDeadline == entry.instant } == true
        case let .warning(app, epoch):
            apps.peek(app) { $0.epoch == epoch && $0.state == .background && $0.deadline != nil } == true
        case let .deadline(app, epoch):
            apps.peek(app) { $0.epoch == epoch && $0.state == .background && $0.deadline == entry.instant } == true
        case let .kill(process):
            terminating[process].map { $0.killAt <= entry.instant } == true
        case let .wait(wait, serial):
            waits[wait] == serial
        case let .requests(serial):
            serial == requestPassSerial
        }
    }

    func nextAgeWarning() -> Instant? {
        ageQueueHead < ageQueue.count ? Instant(nanoseconds: ageQueue[ageQueueHead].created.nanoseconds &+ spans.taskAgeWarning) : nil
    }

    /// Rule 7a's other half: the apps that firing what is due at `now` would terminate for
    /// time (a deadline passing with tasks held, a transition not finished). The daemon reads
    /// what they already sent first: a task end that reached it in time counts, however busy
    /// it was.
    /// Mutating only to be read in place (the daemon asks at every pass).
    public mutating func appsFacingTermination(at now: Instant) -> [ProcessIdentity] {
        var result: [ProcessIdentity] = []
        let tasks = self.tasks.snapshot
        for entry in timers.due(at: now) {
            switch entry.kind {
            case let .deadline(app, epoch):
                let facing = apps.peek(app) { record in
                    record.epoch == epoch && record.deadline == entry.instant && record.state == .background
                        && record.taskIDs.contains(where: { tasks[$0]?.state.isAssertion == true })
                }
                if facing == true { result.append(app) }
            case let .transitionTimeout(app, epoch):
                if apps.peek(app, { $0.epoch == epoch && $0.transitionDeadline == entry.instant && $0.phase == .transition }) == true {
                    result.append(app)
                }
            case .grant, .warning, .kill, .wait, .requests:
                continue
            }
        }
        return result
    }

    /// The processes that began `app`'s active tasks.
    public func taskOwners(of app: ProcessIdentity) -> Set<ProcessIdentity> {
        Set((apps[app]?.taskIDs ?? []).compactMap { tasks[$0]?.owner })
    }

    /// Fires every timer due at or before `now`, each at its own instant, in order; at most
    /// `limit` of them. Returns whether none is left due (false: call again).
    @discardableResult
    public mutating func advance(to now: Instant, limit: Int = .max, effects: inout [Effect]) -> Bool {
        var fired = 0
        while true {
            guard fired < limit else { return nextDeadline().map { $0 > now } ?? true }
            fired += 1
            if let age = nextAgeWarning(), age <= now, age <= (timers.first?.instant ?? age) {
                if let id = popAgeQueue() { warnAge(id, at: age, effects: &effects) }
                continue
            }
            guard let entry = timers.popDue(at: now) else { return true }
            let at = entry.instant
            switch entry.kind {
            case let .grant(id): grant(id, at: at, effects: &effects)
            case let .transitionTimeout(app, epoch):
                // (A transition's end a late pass moved fires at its new instant.)
                if apps.peek(app, { $0.epoch == epoch && $0.transitionDeadline == at }) == true {
                    transitionTimedOut(app, dueAt: at, now: now, effects: &effects)
                }
            case let .warning(app, epoch):
                if apps.peek(app, { $0.epoch == epoch }) == true { warnLate(app, dueAt: at, now: now, effects: &effects) }
            case let .deadline(app, epoch):
                // (A deadline a late warning moved fires at its new instant.)
                if apps.peek(app, { $0.epoch == epoch && $0.deadline == at }) == true {
                    deadlinePassed(app, at: at, effects: &effects)
                }
            case let .kill(process):
                // (An entry before the termination's `killAt`: its grace began again at the signal.)
                guard var termination = terminating[process], termination.killAt <= at else { continue }
                if now > at, let signal = termination.unsent, let grace = termination.grace, killsPutOff.insert(process).inserted {
                    // Its signal still to go out, in a late pass: the daemon was held up past
                    // the grace (the signal's bound, `Enforcer.signalBound`, is at most half
                    // of it, and fires first in this pass). The grace from now, as from a
                    // signal sent now — `SIGTERM` and `SIGKILL` back to back would give the
                    // handler no time.
                    termination.killAt = now + grace
                    terminating[process] = termination
                    apps.touch(process)
                    timers.insert(.kill(process), at: termination.killAt)
                    effects.append(.log(Self.killPutOff(process, uid: termination.uid, signal: signal, late: now - at, grace: grace)))
                    continue
                }
                killsPutOff.remove(process)
                terminating[process] = nil
                apps.touch(process)
                effects.append(.kill(process, uid: termination.uid))
                settleWatch(process, before: true, effects: &effects)
            case let .wait(wait, serial):
                waitFired(wait, serial: serial, effects: &effects)
            case let .requests(serial):
                if serial == requestPassSerial { runRequests(at: at, effects: &effects) }
            }
        }
    }
}
