// SPDX-License-Identifier: Apache-2.0
import BGTaskSession
import Testing
import Varlink

/// The i3/sway IPC format, and the windows of a tree as sway 1.7 prints it.
@Suite struct SwayIPCTests {
    @Test func framesRoundTripAcrossArbitrarySplits() throws {
        let bytes = SwayIPC.frame(.getTree, #"{"a":1}"#) + SwayIPC.frame(.subscribe, "[]")
        for split in 0...bytes.count {
            var framer = SwayIPC.Framer()
            var frames: [(UInt32, [UInt8])] = []
            framer.append(Array(bytes[..<split]))
            while let frame = try framer.next() { frames.append((frame.type, frame.payload)) }
            framer.append(Array(bytes[split...]))
            while let frame = try framer.next() { frames.append((frame.type, frame.payload)) }
            #expect(frames.map(\.0) == [4, 2])
            #expect(frames.map { String(decoding: $0.1, as: UTF8.self) } == [#"{"a":1}"#, "[]"])
        }
    }

    @Test func garbageAndHugeFramesAreRefusedNotBuffered() {
        var garbage = SwayIPC.Framer()
        garbage.append(Array("HTTP/1.1 200 OK\r\n\r\n".utf8))
        #expect(throws: SwayIPC.FrameError.self) { _ = try garbage.next() }
        var huge = SwayIPC.Framer()
        var header = SwayIPC.magic
        withUnsafeBytes(of: UInt32(1 << 30)) { header.append(contentsOf: $0) }
        withUnsafeBytes(of: UInt32(4)) { header.append(contentsOf: $0) }
        huge.append(header)
        #expect(throws: SwayIPC.FrameError.self) { _ = try huge.next() }
    }

    @Test func treeWindowsKnowTheirWorkspaceAndTheScratchpadIsNeverVisible() throws {
        let tree = try JSON.parse("""
        {"type":"root","nodes":[
          {"type":"output","name":"__i3","nodes":[{"type":"workspace","name":"__i3_scratch","nodes":[],
            "floating_nodes":[{"type":"floating_con","pid":30,"visible":true,"focused":false,"app_id":"foot","nodes":[]}]}]},
          {"type":"output","name":"HEADLESS-1","nodes":[
            {"type":"workspace","name":"1","nodes":[
              {"type":"con","pid":10,"visible":false,"focused":false,"app_id":"foot","nodes":[]}]},
            {"type":"workspace","name":"2","nodes":[
              {"type":"con","layout":"splith","nodes":[
                {"type":"con","pid":20,"visible":true,"focused":true,"app_id":"foot","nodes":[]},
                {"type":"con","pid":1,"visible":true,"focused":false,"nodes":[]},
                {"type":"con","visible":true,"focused":false,"window":123,"nodes":[]}]}]}]}]}
        """)
        let windows = SwayIPC.windows(ofTree: tree)
        #expect(windows.map(\.pid) == [30, 10, 20, 1])  // the one without a pid (i3's X11) left out
        #expect(windows[0].visible == false && windows[0].place == "the scratchpad")
        #expect(windows[1].visible == false && windows[1].place == "workspace 1")
        #expect(windows[2].visible && windows[2].focused && windows[2].place == "workspace 2")
    }

    @Test func aHostileTreeIsBounded() throws {
        func nested(_ levels: Int) -> String {
            String(repeating: #"{"type":"con","nodes":["#, count: levels)
                + #"{"type":"con","pid":5,"visible":true,"nodes":[]}"# + String(repeating: "]}", count: levels)
        }
        // A real tree (a dozen levels of splits) is read; 200 levels are not JSON the agent
        // reads at all (the parser stops at 64 levels; the agent logs and ignores the tree).
        #expect(SwayIPC.windows(ofTree: try JSON.parse(nested(20))).map(\.pid) == [5])
        #expect(throws: JSONError.self) { try JSON.parse(nested(200)) }
        // A workspace name with control characters is escaped for the journal.
        let named = try JSON.parse(#"{"type":"workspace","name":"a\u001b[2Jb","nodes":[{"type":"con","pid":7,"visible":true,"nodes":[]}]}"#)
        #expect(SwayIPC.windows(ofTree: named).first?.place == #"workspace a\x1b[2Jb"#)
    }
}
