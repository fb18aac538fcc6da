// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the Varlink framer and message decoding, the bytes a client sends.
// Built by scripts/fuzz together with Sources/Varlink (one module, so no import).
//
// The first input byte picks the chunk size the rest arrives in (a stream splits anywhere).
// Beyond "no crash", it checks that the framer hands back exactly the bytes it got, that
// every JSON value it parses serializes to a text that parses back to the same value, and
// that decoded calls and replies survive their own encoding.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzVarlink(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let chunk = Int(bytes[0] % 16) + 1
    let stream = bytes.dropFirst()
    var framer = VarlinkFramer(maximumMessageBytes: 4096)
    var reassembled: [UInt8] = []
    var index = stream.startIndex
    framing: while index < stream.endIndex {
        let end = min(index + chunk, stream.endIndex)
        framer.append(stream[index..<end])
        index = end
        while true {
            let message: ArraySlice<UInt8>
            do {
                guard let next = try framer.next() else { break }
                message = next
            } catch {
                // Over the limit: the daemon closes the connection; so do we.
                precondition(error.limit == 4096)
                reassembled = []
                break framing
            }
            reassembled += message + [0]
            decode(message)
        }
    }
    if !reassembled.isEmpty {
        precondition(Array(stream).starts(with: reassembled), "the framer changed the bytes")
        precondition(framer.bufferedByteCount == stream.count - reassembled.count, "the framer lost bytes")
    }
    return 0
}

func decode(_ message: ArraySlice<UInt8>) {
    guard let json = try? JSON.parse(message) else { return }
    let text = json.serialized
    guard let again = try? JSON.parse(text) else { preconditionFailure("serialized JSON does not parse: \(text)") }
    precondition(again == json, "JSON round trip changed \(text)")
    if let call = try? VarlinkCall(message: json) {
        let decoded = try? VarlinkCall(message: call.json)
        precondition(decoded?.method == call.method && decoded?.parameters == call.parameters
                     && decoded?.more == call.more && decoded?.oneway == call.oneway, "call round trip")
    }
    if let reply = try? VarlinkReply(message: json) {
        let decoded = try? VarlinkReply(message: reply.json)
        precondition(decoded?.parameters == reply.parameters && decoded?.continues == reply.continues
                     && decoded?.error == reply.error, "reply round trip")
    }
}
