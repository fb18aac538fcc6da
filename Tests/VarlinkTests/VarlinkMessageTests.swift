// SPDX-License-Identifier: Apache-2.0
import Testing
import Varlink

@Suite struct VarlinkMessageTests {
    static let golden: [(String, VarlinkCall)] = [
        (#"{"method":"org.varlink.service.GetInfo"}"#, VarlinkCall(method: "org.varlink.service.GetInfo")),
        (#"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"upload"},"more":true}"#,
         VarlinkCall(method: "io.bgtaskd.App.BeginTask", parameters: ["name": .string("upload")], more: true)),
        (#"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":3},"more":false,"oneway":true}"#,
         VarlinkCall(method: "io.bgtaskd.App.EndTask", parameters: ["taskId": .int(3)], oneway: true)),
        (#"{"method":"a.b.C","parameters":null}"#, VarlinkCall(method: "a.b.C")),
    ]

    @Test func goldenCallsDecode() throws {
        for (text, call) in Self.golden {
            #expect(try VarlinkCall(message: JSON.parse(text)) == call)
        }
        #expect(Self.golden[1].1.interface == "io.bgtaskd.App")
        #expect(Self.golden[1].1.member == "BeginTask")
    }

    @Test func goldenRepliesEncode() {
        #expect(VarlinkReply(parameters: ["taskId": .int(1), "state": .string("pending")]).json.serialized
                == #"{"parameters":{"state":"pending","taskId":1}}"#)
        #expect(VarlinkReply(parameters: ["event": .string("x")], continues: true).json.serialized
                == #"{"continues":true,"parameters":{"event":"x"}}"#)
        #expect(VarlinkReply(error: .methodNotFound("a.B")).json.serialized
                == #"{"error":"org.varlink.service.MethodNotFound","parameters":{"method":"a.B"}}"#)
    }

    @Test(arguments: [#"[]"#, #"{}"#, #"{"method":1}"#, #"{"method":""}"#, #"{"method":"a.B","parameters":[]}"#,
                      #"{"method":"a.B","more":"yes"}"#])
    func wrongShapesAreRefused(text: String) throws {
        #expect(throws: VarlinkProtocolError.self) { try VarlinkCall(message: JSON.parse(text)) }
    }

    @Test func framesSplitAtEveryByteComeOutWhole() throws {
        let messages = Self.golden.map { $0.0 }
        let stream: [UInt8] = messages.flatMap { Array($0.utf8) + [UInt8(0)] }
        for split in 0...stream.count {
            var framer = VarlinkFramer(maximumMessageBytes: 1024)
            var out: [String] = []
            for chunk: ArraySlice<UInt8> in [stream[..<split], stream[split...]] {
                framer.append(chunk)
                while let message = try framer.next() { out.append(String(decoding: message, as: UTF8.self)) }
            }
            #expect(out == messages, "split at \(split)")
        }
        // And one byte at a time.
        var framer = VarlinkFramer(maximumMessageBytes: 1024)
        var count = 0
        for byte in stream {
            framer.append([byte])
            while try framer.next() != nil { count += 1 }
        }
        #expect(count == messages.count && framer.bufferedByteCount == 0)
    }

    /// Chunks of every size from a reader's own buffer: a message left part-read is moved to
    /// the front (once the bytes taken before it are at least as many), room grows past the
    /// first chunks, and every message comes out whole, in order.
    @Test func chunksFromAReadersBufferComeOutWhole() throws {
        let messages = (0..<300).map { index in "{\"n\":\(index),\"pad\":\"" + String(repeating: "x", count: index % 97) + "\"}" }
        let stream: [UInt8] = messages.flatMap { Array($0.utf8) + [UInt8(0)] }
        for chunkSize in [1, 2, 3, 7, 16, 61, 128, 1000, stream.count] {
            var framer = VarlinkFramer(maximumMessageBytes: 256)
            var out: [String] = []
            var offset = 0
            while offset < stream.count {
                let chunk = stream[offset..<min(offset + chunkSize, stream.count)]
                chunk.withUnsafeBytes { framer.append($0) }
                offset += chunk.count
                while let message = try framer.next() { out.append(String(decoding: message, as: UTF8.self)) }
                #expect(framer.bufferedByteCount == (stream[..<offset].lastIndex(of: 0).map { offset - $0 - 1 } ?? offset))
            }
            #expect(out == messages, "chunks of \(chunkSize)")
        }
    }

    @Test func oversizedMessagesAreRefusedWithOrWithoutTheirNUL() throws {
        var framer = VarlinkFramer(maximumMessageBytes: 16)
        framer.append(Array(repeating: UInt8(ascii: "x"), count: 16))
        #expect(try framer.next() == nil)
        framer.append([UInt8(ascii: "x")])
        #expect(throws: VarlinkFramer.MessageTooLarge(limit: 16)) { try framer.next() }

        var whole = VarlinkFramer(maximumMessageBytes: 4)
        whole.append(Array("123456".utf8) + [0])
        #expect(throws: VarlinkFramer.MessageTooLarge(limit: 4)) { try whole.next() }
    }

    @Test func manyMessagesInOneChunkAndEmptyMessages() throws {
        var framer = VarlinkFramer(maximumMessageBytes: 64)
        framer.append(Array("{}\0\0{\"a\":1}\0".utf8))
        #expect(try framer.next().map { Array($0) } == Array("{}".utf8))
        #expect(try framer.next().map { Array($0) } == [])
        #expect(try framer.next().map { Array($0) } == Array("{\"a\":1}".utf8))
        #expect(try framer.next() == nil)
    }
}
