// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// Per-app policies (DESIGN.md §2b): which file matches an app, from what the kernel says of
/// it — its unit, its executable (`/proc/PID/exe`, never the process's own claim), its user.
extension Daemon {
    /// The policy for a process about to become an app (`nil` with no policy files), and
    /// the key its daily background time is kept by (only when the policy sets one).
    func policy(for process: ProcessDescription) -> (policy: AppPolicy?, quotaKey: String?) {
        guard !policies.policies.isEmpty else { return (nil, nil) }
        let facts = facts(pid: process.identity.pid, uid: process.uid, unit: process.unit)
        let policy = policies.policy(for: facts)
        return (policy, policy?.dailyBackground == nil ? nil : facts.quotaKey)
    }

    func facts(pid: Int32, uid: UInt32, unit: String?) -> AppFacts {
        AppFacts(unit: unit.map(AppUnit.name(ofPath:)), userUnit: unit.map(AppFacts.isUserUnit(path:)) ?? false,
                 executable: Host.executable(pid: pid), uid: uid, user: userName(uid: uid))
    }

    /// User names, looked up only when a policy matches `User=` by name (NSS may be LDAP or
    /// SSSD, and block the loop), and then at most once a minute per uid, for 4,096 uids.
    func userName(uid: UInt32) -> String? {
        guard policies.policies.contains(where: { $0.users.contains { UInt32($0) == nil } }) else { return nil }
        let now = loop.now
        if let cached = userNames[uid], now - cached.at < 60_000_000_000 { return cached.name }
        if userNames.count >= 4096 { userNames.removeAll(keepingCapacity: true) }
        let name = Host.userName(uid: uid)
        userNames[uid] = (name, now)
        return name
    }

    /// Matches every app again (after a reload or a restart): the new policy applies from
    /// the app's next background period.
    func rematchPolicies() {
        for app in model.listApps(at: now) {
            let facts = facts(pid: app.identity.pid, uid: app.uid, unit: app.unit)
            let policy = policies.policies.isEmpty ? nil : policies.policy(for: facts)
            model.setPolicy(policy, quotaKey: policy?.dailyBackground == nil ? nil : facts.quotaKey, of: app.identity, at: now)
        }
    }

    /// A policy as `--check-config` and `bgtaskctl policy` show it: its match, its rules.
    static func describe(_ policy: AppPolicy) -> String {
        var lines: [String] = ["[Match]"]
        if !policy.units.isEmpty { lines.append("Unit=" + policy.units.joined(separator: " ")) }
        if !policy.userUnits.isEmpty { lines.append("UserUnit=" + policy.userUnits.joined(separator: " ")) }
        if !policy.executables.isEmpty { lines.append("Executable=" + policy.executables.joined(separator: " ")) }
        if !policy.users.isEmpty { lines.append("User=" + policy.users.joined(separator: " ")) }
        lines.append("[Policy]")
        lines.append("Exempt=\(policy.exempt ? "yes" : "no")")
        lines.append("DailyBackgroundSec=" + (policy.dailyBackground.map(ConfigurationValue.formatTimeSpan) ?? ""))
        if let maxTasks = policy.maxTasks { lines.append("MaxTasks=\(maxTasks)") }
        for name in policy.overrides {
            if let key = Configuration.key(named: name) { lines.append("\(name)=\(key.format(policy.configuration))") }
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

extension Wire {
    /// `GetPolicy`'s reply: the matched file (or none) and the settings the app lives by.
    static func policy(_ policy: AppPolicy?, settings: Configuration) -> [String: JSON] {
        var effective: [String: JSON] = [:]
        for key in Configuration.keys where AppPolicy.perAppKeys.contains(key.name) {
            effective[key.name] = .string(key.format(settings))
        }
        effective["Exempt"] = .bool(policy?.exempt == true)
        effective["DailyBackgroundSec"] = policy?.dailyBackground.map { .string(ConfigurationValue.formatTimeSpan($0)) } ?? .null
        effective["MaxTasks"] = policy?.maxTasks.map { .int(Int64($0)) } ?? .null
        return ["policy": policy.map { .string($0.name) } ?? .null, "file": policy.map { .string($0.file) } ?? .null,
                "settings": .object(effective)]
    }
}
