// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc

/// A process of uid 65534 that becomes root when told: a setuid-root copy of python3 and a
/// FIFO in `directory` (the caller's, which uid 65534 must be able to reach). `program`
/// (python3's `-c` text) blocks on the FIFO — run it under a stopped app to have it continued
/// by someone else first — then execs the copy, which takes uid 0, prints its pid and waits
/// for a signal. `release()` sends it the byte it waits for; `remove()` removes both files.
public struct BecomingRoot {
    public let program: String
    let helper: String
    let fifo: String

    public init(in directory: String) throws {
        let helper = directory + "/rootpython", fifo = directory + "/go"
        (self.helper, self.fifo) = (helper, fifo)
        let python = try readFile("/usr/bin/python3", limit: 1 << 30)  // the bytes: it is a symbolic link
        let copy = try FileDescriptor(systemCall("open(\(helper))") { open(helper, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o755) })
        try copy.writeAll(python)
        copy.close()
        try systemCall("chmod(\(helper))") { chmod(helper, 0o4755) }
        try systemCall("mkfifo(\(fifo))") { mkfifo(fifo, 0o666) }
        program = """
            import os
            open("\(fifo)", "rb").read(1)
            os.execv("\(helper)", ["rootpython", "-c", "import os, signal; os.setresuid(0, 0, 0); print(os.getpid(), flush=True); signal.pause()"])
            """
    }

    /// Writes the byte, once the program has the FIFO open (`ENXIO` until a reader has).
    public func release() throws {
        var writer: Int32 = -1
        try waitUntil("the program reading the FIFO") {
            writer = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            return writer >= 0
        }
        defer { Glibc.close(writer) }
        var byte: UInt8 = 1
        guard write(writer, &byte, 1) == 1 else { throw Errno.current("write(\(fifo))") }
    }

    public func remove() {
        unlink(helper)
        unlink(fifo)
    }
}
