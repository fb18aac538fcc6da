// SPDX-License-Identifier: Apache-2.0
import Testing
import Varlink

/// `FlatCall` reads a call from its bytes without JSON values: what it takes must be what the
/// general path (`JSON.parse` + `VarlinkCall`) reads, and it must give up on the rest.
@Suite struct FlatCallTests {
    static func flat(_ text: String) -> (method: String, parameters: [String: JSON], more: Bool, oneway: Bool)? {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBufferPointer { buffer in
            FlatCall(buffer).map { call in
                let (method, parameters) = call.general(in: buffer)
                return (method, parameters, call.more, call.oneway)
            }
        }
    }

    static let taken = [
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"upload","expirationHandler":true},"more":true}"#,
        #" { "parameters" : { "taskId" : -5 } ,"method":"io.bgtaskd.App.EndTask", "oneway":true } "#,
        "{\"method\":\"io.bgtaskd.App.GetTimeRemaining\",\n\t\"parameters\":null,\"more\":null,\"oneway\":false}\r\n",
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":4242,"state":"background","reason":null}}"#,
        #"{"method":"a.b.C","parameters":{}}"#,
        #"{"method":"a.b.C","parameters":{"zero":0,"big":999999999999999999,"small":-999999999999999999,"t":true,"f":false}}"#,
        "{\"method\":\"a.b.C\",\"parameters\":{\"odd\":\"~ ' / \u{7F} text\"}}",
    ]

    @Test func whatItTakesIsTheGeneralCall() throws {
        for text in Self.taken {
            let flat = try #require(Self.flat(text), "\(text)")
            let call = try VarlinkCall(message: JSON.parse(text))
            #expect(flat.method == call.method, "\(text)")
            #expect(flat.parameters == call.parameters, "\(text)")
            #expect(flat.more == call.more && flat.oneway == call.oneway, "\(text)")
        }
    }

    /// Each of these is valid JSON the general path reads (or refuses) itself.
    static let givenUp = [
        #"{"method":"a.b.C","upgrade":true}"#,  // the general path refuses it
        #"{"method":"a.b.C","upgrade":false}"#,
        #"{"method":"a.b.C","extra":1}"#,  // ignored by the general path
        #"{"method":"a.b.C","method":"a.b.D"}"#,  // the last one counts there
        #"{"method":"a.b.C","parameters":{"x":1,"x":2}}"#,
        #"{"method":"a.b.C","parameters":{"x":{"y":1}}}"#,
        #"{"method":"a.b.C","parameters":{"x":[1]}}"#,
        #"{"method":"a.b.C","parameters":{"x":1.0}}"#,
        #"{"method":"a.b.C","parameters":{"x":1e3}}"#,
        #"{"method":"a.b.C","parameters":{"x":1234567890123456789}}"#,
        #"{"method":"a.b.C","parameters":{"x":133333333333333333333333333333333333333}}"#,  // the fuzzer's: overflowed
        #"{"method":"a.b.C","parameters":{"x":"a\"b"}}"#,
        #"{"method":"a.b.C","parameters":{"x":"\u00e9"}}"#,
        "{\"method\":\"a.b.C\",\"parameters\":{\"x\":\"é\"}}",
        #"{"method":"a.b.C","parameters":{"x\u0041":1}}"#,  // an escape in a name
        #"{"method":"a.b.\u0043"}"#,
        #"{"method":"a.b.C","parameters":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}}"#,
        #"{"method":"a.b.C","more":1}"#,
        #"{"method":""}"#,
        #"{"method":5}"#,
        #"["a.b.C"]"#,
    ]

    /// Not JSON, or not a call: the general path must say what is wrong, so these too.
    static let broken = [
        "", "{", #"{"method":"a.b.C""#, #"{"method":"a.b.C"} x"#, #"{"method":"a.b.C",}"#, #"{"method":"a.b.C","parameters":{"x":01}}"#,
        #"{"method":"a.b.C","parameters":{"x":-}}"#, #"{"method":"a.b.C","parameters":{"x":tru}}"#,
        #"{"method":"a.b.C","parameters":{"x":1,}}"#, #"{"method":"a.b.C","parameters":{,}}"#,
        "{\"method\":\"a.b\u{01}C\"}", #"{"method":"a.b.C" "more":true}"#, #"{"parameters":{}}"#,
        "{\"method\":\"a.b.C\",\"parameters\":{\"x\":\"\u{1F}\"}}", #"{"method":"a.b.C","parameters":{"x":"ab"#,
    ]

    @Test func itGivesUpOnAnythingElse() {
        for text in Self.givenUp + Self.broken { #expect(Self.flat(text) == nil, "\(text)") }
        for text in Self.broken { #expect((try? VarlinkCall(message: JSON.parse(text))) == nil, "\(text)") }
    }
}
