// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// What the service manager is told: `STATUS=`, `RELOADING=1`, `READY=1`; and reloading.
extension Daemon {
    /// Sends `STATUS=` if it changed since the last one.
    func sendStatus() {
        statusPending = false
        lastStatusSent = loop.now
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
