// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// The client vectors (Tests/ClientVectors) against libbgtask's rules: Tests/libbgtask/vectors.c
/// linked with bgtask-state.c and json.c alone (no I/O file: the rules are pure), under ASan
/// and UBSan. BGTaskClientTests' ClientVectorTests runs the same files against the Swift
/// library.
@Suite struct ClientVectorCTests {
    @Test(.enabled(if: CLibraryHostilePeerTests.haveCompiler, "needs cc"))
    func everyVectorPassesAgainstLibbgtask() throws {
        var template = Array("/tmp/bgtask-vectors-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
        let directory = String(cString: made)
        defer { _ = try? SystemdTests.run(["/bin/rm", "-rf", directory]) }
        let repository = CLibraryTests.repository
        let binary = directory + "/vectors"
        let sources = ["Tests/libbgtask/vectors.c", "libbgtask/bgtask-state.c", "libbgtask/json.c"].map { repository + "/" + $0 }
        let (built, buildOutput) = try SystemdTests.run(["/usr/bin/cc", "-std=c11", "-g", "-O1", "-Wall", "-Werror",
                                                          "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                                                          "-I" + repository + "/libbgtask"] + sources + ["-lm", "-o", binary],
                                                         timeout: 120)
        try #require(built == 0, "bgtask-state.c must link without the I/O file: \(buildOutput)")
        let vectors = directoryEntries(repository + "/Tests/ClientVectors").filter { $0.hasSuffix(".json") }.sorted()
        try #require(vectors.count >= 10)
        let (code, output) = try SystemdTests.run([binary] + vectors.map { repository + "/Tests/ClientVectors/" + $0 }, timeout: 60)
        #expect(code == 0, "\(output)")
        #expect(output.contains("\(vectors.count) of \(vectors.count) vectors passed"), "\(output)")
    }
}
