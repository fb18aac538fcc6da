// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import Varlink

/// A table like `systemctl list-units`: aligned columns, a header, a count line.
struct Table {
    var headers: [String]
    var rows: [[String]] = []

    init(_ headers: String...) { self.headers = headers }

    /// Adds a row. A cell holding control characters is escaped (`cescape`): names come from
    /// the processes themselves, and a terminal must never receive their control characters.
    /// (The daemon escapes them already; this holds whatever answers on the socket.)
    mutating func add(_ cells: [String]) {
        rows.append(cells.map { $0.containsControlCharacters ? $0.cEscaped : $0 })
    }

    /// The table; `legend` adds the header and "N things listed."
    func render(legend: Bool, noun: String, plural: String? = nil) -> String {
        let all = legend ? [headers] + rows : rows
        // Columns are as wide as their widest cell in characters; an ASCII cell (nearly every
        // one) is as wide as its bytes, counted without walking its grapheme clusters.
        func width(_ cell: String) -> Int {
            var cell = cell
            return cell.withUTF8 { bytes in bytes.allSatisfy { $0 < 0x80 } ? bytes.count : nil } ?? cell.count
        }
        var widths = [Int](repeating: 0, count: headers.count)
        for row in all { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], width(cell)) } }
        // Written as bytes into one buffer: 100,000 rows of `String` concatenation and
        // `joined` were a third of `bgtaskctl tasks`' time.
        var out: [UInt8] = []
        out.reserveCapacity(all.count * (widths.reduce(0, +) + widths.count))
        for row in all {
            for (index, cell) in row.enumerated() {
                if index > 0 { out.append(UInt8(ascii: " ")) }
                out.append(contentsOf: cell.utf8)
                if index < row.count - 1 {
                    out.append(contentsOf: repeatElement(UInt8(ascii: " "), count: widths[index] - width(cell)))
                }
            }
            out.append(UInt8(ascii: "\n"))
        }
        if legend {
            out.append(contentsOf: "\n\(rows.count) \(rows.count == 1 ? noun : plural ?? noun + "s") listed.\n".utf8)
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Human-readable times: `850ms`, `12.4s`, `1min 3s`, `2h 5min`.
func humanTime(_ seconds: Double?) -> String {
    guard let seconds else { return "unlimited" }
    if seconds <= 0 { return "0s" }
    if seconds < 1 { return "\(Int((seconds * 1000).rounded()))ms" }
    if seconds < 60 {
        let tenths = (seconds * 10).rounded() / 10
        return tenths == tenths.rounded() ? "\(Int(tenths))s" : "\(tenths)s"
    }
    let whole = Int(seconds.rounded())
    if whole < 3600 { return whole % 60 == 0 ? "\(whole / 60)min" : "\(whole / 60)min \(whole % 60)s" }
    let minutes = (whole % 3600) / 60
    return minutes == 0 ? "\(whole / 3600)h" : "\(whole / 3600)h \(minutes)min"
}

extension JSON {
    /// A cell for a table: strings bare, null as "-".
    var cell: String {
        switch self {
        case .null: "-"
        case let .string(s): s.isEmpty ? "-" : s
        case let .int(i): String(i)
        case let .bool(b): b ? "yes" : "no"
        default: serialized
        }
    }
}
