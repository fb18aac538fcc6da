// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// A project people may ship: its license on every file, help on every verb.
@Suite struct ProjectTests {
    static let verbs = ["status", "apps", "tasks", "history", "monitor", "background", "foreground", "terminate",
                        "expire", "policy", "wake", "reload", "run", "requests", "launch", "help"]

    /// Every file under Sources/, Tools/, libbgtask/, Tests/ and scripts/ starts with an SPDX
    /// line (after its `#!` line, if it has one); the fuzz corpus and the client vectors are
    /// data, not source, and the Wayland glue is wayland-scanner's, made at build time (the
    /// protocol's own license).
    @Test func everySourceFileNamesItsLicense() throws {
        let repository = SystemdTests.repository
        var offenders: [String] = []
        for top in ["Sources", "Tools", "libbgtask", "Tests", "scripts"] {
            let (code, output) = try SystemdTests.run(["/usr/bin/find", repository + "/" + top, "-type", "f",
                                                       "-not", "-path", "*/Tests/Fuzz/corpus/*",
                                                       "-not", "-path", "*/Tests/ClientVectors/*.json",
                                                       "-not", "-path", "*/Sources/CWayland/generated/*"])
            try #require(code == 0, "\(output)")
            for path in output.split(separator: "\n").map(String.init) {
                let text = String(decoding: (try? readFile(path)) ?? [], as: UTF8.self)
                var lines = text.split(separator: "\n", maxSplits: 2, omittingEmptySubsequences: false)
                if lines.first?.hasPrefix("#!") == true { lines.removeFirst() }
                if lines.first?.contains("SPDX-License-Identifier: Apache-2.0") != true {
                    offenders.append(String(path.dropFirst(repository.count + 1)))
                }
            }
        }
        #expect(offenders.isEmpty, "no SPDX line: \(offenders.sorted().joined(separator: ", "))")
        let license = String(decoding: try readFile(repository + "/LICENSE"), as: UTF8.self)
        #expect(license.contains("Apache License") && license.contains("Version 2.0, January 2004"))
    }

    /// `bgtaskctl VERB --help` and `bgtaskctl help VERB`: exit 0, the verb's own usage; an
    /// option the verb does not take: exit 2, with the usage.
    @Test(arguments: verbs) func everyVerbHasItsHelp(verb: String) throws {
        let ctl = Binaries.path("bgtaskctl")
        for arguments in [[verb, "--help"], [verb, "-h"], ["help", verb]] {
            let (code, output) = try SystemdTests.run([ctl] + arguments)
            #expect(code == 0 && output.contains("Usage: bgtaskctl") && output.contains("] \(verb)")
                    && output.contains("Example:"), "\(arguments): \(output)")
        }
        guard verb != "help" else { return }
        let (code, output) = try SystemdTests.run([ctl, verb, "--no-such-option"])
        #expect(code == 2 && output.contains("unknown option '--no-such-option'") && output.contains("Usage:"), "\(output)")
    }

    /// Every verb bgtaskctl runs (its table in main.swift) is this suite's, and is named by
    /// the usage (`bgtaskctl --help`), the bash completion, bgtaskctl(1) and the README's
    /// table of verbs. (The usage once left out `requests` and `launch`, the man page
    /// `policy` and `wake`.)
    @Test func everyVerbIsInTheUsageTheCompletionTheManPageAndTheReadme() throws {
        let repository = SystemdTests.repository
        let text = { (path: String) in String(decoding: try readFile(repository + "/" + path), as: UTF8.self) }
        // `"status": StatusVerb.run, …` in the table.
        let main = try text("Sources/bgtaskctl/main.swift")
        let start = try #require(main.range(of: "let verbs").flatMap { main.range(of: "= [", range: $0.upperBound..<main.endIndex) })
        let table = main[start.upperBound...].prefix { $0 != "]" }
        let run = Set(table.split(separator: "\"").enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) })
        #expect(run.union(["help"]) == Set(Self.verbs))
        let (_, usage) = try SystemdTests.run([Binaries.path("bgtaskctl"), "--help"])
        let listed = Set(usage.split(separator: "\n").compactMap { line -> String? in
            guard line.hasPrefix("  "), !line.hasPrefix("   ") else { return nil }
            return line.split(separator: " ").first.map(String.init)
        })
        let completion = try text("completion/bgtaskctl.bash")
        let completed = try #require(completion.split(separator: "\n").first { $0.contains("verbs=\"") })
        let completedVerbs = Set(completed.split(separator: "\"")[1].split(separator: " ").map(String.init))
        // Its requests for a font (`\fB`, `\fR`, `\fP`) are not words.
        let manLines = try text("man/bgtaskctl.1").split(separator: "\n").filter { $0.hasPrefix(".B") }.map { line in
            ["\\fB", "\\fI", "\\fR", "\\fP"].reduce(String(line)) { $0.replacing($1, with: " ") }
        }
        let readmeRows = try text("README.md").split(separator: "\n").filter { $0.hasPrefix("| `") }
        for verb in Self.verbs {
            #expect(listed.contains(verb), "bgtaskctl --help does not list \(verb)")
            #expect(completedVerbs.contains(verb), "the completion does not offer \(verb)")
            #expect(manLines.contains { line in
                line.split(whereSeparator: { !$0.isLetter }).contains { $0 == verb }
            }, "bgtaskctl(1) does not describe \(verb)")
            #expect(readmeRows.contains { $0.contains("`\(verb)`") || $0.contains("`\(verb) ") }, "the README's table does not list \(verb)")
        }
    }

    @Test func theDaemonHasItsHelp() throws {
        for flag in ["-h", "--help"] {
            let (code, output) = try SystemdTests.run([Binaries.path("bgtaskd"), flag])
            #expect(code == 0 && output.contains("Usage: bgtaskd"), "\(output)")
        }
        let (code, _) = try SystemdTests.run([Binaries.path("bgtaskd"), "--no-such-option"])
        #expect(code == 2)
    }
}
