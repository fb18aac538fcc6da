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
        var widths = [Int](repeating: 0, count: headers.count)
        for row in all { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) } }
        var out = ""
        for row in all {
            let cells = row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell + String(repeating: " ", count: widths[index] - cell.count)
            }
            out += cells.joined(separator: " ") + "\n"
        }
        if legend {
            out += "\n\(rows.count) \(rows.count == 1 ? noun : plural ?? noun + "s") listed.\n"
        }
        return out
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
