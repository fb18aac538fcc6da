// SPDX-License-Identifier: Apache-2.0
// Instructions per call: the daemon under callgrind, serving two numbers of Begin+End
// pairs; the difference divided by the calls in between is the cost of a call, start-up and
// shutdown cancelled out. User-space instructions only (callgrind does not see the kernel).
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

/// Measured at aec101f (before the state log was mapped and the reply path rewritten), the
/// same way: see README, Performance.
let instructionsPerCallBefore = 68_250

@MainActor func instructionCounts() throws {
    guard access("/usr/bin/valgrind", X_OK) == 0 else {
        say("instruction count skipped: valgrind is not installed (scripts/install-deps --bench)")
        results["instructions"] = .object(["skipped": .string("valgrind is not installed")])
        return
    }
    func total(pairs: Int) throws -> Int {
        let directory = try makeTemporaryDirectory(NSTemporaryDirectory() + "bgtaskd-bench-callgrind")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let socket = directory + "/io.bgtaskd"
        let daemon = try Child(["/usr/bin/valgrind", "--tool=callgrind", "--callgrind-out-file=\(directory)/out",
                                "--log-file=\(directory)/log", binaryDirectory + "/bgtaskd", "--socket", socket,
                                "--set", "GrantLatencyMinSec=0", "--set", "GrantLatencyMaxSec=0"], stderr: .file("/dev/null"))
        let giveUp = now() + 60_000_000_000
        while access(socket, F_OK) != 0 {
            if now() > giveUp { throw ClientError(.timedOut, "bgtaskd under valgrind did not start") }
            sleepUntil(now() + 20_000_000)  // valgrind start-up: poll the socket's appearance
        }
        let client = try RawClient(path: socket)
        for _ in 0..<pairs { try pair(client) }
        daemon.stop()
        let log = (try? String(contentsOfFile: directory + "/log", encoding: .utf8)) ?? ""
        guard let line = log.split(separator: "\n").first(where: { $0.contains("Collected :") }),
              let count = Int(line.split(separator: " ").last ?? "") else { throw ClientError(.protocolError, "no callgrind total") }
        return count
    }
    let few = 1000, many = 5000
    let perCall = (try total(pairs: many) - total(pairs: few)) / (2 * (many - few))
    results["instructions"] = .object(["perCall": .int(Int64(perCall)), "perCallBefore": .int(Int64(instructionsPerCallBefore))])
    row("instructions per call (callgrind, user space)", "\(perCall)", "before: \(instructionsPerCallBefore)",
        "×\(format(Double(perCall) / Double(instructionsPerCallBefore), 2)) of before")
}
