import BGTaskCore
import BGTaskSystem
import Glibc

/// Restart without loss: the state file is written change by change and read back on start.
extension Daemon {
    /// Takes over what a previous daemon left: every app whose process still runs (the same
    /// process: pid and start time, checked while holding a pidfd), its tasks and deadlines,
    /// and its suspension. Apps whose processes died meanwhile are cleaned up as exits.
    func restore() {
        let loaded = stateFile.load()
        for problem in loaded.problems { log(.warning, problem) }
        for entry in loaded.history { history.append(entry) }
        var effects: [Effect] = []
        model.restore(loaded.state, at: now, effects: &effects)
        _ = model.takeChanges()
        rewriteState()
        for case let .watch(process) in effects {
            if let pidfd = try? Pidfd.open(pid: process.pid), pidfd.startTime == process.startTime {
                callPidfds[process] = pidfd
            }
        }
        run(effects)
        callPidfds.removeAll()
        // Back in charge: what the model says is suspended is suspended again (the freezer or
        // SIGSTOP left it so, unless someone continued it), and what it says is not, is not
        // (a crash between a resume's record and its SIGCONT would leave it stopped).
        for app in model.listApps(at: now) {
            if app.state == .suspended {
                enforcer.suspend(app.identity, command: app.command, mode: model.configuration.suspendMode)
            } else if enforcer.isStopped(app.identity) {
                enforcer.resume(app.identity)
            }
        }
        afterPass()
        if loaded.found {
            let counts = model.stateCounts
            log(.info, "Restored \(model.appCount) apps (\(counts[.suspended, default: 0]) suspended) and "
                + "\(model.taskCount) tasks from \(stateFile.path)")
        }
    }

    /// Notes what the model changed since the last call.
    func saveChanges() {
        stateFile.record(model.takeChanges(), nextTaskID: model.nextTaskIdentifier)
    }

    /// Writes what was noted; rewrites the whole file once the log has grown well past it.
    func writeState() {
        saveChanges()
        if stateWriteFailed { return rewriteState() }  // the log missed lines: write it whole
        do {
            let live = model.appCount + model.taskCount + history.count
            if try stateFile.flush(liveRecords: live) { rewriteState() }
        } catch {
            stateWriteFailedOnce(error)
        }
    }

    func rewriteState() {
        do {
            try stateFile.rewrite(model.savedState(), history: history.entries)
            stateWriteFailed = false
        } catch {
            stateWriteFailedOnce(error)
        }
    }

    private func stateWriteFailedOnce(_ error: Errno) {
        if !stateWriteFailed {
            log(.warning, "Cannot write \(stateFile.path): \(error); a restart now would lose recent changes")
        }
        stateWriteFailed = true
    }
}
