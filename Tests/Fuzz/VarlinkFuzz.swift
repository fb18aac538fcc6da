// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the Varlink framer and message decoding, the bytes a client sends.
// Built by scripts/fuzz together with Sources/Varlink (one module, so no import).
//
// The first input byte picks the chunk size the rest arrives in (a stream splits anywhere).
// Beyond "no crash", it checks that the framer hands back exactly the bytes it got, that
// every JSON value it parses serializes to a text that parses back to the same value, and
// that decoded calls and replies survive their own encoding, and that a call the daemon's
// hot path reads from its bytes (FlatCall) is the call the general path reads.

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
    checkFlat(message)
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

/// A message `FlatCall` takes is a Varlink call to the general path too, the same one.
func checkFlat(_ message: ArraySlice<UInt8>) {
    message.withUnsafeBufferPointer { bytes in
        guard let flat = FlatCall(bytes) else { return }
        let (method, parameters) = flat.general(in: bytes)
        guard let json = try? JSON.parse(message), let call = try? VarlinkCall(message: json) else {
            preconditionFailure("FlatCall took a message the general path refuses")
        }
        precondition(call.method == method && call.parameters == parameters && call.more == flat.more
                     && call.oneway == flat.oneway && !call.upgrade, "FlatCall read another call than the general path")
    }
}
