// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// Carrying out what the model decided: events to subscribers, streams and monitors;
/// suspensions, resumptions and terminations; process watches; log records.
extension Daemon {
    /// Carries out the model's effects in order, then feeds it any exits found meanwhile.
    /// Before anything is done to a process, what changed is written to the state file: on
    /// disk is never behind what was done. A suspension that cannot be recorded waits until
    /// it can: a crash would otherwise leave the app stopped with no record of it. Replies
    /// and events are only queued here; the pass writes the state before they go out
    /// (`commit`). The model made every change these effects act on before it listed them,
    /// so one write before the first action covers them all (16 deadlines fired together
    /// are one write, not 16).
    func carryOut(_ effects: [Effect]) {
        var written = false
        func writeOnce() {
            if !written { writeState() }
            written = true
        }
        // Each effect read where it lies: `for effect in effects` copied each (the enum's
        // generic copy and destroy, ~300 instructions an effect: callgrind).
        for index in effects.indices {
            switch effects[index] {
            case let .lifecycle(app, uid, event):
                if let ids = subscribers[app] {
                    // Encoded once, its bytes shared by every subscriber's queue.
                    let frame = Wire.eventFrame(event, using: frameBuffer)
                    for id in ids { if let connection = connections[id] { send(shared: frame, to: connection) } }
                }
                broadcast(uid: uid) { Wire.eventFrame(event, pid: app.pid, using: frameBuffer) }
            case let .taskChanged(task):
                if task.state != .pending, let id = taskStreams[task.id], let connection = connections[id] {
                    let ended = !task.state.isActive
                    if ended { taskStreams[task.id] = nil }
                    send(HotReply.task(task, continues: !ended), to: connection)
                    if ended, !connection.isClosed { endStream(of: connection) }
                }
                if !monitors.isEmpty {
                    broadcast(uid: task.uid) { Wire.monitorFrame(task, using: frameBuffer) }
                }
            case let .act(record, signal):
                writeOnce()
                if record.action == .suspended, !stateWritable {
                    deferredSuspensions.insert(record.app)
                    log(.warning, "App \(record.app) (\(record.command)) not suspended yet: \(stateFile.path) cannot be written, and a suspension must be recorded first")
                } else {
                    enforce(record, signal: signal)
                }
                let entry = HistoryEntry(realtimeNanoseconds: Clock.realtimeNanoseconds(), record: record)
                history.append(entry)
                stateFile.record(entry)
                if !monitors.isEmpty {
                    broadcast(uid: record.uid) { Wire.monitorFrame(entry, using: frameBuffer) }
                }
            case let .kill(process, uid):
                writeOnce()
                enforcer.kill(process, uid: uid)
            case let .watch(process):
                watch(process)
            case let .unwatch(process):
                forgetWatch(process)
                tracker?.stop(process)
                enforcer.unwatchUnit(process)
                enforcer.forgetWalks(of: process)
            case let .log(entry):
                log(entry)
            case let .due(wait):
                carryOut(wait)
            }
        }
        while !exitedProcesses.isEmpty {
            let process = exitedProcesses.removeFirst()
            var more: [Effect] = []
            model.processExited(process, at: now, effects: &more)
            carryOut(more)
        }
    }

    /// Sends a monitor event to every monitor allowed to see an app of `uid` (`Monitors`).
    /// Every event names its owner: there is no event for everyone.
    /// `frame` is made once, when the first monitor allowed to see it is found.
    func broadcast(uid: UInt32, _ makeFrame: () -> [UInt8]) {
        guard !monitors.isEmpty else { return }
        var frame: [UInt8]?
        monitors.seeing(uid) { id in
            guard let connection = connections[id] else { return }
            if frame == nil { frame = makeFrame() }
            send(shared: frame!, to: connection)
        }
    }

    /// Starts watching `process` through the pidfd resolved for this call (every watch starts
    /// with a call about that process). Never by opening its pid again: a pid can be recycled
    /// within one start-time tick. A process already gone is reported as exited.
    func watch(_ process: ProcessIdentity) {
        guard watches[process] == nil else { return }
        guard let pidfd = callPidfds[process], !pidfd.hasExited,
              let source = try? clients.add(pidfd.descriptor.rawValue, events: IOEvents.readable, { [unowned self] _ in
                  self.processExited(process)
              }) else {
            exitedProcesses.append(process)
            return
        }
        watches[process] = (pidfd, source)
        watchedByPID[process.pid] = process
        if model.containment(of: process) == .tracked { tracker?.follow(process, root: pidfd) }
        if let unit = model.unit(of: process), model.settings(of: process).suspendMode != .signal {
            enforcer.watchUnit(process, path: unit)
        }
        isolateIfAllowed(process)
    }

    func forgetWatch(_ process: ProcessIdentity) {
        watches[process] = nil
        if watchedByPID[process.pid] == process { watchedByPID[process.pid] = nil }
    }

    func processExited(_ process: ProcessIdentity) {
        forgetWatch(process)
        // A terminated app's own process exited within its grace: what it forked meanwhile
        // (the tracker's set, every fork read) is still the app's, for the grace's `SIGKILL`.
        if let tracker, enforcer.terminating[process] != nil, tracker.follows(process) {
            enforcer.holdForGrace(process, tracker.members(of: process))
        }
        tracker?.stop(process)
        enforcer.forget(process, at: loop.now)
        deferredSuspensions.remove(process)
        var effects: [Effect] = []
        model.processExited(process, at: now, effects: &effects)
        carryOut(effects)
    }

    /// A wait the model timed for the daemon fell due.
    func carryOut(_ wait: Wait) {
        switch wait {
        case let .freeze(app): enforcer.freezeWaitEnded(app, at: loop.now)
        case .stopCheck: enforcer.checkStops(at: loop.now)
        case .terminationStops: enforcer.signalStoppedTerminations(at: loop.now)
        case let .isolation(app): checkScope(app)
        case let .thawCheck(app):
            guard let number = enforcer.stopSignalPending(app),
                  let signal = TerminateSignal.all.first(where: { $0.number == number }) else { return }
            var effects: [Effect] = []
            model.stoppedWhileSuspended(app, signal: signal, at: now, effects: &effects)
            carryOut(effects)
        case .stateRetry: writeState()
        case .stateQuiet: whenStateQuiet()
        case .status: sendStatus()
        case .processEvents: watchProcessEvents()
        case .keepAwake: recheckAwake()
        }
    }

    /// Suspends, resumes or terminates the whole app (rule 10).
    func enforce(_ record: AppActionRecord, signal: TerminateSignal?) {
        deferredSuspensions.remove(record.app)
        enforcer.adopt(record.app, unitPath: record.unit)
        switch record.action {
        case .suspended:
            enforcer.suspend(record.app, uid: record.uid, command: record.command,
                             mode: inPlace { $0.settings(of: record.app).suspendMode }, at: loop.now)
        case .resumed, .woken:
            enforcer.resume(record.app, uid: record.uid, at: loop.now)
        case .terminated:
            enforcer.terminate(record.app, uid: record.uid, command: record.command, signal: signal?.number ?? Signal.kill,
                               grace: model.terminationGrace(of: record.app)?.nanoseconds, at: loop.now)
        }
    }
}
