// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Foundation
import Glibc
import Testing
import TestSupport
import Varlink

/// libbgtask from the outside: installed with `make install-lib` into a fresh prefix, the C
/// example built against it with `cc $(pkg-config --cflags --libs bgtask)`, the Python
/// example loading it with ctypes, both through the whole background cycle against a real
/// daemon, checked in /proc.
@Suite(.serialized) struct CLibraryTests {
    static let repository = SystemdTests.repository
    static let haveCompiler = access("/usr/bin/cc", X_OK) == 0 && access("/usr/bin/pkg-config", X_OK) == 0
        && access("/usr/bin/make", X_OK) == 0

    /// `make lib install-lib PREFIX=<fresh>`; the prefix.
    static func installed() throws -> String {
        var template = Array("/tmp/bgtask-lib-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
        let prefix = String(cString: made)
        let (code, output) = try SystemdTests.run(["/usr/bin/make", "-s", "-C", repository, "lib", "install-lib", "PREFIX=\(prefix)"],
                                                  timeout: 120)
        guard code == 0 else { throw TestFailure("make install-lib failed: \(output)") }
        return prefix
    }

    /// The C example, built the way its comment says, against the library in `prefix`.
    static func buildExample(_ prefix: String) throws -> String {
        let binary = prefix + "/bgtask-example"
        let command = "cc -o \(binary) \(repository)/examples/bgtask-example.c $(pkg-config --cflags --libs bgtask)"
        let (code, output) = try SystemdTests.run(["/bin/sh", "-c", command],
                                                  environment: ["PATH=/usr/bin:/bin", "PKG_CONFIG_PATH=\(prefix)/lib/pkgconfig"])
        guard code == 0 else { throw TestFailure("building the example failed: \(output)") }
        return binary
    }

    /// Reads lines until one contains `text`; returns them all.
    static func lines(_ app: Spawned, until text: String, timeout: Double = 10) throws -> [String] {
        var seen: [String] = []
        let giveUp = Date().addingTimeInterval(timeout)
        while Date() < giveUp {
            guard let line = try app.readLine(timeout: giveUp.timeIntervalSinceNow) else { break }
            seen.append(line)
            if line.contains(text) { return seen }
        }
        throw TestFailure("no line with '\(text)' within \(timeout)s; got \(seen)")
    }

    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func onlyTheAPIIsExported() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let (code, output) = try SystemdTests.run(["/usr/bin/nm", "-D", "--defined-only", prefix + "/lib/libbgtask.so.0"])
        #expect(code == 0)
        let names = output.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) }
        #expect(names.count == 22, "\(names)")
        // Every function is bgtask_*, at the version LIBBGTASK_0, or LIBBGTASK_0.1 for scheduled
        // work (added later: the version nodes themselves are the two other names nm lists).
        let scheduling: Set = ["bgtask_app_set_launch_handler", "bgtask_submit", "bgtask_cancel_request", "bgtask_set_task_completed"]
        #expect(names.allSatisfy { name in
            let function = String(name.prefix { $0 != "@" })
            return name == "LIBBGTASK_0" || name == "LIBBGTASK_0.1"
                || name == function + (scheduling.contains(function) ? "@@LIBBGTASK_0.1" : "@@LIBBGTASK_0")
        }, "\(names)")
        let (_, header) = try SystemdTests.run(["/usr/bin/readelf", "-d", prefix + "/lib/libbgtask.so.0"])
        #expect(header.contains("Library soname: [libbgtask.so.0]"))
    }

    /// Scheduled work in C: the example submits a refresh, is suspended, woken for its
    /// launch, completes it and is suspended again.
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func theScheduledExampleIsLaunchedAndSuspendedAgain() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let binary = prefix + "/bgtask-scheduled"
        let command = "cc -Wall -Werror -o \(binary) \(Self.repository)/examples/bgtask-scheduled.c $(pkg-config --cflags --libs bgtask)"
        let (built, output) = try SystemdTests.run(["/bin/sh", "-c", command],
                                                   environment: ["PATH=/usr/bin:/bin", "PKG_CONFIG_PATH=\(prefix)/lib/pkgconfig"])
        try #require(built == 0, "\(output)")
        let daemon = try TestDaemon(["CoalesceWindowSec=0"])
        let app = try Spawned(binary, ["1"], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)", "LD_LIBRARY_PATH=\(prefix)/lib"])
        _ = try Self.lines(app, until: "submitted a refresh in 1s: ok")
        try daemon.setState(app.pid, "background")
        try waitUntil("suspended") { try daemon.app(app.pid)?["state"] == "suspended" }
        let seen = try Self.lines(app, until: "submitted a refresh in 1s: ok")  // the next one, then completed
        #expect(seen.contains { $0.hasPrefix("launched org.example.refresh (refresh, task ") }, "\(seen)")
        try waitUntil("suspended again") {
            try daemon.history().filter { $0["pid"]?.intValue == Int64(app.pid) && $0["action"] == "suspended" }.count == 2
        }
        #expect(try daemon.history().contains { $0["action"] == "woken" && $0["reason"] == "launch" })
    }

    /// The C library's rule for the socket, as the Swift one's (`ClientsEndToEndTests`): with
    /// no `$BGTASKD_SOCKET`, the per-user socket where a daemon answers.
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func theCLibraryFindsThePerUserDaemonThatAnswers() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let example = try Self.buildExample(prefix)
        let daemon = try TestDaemon()
        let runtime = daemon.directory + "/runtime"
        try systemCall("mkdir") { mkdir(runtime, 0o700) }
        try systemCall("symlink") { symlink(daemon.directory, runtime + "/bgtaskd") }
        let app = try Spawned(example, [], environment: ["XDG_RUNTIME_DIR=\(runtime)", "LD_LIBRARY_PATH=\(prefix)/lib"])
        _ = try Self.lines(app, until: "running in the foreground")
        #expect(try daemon.app(app.pid)?["state"] == "foreground")
        // A daemon there that runs as another user (uid 65534's, as root's inherited
        // XDG_RUNTIME_DIR would name): not taken; the system socket is (where none answers, the
        // example says it cannot reach bgtaskd). bgtask_app_new subscribes before it returns.
        guard getuid() == 0 else { return }
        let directory = try temporaryDirectory("bgtaskd-users")
        try systemCall("chown") { chown(directory, 65534, 65534) }
        let nobodys = try TestDaemon(directory: directory, wrapper: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        let theirs = try temporaryDirectory("bgtaskd-runtime")
        try systemCall("symlink") { symlink(directory, theirs + "/bgtaskd") }
        let roots = try Spawned(example, [], environment: ["XDG_RUNTIME_DIR=\(theirs)", "LD_LIBRARY_PATH=\(prefix)/lib"],
                                standardError: .mergeIntoOutput)
        let first = try #require(try roots.readLine(timeout: 10))
        #expect(first.contains("running in the foreground") || first.contains("cannot reach bgtaskd"), "\(first)")
        #expect(try nobodys.app(roots.pid) == nil)
    }

    /// Begin in did_enter_background, the expiration handler once, end, suspended; back in
    /// the foreground it runs again.
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func theCExampleGoesThroughTheWholeCycle() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let example = try Self.buildExample(prefix)
        let daemon = try TestDaemon(["BackgroundTimeSec=2s", "ExpirationWarningSec=1s", "GrantLatencyMaxSec=50ms"])
        let app = try Spawned(example, [], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)",
                                                         "LD_LIBRARY_PATH=\(prefix)/lib"])
        _ = try Self.lines(app, until: "running in the foreground")
        try daemon.setState(app.pid, "background")
        var seen = try Self.lines(app, until: "began background task")
        seen += try Self.lines(app, until: "expiration handler")
        #expect(seen.last?.contains("expiration handler: task 1, reason 1") == true, "\(seen)")  // EXPIRING
        // Ending its last task suspends the app at once: the end's reply waits for the
        // foreground (iOS does the same).
        try waitUntil("the example suspended") { processState(app.pid) == "T" }
        try daemon.setState(app.pid, "foreground")
        seen += try Self.lines(app, until: "back in the foreground")
        try waitUntil("the example running again") { processState(app.pid) != "T" }
        #expect(seen.contains("ended task 1: ok"), "\(seen)")
        #expect(seen.filter { $0.contains("expiration handler") }.count == 1, "\(seen)")
    }

    /// The daemon is killed and restarted while the app holds its task: the library
    /// reconnects, the task goes on (the daemon kept it), and its expiration still runs once.
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func theCLibraryReconnectsAndKeepsItsTask() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let example = try Self.buildExample(prefix)
        let settings = ["BackgroundTimeSec=4s", "ExpirationWarningSec=1s", "GrantLatencyMaxSec=50ms"]
        let daemon = try TestDaemon(settings)
        let app = try Spawned(example, [], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)",
                                                         "LD_LIBRARY_PATH=\(prefix)/lib"])
        _ = try Self.lines(app, until: "running in the foreground")
        try daemon.setState(app.pid, "background")
        var seen = try Self.lines(app, until: "began background task 1")
        // Granted, and the transition finished: a restart denies what is still pending, as
        // when the subscriber leaves mid-transition (see Restarts lose nothing).
        try waitUntil("the task granted") {
            try daemon.manager("ListTasks")["tasks"]?.arrayValue?.first?["state"] == "granted"
        }
        try daemon.crash()
        let restarted = try daemon.restart(settings)
        try waitUntil("the task still held after the restart") {
            try restarted.manager("ListTasks")["tasks"]?.arrayValue?.count == 1
        }
        seen += try Self.lines(app, until: "expiration handler", timeout: 10)
        #expect(seen.last?.contains("expiration handler: task 1, reason 1") == true, "\(seen)")
        try waitUntil("the example suspended") { processState(app.pid) == "T" }
        try restarted.setState(app.pid, "foreground")
        seen += try Self.lines(app, until: "ended task 1: ok")
    }

    /// Rule 7a across a restart, through the C library: the daemon is killed before the app's
    /// warning (0.5 s into its background time) and started again after its deadline (2.3 s);
    /// the app is warned a second after the restart with its whole warning, its handler ends the task,
    /// and it is suspended (before: terminated at the restart, unwarned).
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func theCLibraryIsWarnedByADaemonBackAfterItsDeadline() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let example = try Self.buildExample(prefix)
        let settings = ["BackgroundTimeSec=2s", "ExpirationWarningSec=1500ms", "GrantLatencyMinSec=0", "GrantLatencyMaxSec=0"]
        let daemon = try TestDaemon(settings)
        let app = try Spawned(example, [], environment: ["BGTASKD_SOCKET=\(daemon.socketPath)",
                                                         "LD_LIBRARY_PATH=\(prefix)/lib"])
        _ = try Self.lines(app, until: "running in the foreground")
        try daemon.setState(app.pid, "background")
        let backgrounded = Clock.monotonicNanoseconds()
        var seen = try Self.lines(app, until: "began background task 1")
        try waitUntil("the task granted") {
            try daemon.manager("ListTasks")["tasks"]?.arrayValue?.first?["state"] == "granted"
        }
        try daemon.crash()
        #expect(Clock.monotonicNanoseconds() - backgrounded < 400_000_000, "the daemon outlived the app's warning")
        waitForInstant(backgrounded + 2_300_000_000)
        let restarted = try daemon.restart(settings)
        seen += try Self.lines(app, until: "expiration handler", timeout: 10)
        #expect(seen.last?.contains("expiration handler: task 1, reason 1") == true, "\(seen)")  // EXPIRING
        try waitUntil("the example suspended") { processState(app.pid) == "T" }
        #expect(try restarted.history().last?["reason"] == "tasksEnded")
        try restarted.setState(app.pid, "foreground")
        seen += try Self.lines(app, until: "ended task 1: ok")
    }

    /// The Python example: ctypes on the installed libbgtask.so.0, the same cycle.
    @Test(.enabled(if: haveCompiler && access("/usr/bin/python3", X_OK) == 0, "needs cc, make and python3"))
    func thePythonExampleGoesThroughTheWholeCycle() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let daemon = try TestDaemon(["BackgroundTimeSec=2s", "ExpirationWarningSec=1s", "GrantLatencyMaxSec=50ms"])
        let app = try Spawned("/usr/bin/python3", [Self.repository + "/examples/bgtask_example.py"],
                              environment: ["BGTASKD_SOCKET=\(daemon.socketPath)", "BGTASK_LIBRARY=\(prefix)/lib/libbgtask.so.0"],
                              standardError: .mergeIntoOutput)
        _ = try Self.lines(app, until: "running in the foreground")
        try daemon.setState(app.pid, "background")
        var seen = try Self.lines(app, until: "began background task")
        seen += try Self.lines(app, until: "expiration handler")
        #expect(seen.last?.contains("expiration handler: task 1, reason 1") == true, "\(seen)")
        try waitUntil("the Python example suspended") { processState(app.pid) == "T" }
        try daemon.setState(app.pid, "foreground")
        seen += try Self.lines(app, until: "back in the foreground")
        #expect(seen.contains("ended task 1: 0"), "\(seen)")
    }

    /// No daemon: bgtask_app_new says so with an errno, it does not hang or crash.
    @Test(.enabled(if: haveCompiler, "needs cc, pkg-config and make"))
    func withoutADaemonTheAppIsToldWhy() throws {
        let prefix = try Self.installed()
        defer { try? FileManager.default.removeItem(atPath: prefix) }
        let example = try Self.buildExample(prefix)
        let app = try Spawned(example, [], environment: ["BGTASKD_SOCKET=/nonexistent/io.bgtaskd", "LD_LIBRARY_PATH=\(prefix)/lib"],
                              standardError: .mergeIntoOutput)
        let output = try app.readAll(timeout: 10)
        #expect(output.contains("cannot reach bgtaskd: No such file or directory"), "\(output)")
        #expect(Spawned.exitCode(try app.wait(timeout: 5)) == 1)
    }
}
