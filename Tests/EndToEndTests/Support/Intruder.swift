// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import TestSupport
import Varlink

/// A raw Varlink client run as an unprivileged user (uid 65534 through `setpriv`), driven by
/// line commands on stdin, answering with JSON lines: what a local user could do by hand.
final class Intruder {
    static let uid: UInt32 = 65534

    /// Commands: `call METHOD JSON [more]` (send, print the first reply), `send METHOD JSON
    /// [more]` (send only), `read` (one message, or `{"timeout":true}` after 2 s),
    /// `flood` (bytes with no NUL until the daemon takes no more for a second: `{"sent":N}`),
    /// `pipeline N METHOD JSON` (N calls sent while their replies are read, as a pipelining
    /// client must: `{"errors":E}`; `JSON | JSON …`: the calls take the bodies in turn),
    /// `unread N METHOD JSON` (N calls, nothing read), `pid`, `connections N [METHOD [more]]`
    /// (up to N more connections, each held once its `GetInfo`, or METHOD, is answered, until
    /// one is refused: `{"accepted":A,"refused":ERROR}`), `release` (closes them).
    static let script = #"""
    import json, os, select, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    buf = b""
    held = []
    def out(obj):
        print(json.dumps(obj), flush=True)
    def msg(method, params, more):
        m = {"method": method, "parameters": json.loads(params)}
        if more: m["more"] = True
        return json.dumps(m).encode() + b"\0"
    def read(timeout=2.0):
        global buf
        while b"\0" not in buf:
            r, _, _ = select.select([s], [], [], timeout)
            if not r: return {"timeout": True}
            chunk = s.recv(65536)
            if not chunk: return {"closed": True}
            buf += chunk
        m, buf = buf.split(b"\0", 1)
        return json.loads(m)
    out({"ready": os.getpid(), "uid": os.getuid()})
    for line in sys.stdin:
        w = line.split(" ", 3)
        cmd = w[0].strip()
        if cmd == "call" or cmd == "send":
            s.sendall(msg(w[1], w[2].strip(), len(w) > 3 and w[3].strip() == "more"))
            if cmd == "call": out(read())
            else: out({"sent": 1})
        elif cmd == "read":
            out(read())
        elif cmd == "flood":
            s.setblocking(False)
            sent = 0
            chunk = b"a" * 65536
            while sent < (64 << 20):
                try:
                    sent += s.send(chunk)
                except BlockingIOError:
                    if not select.select([], [s], [], 1.0)[1]: break
                except OSError:
                    break
            s.setblocking(True)
            out({"sent": sent})
        elif cmd == "unread":
            n = int(w[1]); rest = w[3].strip() if len(w) > 3 else "{}"
            s.sendall(msg(w[2], rest, False) * n)
            out({"sent": n})
        elif cmd == "pipeline":
            n = int(w[1]); bodies = (w[3].strip() if len(w) > 3 else "{}").split(" | ")
            calls = [msg(w[2], body, False) for body in bodies]
            data = b"".join(calls[i % len(calls)] for i in range(n))
            replies = 0; errors = 0
            while replies < n:
                r, wr, _ = select.select([s], [s] if data else [], [], 10.0)
                if not r and not wr: errors += n - replies; break
                if wr:
                    data = data[s.send(data[:65536]):]
                if r:
                    chunk = s.recv(65536)
                    if not chunk: errors += n - replies; break
                    buf += chunk
                    while b"\0" in buf:
                        m, buf = buf.split(b"\0", 1)
                        replies += 1
                        if "error" in json.loads(m): errors += 1
            out({"errors": errors})
        elif cmd == "pid":
            out({"pid": os.getpid()})
        elif cmd == "connections":
            accepted = 0; refused = None
            for _ in range(int(w[1])):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.connect(sys.argv[1])
                method = w[2].strip() if len(w) > 2 else "org.varlink.service.GetInfo"
                try: c.sendall(msg(method, "{}", len(w) > 3 and w[3].strip() == "more"))
                except OSError: pass  # refused and closed before the call went out
                reply = b""
                r, _, _ = select.select([c], [], [], 2.0)
                while r:
                    chunk = c.recv(65536)
                    if not chunk: break
                    reply += chunk
                    if reply.endswith(b"\0"): break
                    r, _, _ = select.select([c], [], [], 2.0)
                if not reply.endswith(b"\0"):
                    refused = "no reply"; break
                m = json.loads(reply[:-1])
                if "error" in m:
                    refused = m["error"]; c.close(); break
                held.append(c); accepted += 1
            out({"accepted": accepted, "refused": refused})
        elif cmd == "release":
            n = len(held)
            for c in held: c.close()
            held.clear()
            out({"released": n})
    """#

    let process: Spawned

    /// Starts the client as uid 65534 connected to `daemon` (the script is written beside
    /// the socket). `prefix` runs it under another command first (e.g. a shell).
    init(_ daemon: TestDaemon) throws {
        let path = try Self.scriptPath(for: daemon)
        process = try Spawned("/usr/bin/setpriv", ["--reuid=\(Self.uid)", "--regid=\(Self.uid)", "--clear-groups",
                                                   "/usr/bin/python3", path, daemon.socketPath])
        let ready = try next()
        guard ready["uid"]?.intValue == Int64(Self.uid) else { throw TestFailure("intruder not uid \(Self.uid): \(ready.serialized)") }
    }

    /// The script, written beside the daemon's socket (readable by uid 65534) once.
    static func scriptPath(for daemon: TestDaemon) throws -> String {
        let path = daemon.directory + "/intruder.py"
        if !FileSystem.exists(path) {
            let file = try FileDescriptor(systemCall("open") { open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644) })
            try file.writeAll(Array(script.utf8))
        }
        return path
    }

    var pid: Int32 { process.pid }

    func next(timeout: Double = 15) throws -> JSON {
        guard let line = try process.readLine(timeout: timeout) else { throw TestFailure("intruder output ended") }
        return try JSON.parse(line)
    }

    /// Runs a command and returns its output line.
    @discardableResult
    func run(_ command: String, timeout: Double = 15) throws -> JSON {
        try process.send(command)
        return try next(timeout: timeout)
    }

    /// Calls a method and returns the reply (`error` set on an error).
    @discardableResult
    func call(_ method: String, _ parameters: String = "{}", more: Bool = false) throws -> JSON {
        try run("call \(method) \(parameters)\(more ? " more" : "")")
    }

    /// Whether the last reply was the error `name`.
    static func isError(_ reply: JSON, _ name: String) -> Bool { reply["error"]?.stringValue == name }
}

/// A process of uid 65534 for tests to manage (`sleep`), started by the test; returned once
/// it runs as that uid (before, it is `setpriv`, still root).
func spawnUnprivilegedSleep() throws -> Spawned {
    let sleep = try Spawned("/usr/bin/setpriv", ["--reuid=\(Intruder.uid)", "--regid=\(Intruder.uid)", "--clear-groups",
                                                 "/bin/sleep", "1000"])
    try waitUntil("pid \(sleep.pid) to be sleep as uid \(Intruder.uid)") {
        (try? ProcStat.read(pid: sleep.pid))?.command == "sleep"
            && (try? ProcStatus.uids(pid: sleep.pid))?.real == Intruder.uid
    }
    return sleep
}

/// How much a daemon's resident memory may grow in the tests that bound it, in KiB: 8 MiB,
/// or 64 MiB under AddressSanitizer (`make sanitize`), whose quarantine keeps freed memory
/// resident for a while: there the bound still catches growth without limit, not a slice.
let residentGrowthBoundKiB = getenv("ASAN_OPTIONS") == nil ? 8 * 1024 : 64 * 1024

/// The user and system time `pid` has used, in clock ticks (`/proc/PID/stat`).
func cpuTicks(_ pid: Int32) throws -> Int {
    let fields = String(decoding: try readFile("/proc/\(pid)/stat"), as: UTF8.self).split(separator: ")").last!.split(separator: " ")
    return Int(fields[11])! + Int(fields[12])!
}

/// `voluntary_ctxt_switches` of a `status` file (`/proc/PID/status`, `/proc/thread-self/status`):
/// the times that process or thread went to sleep, waiting for something to do.
func voluntarySwitches(_ status: String) throws -> Int {
    let text = String(decoding: try readFile(status), as: UTF8.self)
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("voluntary_ctxt_switches:") }),
          let count = Int(line.split(separator: "\t").last ?? "") else { throw TestFailure("no voluntary_ctxt_switches in \(status)") }
    return count
}

/// The same of process `pid`.
func voluntarySwitches(of pid: Int32) throws -> Int { try voluntarySwitches("/proc/\(pid)/status") }

/// `/proc/PID/status` VmRSS in KiB (or another of its KiB fields, e.g. `RssAnon`).
func residentKiB(_ pid: Int32, _ field: String = "VmRSS") throws -> Int {
    let status = String(decoding: try readFile("/proc/\(pid)/status"), as: UTF8.self)
    guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
          let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) else {
        throw TestFailure("no \(field) for pid \(pid)")
    }
    return kib
}
