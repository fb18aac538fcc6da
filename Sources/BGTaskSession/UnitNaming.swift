// SPDX-License-Identifier: Apache-2.0

/// The freedesktop convention launchers (GNOME, KDE, app launchers) name an app's unit by,
/// from systemd's "Desktop Environments" document: `app[-<launcher>]-<ApplicationID>[@<RANDOM>].service`
/// and `app[-<launcher>]-<ApplicationID>-<RANDOM>.scope`, the ApplicationID escaped as
/// systemd escapes a unit name. A wlr toplevel carries only its app_id: this finds its unit.
public enum UnitNaming {
    /// `systemd-escape`: ASCII letters, digits, `:`, `_` and `.` (not leading) are kept; every
    /// other byte is `\xNN`.
    public static func escape(_ text: String) -> String {
        var out = ""
        for (index, byte) in text.utf8.enumerated() {
            let keep = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: ":") || byte == UInt8(ascii: "_") || (byte == UInt8(ascii: ".") && index > 0)
            if keep { out.unicodeScalars.append(Unicode.Scalar(byte)) } else {
                let hex = String(byte, radix: 16)
                out += "\\x" + (hex.count == 1 ? "0" + hex : hex)
            }
        }
        return out
    }

    /// Whether the unit `name` (e.g. `app-gnome-org.gnome.Terminal-4242.scope`) is, by the
    /// convention, an instance of the app `appID`.
    public static func unit(_ name: String, isInstanceOf appID: String) -> Bool {
        guard !appID.isEmpty, name.hasPrefix("app-") else { return false }
        var rest: Substring
        if name.hasSuffix(".service") {
            rest = name.dropFirst(4).dropLast(8)
            if let at = rest.firstIndex(of: "@") { rest = rest[..<at] }
        } else if name.hasSuffix(".scope") {
            rest = name.dropFirst(4).dropLast(6)
            guard let dash = rest.lastIndex(of: "-") else { return false }  // a scope has its -RANDOM
            rest = rest[..<dash]
        } else {
            return false
        }
        let escaped = escape(appID)
        return rest == escaped || rest.hasSuffix("-" + escaped)
    }
}
