// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// The shipped units, checked by systemd's own tools and run under a real systemd.
@Suite(.serialized) struct SystemdTests {
    static let repository: String = {
        let file = #filePath
        var parts = file.split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(3)  // Tests/EndToEndTests/SystemdTests.swift
        return parts.joined(separator: "/")
    }()

    static let releaseBuilt = access(repository + "/.build/release/bgtaskd", X_OK) == 0
    static let canBootSystemd = getuid() == 0 && access("/usr/bin/systemd-nspawn", X_OK) == 0
        && access("/lib/systemd/systemd", X_OK) == 0
    static let haveAnalyze = access("/usr/bin/systemd-analyze", X_OK) == 0 && access("/usr/bin/man", X_OK) == 0

    /// Runs a command to completion; returns (exit code, stdout and stderr).
    static func run(_ arguments: [String], environment: [String]? = nil, timeout: Double = 60) throws -> (Int32, String) {
        let process = try Spawned(arguments[0], Array(arguments.dropFirst()), environment: environment,
                                  standardError: .mergeIntoOutput)
        process.closeInput()
        let output = try process.readAll(timeout: timeout)
        return (Spawned.exitCode(try process.wait(timeout: timeout)) ?? -1, output)
    }

    /// `make install-files` into a fresh prefix (units then name real binaries there).
    static func installedPrefix() throws -> String {
        let prefix = try temporaryDirectory("bgtaskd-prefix")
        let (code, output) = try run(["/usr/bin/make", "-s", "-C", repository, "install-files", "PREFIX=\(prefix)",
                                      "SYSCONFDIR=\(prefix)/etc"])
        guard code == 0 else { throw TestFailure("make install-files failed: \(output)") }
        return prefix
    }

    /// What a service manager hears (`sd_notify(3)`), without one: `READY=1`, then
    /// `WATCHDOG=1` from the loop at about half of `WATCHDOG_USEC` while it serves calls
    /// (sd-event, which sends them, is turned only when its own descriptor is ready).
    @Test func theLoopPingsTheWatchdogWhileItServes() throws {
        let notify = try NotifyListener()
        let daemon = try TestDaemon(environment: ["NOTIFY_SOCKET=\(notify.path)", "WATCHDOG_USEC=200000"])
        let app = try daemon.connect()
        var messages: [String] = []
        let deadline = Clock.monotonicNanoseconds() + 5_000_000_000
        while messages.filter({ $0.contains("WATCHDOG=1") }).count < 6, Clock.monotonicNanoseconds() < deadline {
            _ = try app.call("io.bgtaskd.App.GetTimeRemaining")  // the loop busy between pings
            messages += try notify.messages()
        }
        // (sd-event pings once when the watchdog is enabled, before READY=1.)
        let ready = try #require(messages.firstIndex { $0.hasPrefix("READY=1") }, "\(messages)")
        #expect(messages[ready...].filter { $0.contains("WATCHDOG=1") }.count >= 4, "\(messages)")
    }

    /// `STATUS=` follows what changed, and only that: once the counts it shows are sent, the
    /// daemon sleeps with nothing timed (the status wait's own pass used to schedule the next
    /// one: its timer was armed again 250 ms on at every wake-up, 4 a second, for ever, under
    /// a service manager once a call had been served).
    @Test func statusFollowsTheCountsAndThenTheDaemonSleeps() throws {
        let notify = try NotifyListener()
        let daemon = try TestDaemon(environment: ["NOTIFY_SOCKET=\(notify.path)"])
        func awaitStatus(_ text: String) throws {
            try waitUntil("STATUS= saying \(text)") { try notify.messages().contains { $0.contains("STATUS=\(text)") } }
        }
        let probe = try daemon.probe()
        try probe.call("remaining")  // an app: the counts change
        try awaitStatus("1 apps")
        try probe.send("exit 0")  // and back, so that no app's process events wake the daemon below
        try awaitStatus("0 apps")
        try waitUntil("the daemon asleep with no timer armed") { try Self.asleepWithNothingTimed(daemon.process.pid) }
    }

    /// Whether `pid` was seen asleep (`S`), its timerfds all disarmed (`it_value: (0, 0)` in
    /// `/proc/PID/fdinfo`), without a wake-up in between (the same voluntary context switches
    /// before and after). A daemon that re-arms its timer at every wake-up is never seen so:
    /// asleep, its timer is armed; between the expiry and the re-arm it is awake.
    static func asleepWithNothingTimed(_ pid: Int32) throws -> Bool {
        let switches = try voluntarySwitches(of: pid)
        guard try ProcStat.read(pid: pid).state == "S" else { return false }
        for entry in ProcessTree.directoryNames("/proc/\(pid)/fdinfo") {
            let text = String(decoding: (try? readFile("/proc/\(pid)/fdinfo/\(entry)")) ?? [], as: UTF8.self)
            if let value = text.split(separator: "\n").first(where: { $0.hasPrefix("it_value:") }),
               !value.hasSuffix("(0, 0)") { return false }
        }
        return try ProcStat.read(pid: pid).state == "S" && voluntarySwitches(of: pid) == switches
    }

    @Test(.enabled(if: releaseBuilt && haveAnalyze, "needs make release, systemd-analyze and man (make check does both)"))
    func unitsVerifyWithoutAWord() throws {
        let prefix = try Self.installedPrefix()
        defer { _ = try? Self.run(["/bin/rm", "-rf", prefix]) }
        var runtime = Array("/tmp/bgtaskd-xdg-XXXXXX".utf8CString)
        let xdg = String(cString: mkdtemp(&runtime)!)
        defer { removeTree(xdg) }  // with what systemd-analyze made in it
        let environment = ["PATH=/usr/bin:/bin", "MANPATH=\(prefix)/share/man", "XDG_RUNTIME_DIR=\(xdg)"]
        let system = try Self.run(["/usr/bin/systemd-analyze", "verify", prefix + "/lib/systemd/system/bgtaskd.socket",
                                   prefix + "/lib/systemd/system/bgtaskd.service"], environment: environment)
        #expect(system.0 == 0 && system.1.isEmpty, "systemd-analyze verify said: \(system.1)")
        let user = try Self.run(["/usr/bin/systemd-analyze", "verify", "--user", prefix + "/lib/systemd/user/bgtaskd.socket",
                                 prefix + "/lib/systemd/user/bgtaskd.service"], environment: environment)
        #expect(user.0 == 0 && user.1.isEmpty, "systemd-analyze verify --user said: \(user.1)")
    }

    @Test(.enabled(if: releaseBuilt && haveAnalyze, "needs make release and systemd-analyze (make check does both)"))
    func securityExposureIsAtMostTwo() throws {
        let prefix = try Self.installedPrefix()
        defer { _ = try? Self.run(["/bin/rm", "-rf", prefix]) }
        // The user units too (8.4 and 8.5 before they were sandboxed); offline, a user
        // manager's analysis wants a runtime directory.
        let runtime = try temporaryDirectory("bgtaskd-analyze")
        defer { removeTree(runtime) }
        for (unit, user) in [("system/bgtaskd.service", false), ("user/bgtaskd.service", true), ("user/bgtask-session.service", true)] {
            let (_, output) = try Self.run(["/usr/bin/systemd-analyze"] + (user ? ["--user"] : []) + ["security", "--offline=true", "--no-pager",
                                            prefix + "/lib/systemd/" + unit], environment: ["XDG_RUNTIME_DIR=\(runtime)", "PATH=/usr/bin:/bin"])
            let line = try #require(output.split(separator: "\n").first { $0.contains("Overall exposure level") }, "\(output)")
            let words = line.split(separator: " ")
            let index = try #require(words.firstIndex { $0.hasSuffix(".service:") })
            let exposure = try #require(Double(words[index + 1]))
            #expect(exposure <= 2.0, "\(unit): \(line)")
        }
    }

    static let containerChecks = [
        "not-running-before-first-client", "ctl-status-activates", "running-after-first-client", "status-line",
        "reload-keeps-clients", "reload-applies-background-time", "monitor-still-served-after-reload",
        "bad-reload-refused", "journal-fields", "watchdog-restart", "ctl-status-after-restart", "watchdog-logged",
        "restart-keeps-state", "resumed-after-restart", "task-ended-after-restart",
        "scope-frozen-by-unit", "scope-listed-as-unit", "slice-thaw-frozen-again", "unit-refusals", "scope-terminated-whole",
        "frozen-scope-stops",
        "process-app-isolated-in-scope", "isolated-app-frozen-whole", "isolated-app-terminated-whole",
        "unit-started-again-outlives-the-grace", "idle-inhibited-while-in-background", "idle-released-after-the-linger",
    ]

    /// Socket activation, STATUS=, reload, watchdog, restart without loss, journal fields and bgtaskctl under
    /// systemd 252 in a container (Tests/systemd/checks.sh says how each is checked).
    @Test(.enabled(if: releaseBuilt && canBootSystemd, "needs root, systemd-nspawn and make release"))
    func underARealSystemd() throws {
        let (code, output) = try Self.run(["/bin/bash", Self.repository + "/Tests/systemd/container-test.sh"], timeout: 200)
        let lines = output.split(separator: "\n").map(String.init)
        for check in Self.containerChecks {
            #expect(lines.contains("ok \(check)"), "\(check): \(lines.first { $0.contains(" \(check)") } ?? "missing")")
        }
        #expect(code == 0 && lines.last == "done", "\(output)")
    }
}

/// A service manager's notification socket (`NOTIFY_SOCKET`), without one: a datagram socket
/// in a directory of its own, removed with it.
final class NotifyListener {
    let directory: String
    let socket: FileDescriptor
    var path: String { directory + "/notify" }

    init() throws {
        directory = try temporaryDirectory("bgtaskd-notify")
        socket = try UnixSocket.bindDatagram(path: directory + "/notify")
    }

    deinit {
        unlink(path)
        rmdir(directory)
    }

    /// The messages that arrive within `milliseconds` of each other, each whole.
    func messages(waitingMilliseconds milliseconds: Int32 = 10) throws -> [String] {
        var messages: [String] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while try socket.waitReadable(timeoutMilliseconds: milliseconds) {
            let count = recv(socket.rawValue, &buffer, buffer.count, 0)
            if count > 0 { messages.append(String(decoding: buffer[..<count], as: UTF8.self)) }
        }
        return messages
    }
}
