// SPDX-License-Identifier: Apache-2.0
// The peer, side by side: logind's inhibitor locks against bgtaskd's tasks, both in the same
// systemd 252 container, everything pinned to one CPU (scripts/bench-logind). Beside them the
// floor of bgtaskd's side: the same client against the echo server, which does no work, so
// that logind's figure over it is the most any daemon could show here with this client.
import BGTaskSystem
import Foundation
import Varlink

@MainActor func logindComparison(pairs: Int) throws {
    let count = min(pairs, 5000)
    guard getuid() == 0, access("/usr/bin/systemd-nspawn", X_OK) == 0 else {
        say("logind comparison skipped: it boots systemd in systemd-nspawn, which needs root and systemd-container")
        results["logind"] = .object(["skipped": .string("needs root and systemd-nspawn")])
        return
    }
    let out = try makeTemporaryDirectory(NSTemporaryDirectory() + "bgtaskd-bench-logind")
    defer { try? FileManager.default.removeItem(atPath: out) }
    // The repository the binaries were built in: .build/<triple>/release is below it.
    var root = URL(fileURLWithPath: binaryDirectory).resolvingSymlinksInPath()
    while root.path != "/", !FileManager.default.fileExists(atPath: root.appendingPathComponent("Package.swift").path) {
        root.deleteLastPathComponent()
    }
    let script = root.appendingPathComponent("scripts/bench-logind").path
    let child = try Child(["/bin/bash", script, String(count), out], stdout: .file("/dev/null"))
    let status = try Subprocess.wait(pid: child.pid) ?? -1
    func samples(_ name: String) -> [Double] {
        ((try? String(contentsOfFile: out + "/" + name, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { Double($0) }
    }
    let ours = Summary(samples("bgtaskd")), floor = Summary(samples("echo")), theirs = Summary(samples("logind"))
    guard status == 0, ours.count > 0, floor.count > 0, theirs.count > 0 else {
        say("logind comparison failed: scripts/bench-logind exited \(Subprocess.exitCode(status))")
        results["logind"] = .object(["failed": .string("scripts/bench-logind exited \(Subprocess.exitCode(status))")])
        return
    }
    results["logind"] = .object(["bgtaskd": ours.json, "logind": theirs.json, "echo": floor.json,
                                 "speedupP50": .double(theirs.p50 / ours.p50), "floorSpeedupP50": .double(theirs.p50 / floor.p50)])
    row("in nspawn, pinned: bgtaskd Begin+End (µs)", "\(ours)",
        "logind Inhibit+close+call \(theirs); the echo (floor) p50 \(format(floor.p50, 1)), logind ×\(format(theirs.p50 / floor.p50, 2)) of it",
        "faster at p50 " + check(theirs.p50 / ours.p50, "≥", 15, key: "logindSpeedupP50"))
}
