// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// Logging: structured records to the journal when stderr is connected to it (systemd sets
/// `$JOURNAL_STREAM`), else one line per record on stderr.
public enum Journal {
    /// Whether records go to the journal.
    public static let toJournal: Bool = {
        guard let stream = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return stream == "\(st.st_dev):\(st.st_ino)"
    }()

    /// Logs `message` at syslog `priority` with extra `FIELD=value` pairs. `sd_journal_sendv(3)`
    /// SYSLOG_IDENTIFIER of every record: set once at start, by a program other than the daemon.
    nonisolated(unsafe) public static var identifier = "bgtaskd"

    public static func log(priority: Int, message: String, fields: [(String, String)] = []) {
        if holding {
            held.append((priority, message, fields))
            if held.count >= maximumHeld { flush() }
            return
        }
        guard toJournal else {
            let line = Array("<\(priority)>\(message)\n".utf8)
            _ = line.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
            return
        }
        sendv(priority: priority, message: message, fields: fields)
    }

    private static func sendv(priority: Int, message: String, fields: [(String, String)]) {
        var entries = ["MESSAGE=\(message)", "PRIORITY=\(priority)", "SYSLOG_IDENTIFIER=\(identifier)"]
        entries += fields.map { "\($0.0)=\($0.1)" }
        let buffers = entries.map { Array($0.utf8) }
        var vectors: [iovec] = []
        func send(_ index: Int) {
            if index == buffers.count {
                _ = sd_journal_sendv(vectors, Int32(vectors.count))
                return
            }
            buffers[index].withUnsafeBytes { raw in
                vectors.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: raw.baseAddress), iov_len: raw.count))
                send(index + 1)
            }
        }
        send(0)
    }

    // MARK: Holding records for one write

    /// While set, records are held, and `flush()` sends them all at once: the lines on stderr
    /// in one `write(2)`, the journal's datagrams in one `sendmmsg(2)` (a burst of 10,000
    /// suspensions logged one system call each cost a system call per app). The daemon holds
    /// records for the length of a pass and flushes when the pass commits.
    nonisolated(unsafe) public static var holding = false
    nonisolated(unsafe) private static var held: [(priority: Int, message: String, fields: [(String, String)])] = []
    /// A pass that logs more flushes early: what is held stays bounded.
    static let maximumHeld = 1024

    /// Sends the records held.
    public static func flush() {
        guard !held.isEmpty else { return }
        let records = held
        held.removeAll(keepingCapacity: true)
        guard toJournal else {
            // Written as bytes, not an interpolated string per record (a burst logs two a app).
            var bytes: [UInt8] = []
            for record in records {
                bytes.append(UInt8(ascii: "<"))
                if (0...9).contains(record.priority) {
                    bytes.append(UInt8(ascii: "0") + UInt8(record.priority))
                } else {
                    bytes += String(record.priority).utf8
                }
                bytes.append(UInt8(ascii: ">"))
                bytes += record.message.utf8
                bytes.append(UInt8(ascii: "\n"))
            }
            var offset = 0
            while offset < bytes.count {
                let written = bytes[offset...].withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
                if written > 0 { offset += written } else if written < 0, errno == EINTR { continue } else { break }
            }
            return
        }
        let datagrams = records.map { record(priority: $0.priority, message: $0.message, fields: $0.fields) }
        let sent = journalSocket.map { sendAll(datagrams, on: $0) } ?? 0
        // What the socket refused (too large for a datagram, the journal restarting): through
        // sd-journal, which knows the fallbacks.
        for record in records[sent...] { sendv(priority: record.priority, message: record.message, fields: record.fields) }
    }

    /// A record in the journal's native protocol: `FIELD=value\n`, or, for a value with a
    /// newline, `FIELD\n`, its length (64-bit little-endian), the value and `\n`.
    static func record(priority: Int, message: String, fields: [(String, String)]) -> [UInt8] {
        var bytes: [UInt8] = []
        func field(_ name: String, _ value: String) {
            bytes += name.utf8
            if value.utf8.contains(UInt8(ascii: "\n")) {
                bytes.append(UInt8(ascii: "\n"))
                withUnsafeBytes(of: UInt64(value.utf8.count).littleEndian) { bytes += $0 }
            } else {
                bytes.append(UInt8(ascii: "="))
            }
            bytes += value.utf8
            bytes.append(UInt8(ascii: "\n"))
        }
        field("MESSAGE", message)
        field("PRIORITY", String(priority))
        field("SYSLOG_IDENTIFIER", identifier)
        for (name, value) in fields { field(name, value) }
        return bytes
    }

    /// The journal's datagram socket, connected; `nil` if it cannot be.
    nonisolated(unsafe) private static var journalSocket: Int32? = {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let path = Array("/run/systemd/journal/socket".utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path)
            raw[path.count] = 0
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            Glibc.close(fd)
            return nil
        }
        return fd
    }()

    /// Sends `records` as datagrams (`sendmmsg`); returns how many went (the rest from the
    /// first refused on).
    private static func sendAll(_ records: [[UInt8]], on socket: Int32) -> Int {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(records.reduce(0) { $0 + $1.count })
        for record in records { bytes += record }
        return bytes.withUnsafeMutableBytes { raw in
            var vectors: [iovec] = []
            vectors.reserveCapacity(records.count)
            var offset = 0
            for record in records {
                vectors.append(iovec(iov_base: raw.baseAddress! + offset, iov_len: record.count))
                offset += record.count
            }
            return max(0, Int(bgtask_send_datagrams(socket, vectors, UInt32(vectors.count))))
        }
    }
}
