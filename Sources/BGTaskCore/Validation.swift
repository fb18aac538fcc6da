// SPDX-License-Identifier: Apache-2.0
/// Task names end up in tables and logs: bounded, and free of control characters. Checked
/// where they enter: a `BeginTask`, and the state file read back.
public enum TaskName {
    public static let maximumBytes = 256

    public static func validate(_ name: String) throws(BGTaskError) -> String {
        guard name.utf8.count <= maximumBytes, !name.containsControlCharacters else { throw .invalidParameter("name") }
        return name
    }
}

/// A wake's words from the manager: its reason (for the app, history and the journal) and
/// an optional small JSON object's text for the app.
public enum WakeReason {
    public static let maximumReasonBytes = 256
    public static let maximumPayloadBytes = 4096

    public static func validate(_ reason: String) throws(BGTaskError) -> String {
        guard reason.utf8.count <= maximumReasonBytes, !reason.containsControlCharacters else {
            throw .invalidParameter("reason")
        }
        return reason
    }

    /// A payload's serialized text: at most 4 KiB.
    public static func validate(payload text: String) throws(BGTaskError) -> String {
        guard text.utf8.count <= maximumPayloadBytes else { throw .invalidParameter("payload") }
        return text
    }
}
