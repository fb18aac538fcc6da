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
        guard toJournal else {
            let line = Array("<\(priority)>\(message)\n".utf8)
            _ = line.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
            return
        }
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
}
