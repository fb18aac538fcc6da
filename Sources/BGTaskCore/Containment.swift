// SPDX-License-Identifier: Apache-2.0
/// How an app's processes are held together, so that none escapes (DESIGN.md §2a).
public enum Containment: String, CaseIterable, Sendable {
    /// The app is a unit's cgroup: every process in it and below it, whatever its parent.
    case unit
    /// A process app the daemon moved into a transient scope of its own.
    case scope
    /// A process app whose forks the daemon follows as they happen (the kernel's
    /// process-events connector): a re-parented process stays in.
    case tracked
    /// A process app found by walking its process tree: a re-parented process escapes.
    case tree
}

/// Which cgroups are apps of their own: a systemd unit's (`.scope`, `.service`), except the
/// units that hold more than one app or the system itself.
public enum AppUnit {
    /// Unit names are at most this long (systemd's `UNIT_NAME_MAX`).
    public static let maximumNameBytes = 255

    /// The unit cgroup that makes a process in cgroup `path` (relative to the cgroup root,
    /// e.g. `/user.slice/user-1000.slice/user@1000.service/app.slice/app-foo.scope`) a unit
    /// app: the path up to its deepest `.scope` or `.service`. `nil` when there is none, or
    /// when that unit may not be an app (`refusal(ofName:)`) or is the daemon's own.
    public static func of(cgroupPath path: String, daemonUnit: String?) -> String? {
        let components = path.split(separator: "/")
        guard let last = components.lastIndex(where: { $0.hasSuffix(".scope") || $0.hasSuffix(".service") }),
              refusal(ofName: String(components[last])) == nil else { return nil }
        let unit = "/" + components[...last].joined(separator: "/")
        return unit == daemonUnit ? nil : unit
    }

    /// Why `name` cannot name an app's unit, or `nil` if it can: it must be a valid
    /// `.scope` or `.service` name, and not `init.scope` (the system's or a user manager's),
    /// a login session's `session-N.scope`, or a user manager's `user@UID.service`.
    public static func refusal(ofName name: String) -> String? {
        guard !name.isEmpty, name.utf8.count <= maximumNameBytes,
              name.utf8.allSatisfy({ byte in
                  (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                      || ":_.\\@-".utf8.contains(byte)
              }) else { return "'\(name.cEscaped)' is not a unit name" }
        guard name.hasSuffix(".scope") || name.hasSuffix(".service") else {
            return "\(name) is not a scope or service (a slice holds many apps)"
        }
        guard name.first != "." else { return "'\(name)' is not a unit name" }
        if name == "init.scope" { return "init.scope holds the system's (or a user manager's) own processes" }
        if name.hasPrefix("session-"), name.hasSuffix(".scope") { return "\(name) is a login session, not an app" }
        if name.hasPrefix("user@"), name.hasSuffix(".service") { return "\(name) is a user's service manager" }
        return nil
    }

    /// The unit's name: the last component of its cgroup path (trailing slashes ignored; a
    /// path of slashes alone is itself). Found from the end, with no array of components:
    /// every `SetAppState` of a unit app names its unit in the reply.
    public static func name(ofPath path: String) -> String {
        let bytes = path.utf8
        var end = bytes.endIndex
        while end > bytes.startIndex, bytes[bytes.index(before: end)] == UInt8(ascii: "/") { end = bytes.index(before: end) }
        guard end > bytes.startIndex else { return path }
        let start = bytes[..<end].lastIndex(of: UInt8(ascii: "/")).map { bytes.index(after: $0) } ?? bytes.startIndex
        return String(path[start..<end])
    }
}

/// Which systemd manager may move a process app into a transient scope of its own
/// (`IsolateApps=`, containment `scope`).
public enum Isolation: Equatable, Sendable {
    /// User `uid`'s manager: the app's processes live in its delegated subtree.
    case user(UInt32)
    /// The system manager, the scope in `slice` (the one the processes are in) if any.
    case system(slice: String?)

    /// Who may isolate a process app of `uid` whose process is in cgroup `path`, for a
    /// daemon running as `daemonUID`; `nil` if nobody may. A user manager admits only its
    /// user and root; the system manager, only root, and only when configured (`yes`): a
    /// login session's or a system service's processes are not moved otherwise.
    public static func of(cgroupPath path: String, uid: UInt32, mode: IsolateApps, daemonUID: UInt32) -> Isolation? {
        guard mode != .no else { return nil }
        let components = path.split(separator: "/")
        if components.contains(Substring("user@\(uid).service")) {
            return daemonUID == 0 || daemonUID == uid ? .user(uid) : nil
        }
        guard mode == .yes, daemonUID == 0 else { return nil }
        return .system(slice: components.last { $0.hasSuffix(".slice") }.map(String.init))
    }

    /// The transient scope's name for the app whose process is `pid`.
    public static func scopeName(pid: Int32) -> String { "app-bgtaskd-\(pid).scope" }
}
