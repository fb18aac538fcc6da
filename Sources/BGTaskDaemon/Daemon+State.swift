// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import BGTaskSystem

/// Restart without loss: the state file is written change by change and read back on start.
extension Daemon {
    /// Takes over what a previous daemon left: every app whose process still runs (the same
    /// process: pid, start time and uid, checked while holding a pidfd), its tasks and
    /// deadlines, and its suspension. Apps whose processes died meanwhile, or cannot be proven
    /// to be the same (a state file is trusted only that far), are cleaned up as exits, and
    /// nothing is done to their processes.
    func restore() {
        let loaded = stateFile.load()
        for problem in loaded.problems { log(.warning, problem) }
        for entry in loaded.history { history.append(entry) }
        var effects: [Effect] = []
        var saved = loaded.state
        saved.reidentify { process in
            guard process.inode == 0, let pidfd = try? Pidfd.open(pid: process.pid), pidfd.startTime == process.startTime
            else { return process }
            return ProcessIdentity(pid: process.pid, startTime: process.startTime, inode: pidfd.inode)
        }
        // Policies are not saved: matched again, from the live processes, before the timers
        // are armed (a policy's ExpirationWarningSec sets the warning's instant).
        // Both client libraries are back within their backoff's longest step after a restart.
        let moved = model.restore(saved, at: now, reconnection: .nanoseconds(ClientRules.reconnectMaximum), policy: { [policies] app in
            policies.policies.isEmpty ? nil : policies.policy(for: self.facts(pid: app.identity.pid, uid: app.uid, unit: app.unit))
        }, effects: &effects)
        rematchPolicies()
        // What the machine slept while no daemon ran counts for the requests' dates and the
        // quota window (a file of a daemon that did not count sleep: counting starts now).
        noteSleep(at: now)
        _ = model.takeChanges()
        _ = model.takeQuotaChanges()
        _ = model.takeRequestChanges()
        _ = model.takeSleepChange()
        writeState()
        for case let .watch(process) in effects {
            guard let pidfd = try? Pidfd.open(pid: process.pid), pidfd.startTime == process.startTime,
                  pidfd.inode == process.inode else { continue }
            guard let saved = model.uid(of: process),
                  (try? ProcStatus.uids(pid: process.pid))?.effective == saved else {
                log(.warning, "pid \(process.pid) in \(stateFile.path) is not the process saved there (its uid changed); leaving it alone")
                continue
            }
            callPidfds[process] = pidfd
        }
        carryOut(effects)
        callPidfds.removeAll(keepingCapacity: true)
        // Back in charge: what the model says is suspended is suspended again (the freezer or
        // SIGSTOP left it so, unless someone continued it), and what it says is not, is not
        // (a crash between a resume's record and its SIGCONT would leave it stopped).
        for app in model.listApps(at: now) {
            enforcer.adopt(app.identity, unitPath: app.unit)
            if app.state == .suspended {
                enforcer.suspend(app.identity, uid: app.uid, command: app.command, mode: model.settings(of: app.identity).suspendMode,
                                 at: loop.now)
            } else if enforcer.isStopped(app.identity, uid: app.uid) {
                enforcer.resume(app.identity, uid: app.uid, at: loop.now)
            }
        }
        // What the previous daemon signalled is killed when the grace ends (what it stopped for
        // a `SIGKILL` not sent yet, at the termination's bound), as it would have been: held
        // again, each process re-proved (one that left the app's tree — a child outliving its
        // parent's handler, or orphaned by someone's kill — is found by no walk), and the app's cgroup killed
        // whole if it is still the one signalled (its inode and invocation; `Enforcer.kill`).
        for (process, termination) in saved.terminating where termination.unsent == nil {
            let whole = termination.cgroup.flatMap { saved in
                Cgroup.at(path: saved.path).map {
                    Enforcer.SignalledCgroup(cgroup: $0, instance: Cgroup.Instance(inode: saved.inode, invocation: saved.invocation))
                }
            }
            enforcer.adoptSignalled(process, termination.signalled, cgroup: whole, bound: termination.grace == nil)
        }
        // A catchable termination whose signal the previous daemon had not sent yet (it was
        // waiting for its processes' stops, `Enforcer.signalStoppedTerminations`) is signalled
        // now, its grace from then: it stopped short of the handler, which a restart must not
        // take from it (the `SIGKILL` at the saved instant was all that came). With it, the
        // processes stopped for it (`terminationHolds`): the app's own process killed by
        // someone meanwhile, they were found by no walk, and left stopped.
        for termination in model.unsentTerminations {
            let process = termination.process
            // Its command for the log, from the process itself (a pid another's by now: "?").
            let stat = try? ProcStat.read(pid: process.pid)
            let command = stat.map { $0.startTime == process.startTime ? $0.command : "?" } ?? "?"
            log(.notice, "App \(process) (\(command)) was being terminated when \(stateFile.path) was written, its \(termination.signal) not sent yet: sending it now, its terminate grace from then")
            enforcer.terminate(process, uid: termination.uid, command: command, signal: termination.signal.number,
                               grace: termination.grace.nanoseconds, adopting: termination.stopped, at: loop.now)
        }
        finishStops()
        if loaded.found {
            let counts = model.stateCounts
            log(.info, "Restored \(model.appCount) apps (\(counts[.suspended, default: 0]) suspended) and "
                + "\(model.taskCount) tasks from \(stateFile.path)"
                + (moved == 0 ? "" : "; the deadlines of \(moved) background app(s) moved later: their warning (or the minimum grace, warned) from when their library can be back, as it fell due while no daemon ran"))
        }
    }

    /// Writes what the model changed since the last call; rewrites the whole file once the
    /// log has grown well past it. Called before every process action and at the end of
    /// every pass; with nothing to write it costs nothing.
    func writeState() {
        // The model's reads in place (`inPlace`): this runs in every pass.
        guard inPlace({ $0.hasUnsavedChanges }) || stateFile.hasPendingRecords || !stateFile.isOpen || !stateWritable else { return }
        let stateFile = stateFile
        model.takeChanges(process: { stateFile.record($0) }, task: { stateFile.record($0) })
        stateFile.record(nextTaskID: inPlace { $0.nextTaskIdentifier })
        stateFile.record(quota: model.takeQuotaChanges())
        stateFile.record(requests: model.takeRequestChanges())
        if let sleep = model.takeSleepChange() { stateFile.record(sleep: sleep) }
        do {
            if !stateFile.isOpen {
                // This daemon's first file (the whole state): until it exists there is
                // nothing to append to. Its room is prepared at once (at start-up: an idle
                // daemon wakes for nothing after).
                try stateFile.rewrite(model.savedState(), history: history.entries)
                stateFile.prepareRoom()
            } else if try stateFile.flush(liveRecords: liveRecords), loop.now >= nextRewriteAttempt {
                rewriteDue = true
            }
            lastStateWriteAt = loop.now
            if !stateQuietArmed, rewriteDue || stateFile.needsRoom { armStateQuiet(at: loop.now + Self.rewriteQuiet) }
            if !stateWritable { stateWriteRecovered() }
        } catch {
            stateWriteFailed(error)
        }
    }

    /// The records a rewrite would write: apps, tasks and history entries (the log's size
    /// is measured against it).
    var liveRecords: Int { inPlace { $0.appCount + $0.taskCount } + history.count }

    /// How long the log goes unwritten before the work left for a pause is done
    /// (`whenStateQuiet`).
    static let rewriteQuiet: Int64 = 100_000_000

    /// What the log leaves for a pause, once it has gone `rewriteQuiet` without an append,
    /// not in the middle of a burst of calls (a screen lock's, a deadline burst's), each of
    /// which would wait for it:
    /// - A due rewrite writes the whole state (tens of milliseconds with 10,000 apps); under
    ///   a load that never pauses, it is done once the log has grown to twice the size at
    ///   which it fell due (`StateFile.isOverdue`). The log is bounded by its size, whatever
    ///   the rate of calls, not by a time.
    /// - The room past the log's text is prepared (`StateFile.prepareRoom`): the page faults
    ///   the next burst's appends would take one by one (a profile of a 9,872-app burst: the
    ///   log's fresh pages, ~1,100 of them, 3–8 % of the daemon's time) are taken here in one
    ///   go. Under a load that never pauses they are not: appends fault as they go.
    func whenStateQuiet() {
        stateQuietArmed = false
        guard rewriteDue || stateFile.needsRoom else { return }
        let quiet = loop.now - lastStateWriteAt >= Self.rewriteQuiet
        if !quiet, !(rewriteDue && stateFile.isOverdue(liveRecords: liveRecords)) {
            armStateQuiet(at: lastStateWriteAt + Self.rewriteQuiet)
            return
        }
        if rewriteDue {
            rewriteDue = false
            rewriteState()
        }
        // After an overdue rewrite under load, the next append schedules this again. The room
        // is prepared a slice per pass: a call arriving meanwhile waits for one slice (8 MiB
        // at once held the loop 4.8–9.6 ms here), and an append ends the pause.
        if quiet, stateFile.prepareRoom(slice: Self.roomSlice) { armStateQuiet(at: loop.now + 1) }
    }

    /// Schedules `whenStateQuiet` at `instant` and notes that it is (`stateQuietArmed`); the
    /// timer is armed here too, since a state write comes after the pass's `endPass`.
    private func armStateQuiet(at instant: Int64) {
        stateQuietArmed = true
        model.schedule(.stateQuiet, at: Instant(nanoseconds: instant))
        armTimer(at: instant)
    }

    /// The room prepared per pass (`whenStateQuiet`): 256 pages, ~0.7 ms here on a tmpfs
    /// (~0.3 ms reserving them, ~0.4 ms bringing them into the mapping).
    static let roomSlice = 1 << 20

    /// A failed rewrite (no room for a copy) costs nothing more: the log it would replace is
    /// whole, and appending goes on. It is tried again after a growing delay, never per call.
    func rewriteState() {
        do {
            try stateFile.rewrite(model.savedState(), history: history.entries)
            rewriteDelay = 0
        } catch {
            rewriteDelay = min(max(2 * rewriteDelay, 1_000_000_000), 60_000_000_000)
            nextRewriteAttempt = loop.now + rewriteDelay
            log(.warning, "Cannot rewrite \(stateFile.path): \(error); appending to the old log, trying again in \(rewriteDelay / 1_000_000_000)s")
        }
    }

    /// The log cannot be appended to (a full disk): refuse what would change state, hold
    /// back suspensions, and try again after a growing delay (100 ms up to 5 s).
    private func stateWriteFailed(_ error: Errno) {
        if stateWritable {
            log(.warning, "Cannot write \(stateFile.path): \(error); refusing changes until it can be written")
        }
        stateWritable = false
        stateRetryDelay = min(max(2 * stateRetryDelay, 100_000_000), 5_000_000_000)
        model.schedule(.stateRetry, at: Instant(nanoseconds: loop.now + stateRetryDelay))
        armTimer(at: loop.now + stateRetryDelay)
    }

    private func stateWriteRecovered() {
        stateWritable = true
        stateRetryDelay = 0
        model.cancel(.stateRetry)
        log(.notice, "\(stateFile.path) can be written again")
        // The suspensions held back, of apps still suspended.
        for app in deferredSuspensions.sorted(by: { $0.pid < $1.pid }) {
            guard let snapshot = model.snapshot(of: app, at: now), snapshot.state == .suspended else { continue }
            enforcer.adopt(app, unitPath: snapshot.unit)
            enforcer.suspend(app, uid: snapshot.uid, command: snapshot.command, mode: model.settings(of: app).suspendMode,
                             at: loop.now)
        }
        deferredSuspensions.removeAll()
    }

    /// Refuses a call that would change state while it cannot be recorded (after trying once
    /// more: the disk may have room again). On every changing call's path: its usual case, a
    /// flag, inlined (the optimizer left the whole call out of line once, ~20 instructions
    /// a call: callgrind).
    @inline(__always)
    func requireWritableState() throws(BGTaskError) {
        if !stateWritable { try writeStateOrRefuse() }
    }

    private func writeStateOrRefuse() throws(BGTaskError) {
        writeState()
        if !stateWritable { throw .stateNotWritable(stateFile.path) }
    }
}
