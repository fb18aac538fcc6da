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
        let counts = statusCounts
        if counts != lastStatusCounts {
            lastStatusCounts = counts
            ServiceNotify.send("STATUS=\(statusLine(counts))")
        }
    }

    /// The model's counts now, read in place (`endPass` compares them with the last sent).
    var statusCounts: StatusCounts {
        inPlace { model in
            StatusCounts(apps: model.appCount, background: model.stateCounts[.background, default: 0],
                         suspended: model.stateCounts[.suspended, default: 0], tasks: model.taskCount)
        }
    }

    /// `STATUS=`'s text for `counts`; also remembered as the last one sent.
    func statusLine(_ counts: StatusCounts? = nil) -> String {
        let counts = counts ?? statusCounts
        lastStatusCounts = counts
        return "\(counts.apps) apps (\(counts.background) background, \(counts.suspended) suspended), \(counts.tasks) tasks"
    }

    /// Re-reads the configuration; on error keeps the old one and says why.
    func reload() -> ConfigurationError? {
        ServiceNotify.send("RELOADING=1\nMONOTONIC_USEC=\(Clock.monotonicNanoseconds() / 1000)")
        defer { ServiceNotify.send("READY=1\nSTATUS=\(statusLine())") }
        do {
            let configuration = try options.loadConfiguration()
            let policies = try options.loadPolicies(over: configuration)
            model.reload(configuration)
            self.policies = policies
            rematchPolicies()
            access = AccessPolicy(managerGID: Self.groupID(configuration.managerGroup))
            log(.info, "Configuration reloaded (\(policies.policies.count) policies)")
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
