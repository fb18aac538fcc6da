// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import Varlink

/// The i3/sway IPC wire format: `i3-ipc`, a 32-bit payload length and a 32-bit type (native
/// byte order), then the payload (JSON). Events have the type's high bit set.
public enum SwayIPC {
    public static let magic = Array("i3-ipc".utf8)
    public static let headerBytes = 14
    /// A larger frame is refused: a tree of a thousand windows is about 1.5 MB.
    public static let maximumPayloadBytes = 8 << 20

    public enum MessageType: UInt32 {
        case runCommand = 0, getWorkspaces = 1, subscribe = 2, getTree = 4
        public static let workspaceEvent: UInt32 = 0x8000_0000
        public static let windowEvent: UInt32 = 0x8000_0003
        public static let shutdownEvent: UInt32 = 0x8000_0006
    }

    public struct FrameError: Error, CustomStringConvertible {
        public var description: String
    }

    public static func frame(_ type: MessageType, _ payload: String = "") -> [UInt8] {
        var out = magic
        withUnsafeBytes(of: UInt32(payload.utf8.count)) { out.append(contentsOf: $0) }
        withUnsafeBytes(of: type.rawValue) { out.append(contentsOf: $0) }
        out.append(contentsOf: payload.utf8)
        return out
    }

    /// Splits a byte stream into frames. A bad magic or a length over the maximum is an error:
    /// the stream cannot be trusted past it.
    public struct Framer {
        private var buffer: [UInt8] = []
        private var start = 0
        public init() {}

        public var bufferedByteCount: Int { buffer.count - start }

        public mutating func append(_ bytes: [UInt8]) {
            if start > 0, start == buffer.count { buffer.removeAll(keepingCapacity: true); start = 0 }
            buffer.append(contentsOf: bytes)
        }

        public mutating func next() throws(FrameError) -> (type: UInt32, payload: [UInt8])? {
            let available = buffer.count - start
            if available >= magic.count, !buffer[start..<start + magic.count].elementsEqual(magic) {
                throw FrameError(description: "not i3 IPC (bad magic)")
            }
            guard available >= SwayIPC.headerBytes else { return nil }
            let length = Int(word(at: start + 6)), type = word(at: start + 10)
            guard length <= SwayIPC.maximumPayloadBytes else {
                throw FrameError(description: "a frame of \(length) bytes (at most \(SwayIPC.maximumPayloadBytes))")
            }
            guard available >= SwayIPC.headerBytes + length else { return nil }
            let payloadStart = start + SwayIPC.headerBytes
            let payload = Array(buffer[payloadStart..<payloadStart + length])
            start = payloadStart + length
            if start == buffer.count { buffer.removeAll(keepingCapacity: buffer.capacity <= 1 << 20); start = 0 }
            else if start > 1 << 20 { buffer.removeFirst(start); start = 0 }
            return (type, payload)
        }

        private func word(at offset: Int) -> UInt32 {
            var value: UInt32 = 0
            withUnsafeMutableBytes(of: &value) { raw in
                for i in 0..<4 { raw[i] = buffer[offset + i] }
            }
            return value
        }
    }

    /// A window of sway's tree: its process, whether it shows and has the focus, and where.
    public struct TreeWindow: Equatable, Sendable {
        public var pid: Int32
        public var visible: Bool
        public var focused: Bool
        public var place: String
        public var appID: String?
    }

    /// The windows of a `get_tree` reply. A window in the scratchpad is not visible, whatever
    /// the tree says; one without a pid (i3's X11 windows) is left out.
    public static func windows(ofTree tree: JSON) -> [TreeWindow] {
        var windows: [TreeWindow] = []
        walk(tree, workspace: nil, depth: 0, into: &windows)
        return windows
    }

    private static func walk(_ node: JSON, workspace: String?, depth: Int, into windows: inout [TreeWindow]) {
        guard depth < 64, windows.count < 100_000 else { return }  // deeper is not a real tree
        var workspace = workspace
        if node["type"]?.stringValue == "workspace" { workspace = node["name"]?.stringValue ?? "?" }
        let children = (node["nodes"]?.arrayValue ?? []) + (node["floating_nodes"]?.arrayValue ?? [])
        if children.isEmpty, let pid = node["pid"]?.intValue, pid > 0, pid <= Int64(Int32.max),
           node["type"]?.stringValue == "con" || node["type"]?.stringValue == "floating_con" {
            let scratch = workspace == "__i3_scratch"
            windows.append(TreeWindow(
                pid: Int32(pid), visible: !scratch && node["visible"]?.boolValue == true,
                focused: !scratch && node["focused"]?.boolValue == true,
                place: scratch ? "the scratchpad" : "workspace \(workspace.map { $0.cEscaped } ?? "?")",
                appID: node["app_id"]?.stringValue))
        }
        for child in children { walk(child, workspace: workspace, depth: depth + 1, into: &windows) }
    }
}
