// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport

/// Finding 11 of the second review: libbgtask against a broken or hostile peer, and in an
/// app whose locale writes `5,0`. Tests/libbgtask/hostile_peer_test.c, built with ASan and
/// UBSan against the library's sources, plays the daemon itself; LeakSanitizer fails the run
/// on any leak. The locale is made for the test with `localedef` (LOCPATH), so no system
/// locale need be installed.
@Suite struct CLibraryHostilePeerTests {
    static let haveCompiler = access("/usr/bin/cc", X_OK) == 0

    @Test(.enabled(if: haveCompiler, "needs cc"))
    func aBrokenPeerLeaksNothingSpinsNeverAndALocaleChangesNoNumber() throws {
        var template = Array("/tmp/bgtask-peer-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw Errno.current("mkdtemp") }
        let directory = String(cString: made)
        defer { _ = try? SystemdTests.run(["/bin/rm", "-rf", directory]) }
        let repository = CLibraryTests.repository
        let binary = directory + "/hostile_peer_test"
        let sources = ["Tests/libbgtask/hostile_peer_test.c", "libbgtask/bgtask.c", "libbgtask/bgtask-io.c",
                       "libbgtask/bgtask-state.c", "libbgtask/json.c"].map { repository + "/" + $0 }
        let (built, buildOutput) = try SystemdTests.run(["/usr/bin/cc", "-std=c11", "-g", "-O1", "-fsanitize=address,undefined",
                                                          "-fno-sanitize-recover=undefined", "-I" + repository + "/libbgtask"]
                                                         + sources + ["-lm", "-Wl,--wrap=recv,--wrap=timerfd_settime", "-o", binary],
                                                         timeout: 120)
        try #require(built == 0, "\(buildOutput)")
        // A locale whose decimal point is a comma, as every GTK or Qt app in Germany has.
        let (localeMade, _) = try SystemdTests.run(["/usr/bin/localedef", "-i", "de_DE", "-f", "UTF-8",
                                                    directory + "/de_DE.UTF-8"], timeout: 60)
        let (code, output) = try SystemdTests.run([binary, directory],
                                                  environment: ["LOCPATH=\(directory)", "LC_ALL=de_DE.UTF-8", "PATH=/usr/bin:/bin"],
                                                  timeout: 120)
        let lines = output.split(separator: "\n").map(String.init)
        for check in ["extra-message-is-out-of-step", "end-mid-reply-is-an-error", "a-reply-is-one-read",
                      "timer-set-only-when-its-deadline-changes"] {
            #expect(lines.contains("ok \(check)"), "\(check): \(output)")
        }
        if localeMade == 0 {
            #expect(lines.contains("ok numbers-in-a-comma-locale"), "\(output)")
        } else {
            print("numbers-in-a-comma-locale not checked: localedef could not make de_DE.UTF-8 (package locales missing)")
        }
        #expect(code == 0 && !output.contains("LeakSanitizer"), "\(output)")
    }
}
