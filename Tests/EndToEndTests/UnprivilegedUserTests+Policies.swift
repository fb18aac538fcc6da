// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Finding 9 of the second review: policies claimed by spoofing what they match.
extension UnprivilegedUserTests {
    /// Whether uid 65534 may make a user and mount namespace here (`unshare -Urm`).
    static let userNamespaces: Bool = {
        (try? SystemdTests.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "/usr/bin/unshare", "-Urm", "true"]))?.0 == 0
    }()

    /// In `unshare -Urm`, uid 65534 bind-mounted python over `/usr/bin/sleep`: root read
    /// `/proc/PID/exe` as `/usr/bin/sleep` and an `Exempt=yes` policy for sleep matched. Now
    /// the path must name the very file the process runs.
    @Test(.enabled(if: userNamespaces, "uid 65534 cannot unshare a user namespace here: nothing to spoof with"))
    func anExecutableSeenThroughAnotherMountNamespaceClaimsNoPolicy() throws {
        let files = try PolicyEndToEndTests.sleepExempt()
        let daemon = try TestDaemon(["BackgroundTimeSec=1s"], extraArguments: ["--config", files.main])
        let genuine = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/sleep", "600"])
        let script = "import os, signal, socket, sys; print(os.getpid(), flush=True); signal.pause()"
        let spoof = try Spawned("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/unshare", "-Urm",
                                                    "/bin/sh", "-c", "mount --bind /usr/bin/python3 /usr/bin/sleep && exec /usr/bin/sleep -c \"$0\"",
                                                    script])
        let line = try #require(try spoof.readLine(timeout: 10))
        let spoofPID = try #require(Int32(line))
        var link = [CChar](repeating: 0, count: 256)
        let length = readlink("/proc/\(spoofPID)/exe", &link, 255)
        // What the kernel's link says.
        #expect(String(decoding: link.prefix(max(0, length)).map { UInt8(bitPattern: $0) }, as: UTF8.self) == "/usr/bin/sleep")
        try waitUntil("the genuine sleep runs as 65534") { (try? ProcStatus.uids(pid: genuine.pid))?.real == 65534 }
        for pid in [genuine.pid, spoofPID] {
            #expect(try daemon.ctl(["foreground", String(pid)], asUser: 65534).0 == 0)
        }
        #expect(try daemon.app(genuine.pid)?["policy"] == "50-sleep")
        #expect(try daemon.app(spoofPID)?["policy"] == .null)
        #expect(try daemon.app(spoofPID)?["exempt"] == false)
    }
}
