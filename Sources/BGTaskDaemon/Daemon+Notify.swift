// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// The numbers `STATUS=` shows.
struct StatusCounts: Equatable {
    var apps = 0, background = 0, suspended = 0, tasks = 0
}

/// What the service manager is told: `STATUS=`, `RELOADING=1`, `READY=1`; and reloading.
extension Daemon {
    /// Sends `STATUS=` if it changed since the last one.
    func sendStatus() {
        statusPending = false
        lastStatusSent = loop.now
        if statusCounts != lastStatusCounts { notifyStatus() }
    }

    /// Sends `STATUS=` with the counts now, after `prefix` (`READY=1\n`), and remembers them
    /// as the last sent.
    func notifyStatus(after prefix: String = "") {
        let counts = statusCounts
        lastStatusCounts = counts
        ServiceNotify.send(prefix + "STATUS=" + Self.statusLine(counts))
    }

    /// The model's counts now, read in place (`endPass` compares them with the last sent).
    var statusCounts: StatusCounts {
        inPlace { model in
            StatusCounts(apps: model.appCount, background: model.stateCounts[.background, default: 0],
                         suspended: model.stateCounts[.suspended, default: 0], tasks: model.taskCount)
        }
    }

    /// `STATUS=`'s text for `counts`.
    static func statusLine(_ counts: StatusCounts) -> String {
        "\(counts.apps) apps (\(counts.background) background, \(counts.suspended) suspended), \(counts.tasks) tasks"
    }

    /// Re-reads the configuration; on error keeps the old one and says why.
    func reload() -> ConfigurationError? {
        ServiceNotify.send("RELOADING=1\nMONOTONIC_USEC=\(Clock.monotonicNanoseconds() / 1000)")
        defer { notifyStatus(after: "READY=1\n") }
        do {
            let (configuration, read) = try options.loadConfiguration()
            let policies = try options.loadPolicies(over: configuration)
            model.reload(configuration)
            self.policies = policies
            rematchPolicies()
            access = AccessPolicy(managerGID: Self.groupID(configuration.managerGroup))
            sortMonitors()
            log(.info, "Configuration reloaded from \(read.isEmpty ? "the built-in defaults" : read.joined(separator: ", ")) (\(policies.policies.count) policies)")
            return nil
        } catch {
            log(.warning, "Configuration not reloaded, keeping the old one: \(error)")
            return error
        }
    }

    static func groupID(_ name: String) -> UInt32? {
        name.isEmpty ? nil : Host.groupID(named: name)
    }
}
