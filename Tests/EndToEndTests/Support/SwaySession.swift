// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import TestSupport
import Testing
import Varlink

/// A real sway (Debian 12's 1.7), headless, run as uid 65534 (sway refuses root), with its
/// own runtime directory; `foot` windows opened in it with `swaymsg exec`. Sway is started
/// as a child subreaper, so the windows it double-forks stay its descendants: dropping it
/// kills them all, and nothing else is ever signalled.
final class SwaySession {
    static let uid: UInt32 = 65534
    static var available: Bool { FileSystem.exists("/usr/bin/sway") && FileSystem.exists("/usr/bin/foot") }
    static let missing: Comment = "sway and foot are not installed (apt-get install sway foot; make test-deps does)"

    let directory: String
    let runtime: String
    let process: Spawned
    private(set) var socket = ""
    var logPath: String { directory + "/sway.log" }

    /// With `cgroup`, sway starts in that cgroup (as a session's compositor runs in a unit).
    init(cgroup: String? = nil) throws {
        var template = Array("/tmp/bgtask-sway-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
        let directory = String(cString: made)
        self.directory = directory
        chmod(directory, 0o755)
        let runtime = directory + "/run"
        self.runtime = runtime
        try systemCall("mkdir(\(runtime))") { mkdir(runtime, 0o700) }
        try systemCall("chown(\(runtime))") { chown(runtime, Self.uid, Self.uid) }
        let config = directory + "/sway.conf", log = directory + "/sway.log"
        try writeFile(config, Array("output HEADLESS-1 resolution 1280x720\n".utf8))
        let subreaper = "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execvp(sys.argv[1], sys.argv[1:])"
        let command = Self.asUser + ["/usr/bin/python3", "-c", subreaper, "sway", "-c", config]
        let enter = cgroup.map { ["-c", "echo $$ > \($0)/cgroup.procs && exec \"$@\"", "sh", "/usr/bin/setpriv"] }
        process = try Spawned(enter == nil ? "/usr/bin/setpriv" : "/bin/sh", (enter ?? []) + command,
                              environment: Self.environment(runtime: runtime, socket: "")
                                  + ["WLR_BACKENDS=headless", "WLR_LIBINPUT_NO_DEVICES=1", "WLR_RENDERER=pixman"],
                              standardError: .file(log))
        try waitUntil("sway's IPC socket in \(runtime)", timeout: 15) {
            if process.hasExited { throw TestFailure("sway exited: \(String(decoding: (try? readFile(log)) ?? [], as: UTF8.self).suffix(600))") }
            guard let name = directoryEntries(runtime).first(where: { $0.hasPrefix("sway-ipc.") }) else { return false }
            socket = runtime + "/" + name
            return (try? msg("-t", "get_version")) != nil
        }
    }

    deinit {
        process.killTree()
        _ = try? process.wait(timeout: 5)
        _ = try? Spawned("/bin/rm", ["-rf", directory]).wait(timeout: 10)
    }

    static let asUser = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"]

    /// What the user's programs get: their runtime directory, the compositor's sockets.
    var environment: [String] { Self.environment(runtime: runtime, socket: socket) }

    static func environment(runtime: String, socket: String) -> [String] {
        ["PATH=/usr/bin:/bin", "HOME=\(runtime)", "XDG_RUNTIME_DIR=\(runtime)", "XDG_CACHE_HOME=\(runtime)",
         "XDG_CONFIG_HOME=\(runtime)/config", "LANG=C.UTF-8"] + (socket.isEmpty ? [] : ["SWAYSOCK=\(socket)", "WAYLAND_DISPLAY=wayland-1"])
    }

    /// Runs `arguments` as the user, with the session's environment; its output.
    @discardableResult
    func run(_ arguments: [String], environment extra: [String] = []) throws -> String {
        let process = try Spawned("/usr/bin/setpriv", Self.asUser + arguments, environment: environment + extra,
                                  standardError: .mergeIntoOutput)
        let output = try process.readAll(timeout: 10)
        guard try process.wait(timeout: 10) == 0 else { throw TestFailure("\(arguments.joined(separator: " ")): \(output)") }
        return output
    }

    /// `swaymsg ARGS`, failing unless sway says it succeeded.
    @discardableResult
    func msg(_ arguments: String...) throws -> String {
        let output = try run(["/usr/bin/swaymsg"] + arguments)
        if output.contains("\"success\": false") { throw TestFailure("swaymsg \(arguments.joined(separator: " ")): \(output)") }
        return output
    }

    func tree() throws -> JSON { try JSON.parse(try run(["/usr/bin/swaymsg", "-r", "-t", "get_tree"])) }

    /// Every window's pid, as sway's tree says.
    func windowPIDs() throws -> [Int32] {
        var pids: [Int32] = []
        func walk(_ node: JSON) {
            if let pid = node["pid"]?.intValue, (node["nodes"]?.arrayValue ?? []).isEmpty { pids.append(Int32(pid)) }
            for child in (node["nodes"]?.arrayValue ?? []) + (node["floating_nodes"]?.arrayValue ?? []) { walk(child) }
        }
        walk(try tree())
        return pids
    }

    /// Opens a foot window on `workspace` (which is shown then) running `command`, and
    /// returns foot's pid once its window is in the tree.
    func openFoot(on workspace: String, _ command: String = "sleep 86400") throws -> Int32 {
        try msg("workspace", workspace)
        let before = Set(try windowPIDs())
        try msg("exec", "foot \(command)")
        var pid: Int32 = 0
        try waitUntil("a new foot window on workspace \(workspace)", timeout: 15) {
            guard let new = try windowPIDs().first(where: { !before.contains($0) }) else { return false }
            pid = new
            return true
        }
        return pid
    }

    /// The session agent, as the user, on `daemon`'s socket with `settings` (`KEY=VALUE`).
    func agent(socket daemonSocket: String, _ settings: [String], log: String) throws -> Spawned {
        try Spawned("/usr/bin/setpriv", Self.asUser + [Binaries.path("bgtask-session"), "--socket", daemonSocket]
                        + settings.flatMap { ["--set", $0] },
                    environment: environment, standardError: .file(log))
    }
}

func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw Errno.current("open(\(path))") }
    let file = FileDescriptor(fd)
    defer { file.close() }
    try file.writeAll(bytes)
}

/// The names in `directory`, without `.` and `..`.
func directoryEntries(_ directory: String) -> [String] { ProcessTree.directoryNames(directory) }
