// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
@testable import BGTaskDaemon
import Testing
import Varlink

/// A hot method's call decoded from its bytes is the call its general decoding gives, and
/// what the bytes path does not take goes the general way (whose errors the end-to-end
/// suites check).
@Suite struct HotCallTests {
    static func decode(_ text: String) throws -> Request { try Daemon.decode(ArraySlice(text.utf8)) }

    static let hot: [(String, HotCall.Fields)] = [
        (#"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"upload","expirationHandler":true},"more":true}"#,
         .beginTask(name: "upload", expirationHandler: true)),
        (#"{"method":"io.bgtaskd.App.BeginTask"}"#, .beginTask(name: nil, expirationHandler: nil)),
        (#"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":null,"expirationHandler":null}}"#,
         .beginTask(name: nil, expirationHandler: nil)),
        (#"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":7},"oneway":true}"#, .endTask(taskId: 7)),
        (#"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":-5}}"#, .endTask(taskId: -5)),
        // The parameters are read before the method is known.
        (#"{"parameters":{"taskId":3},"more":false,"method":"io.bgtaskd.App.EndTask"}"#, .endTask(taskId: 3)),
        (#"{"method":"io.bgtaskd.App.GetTimeRemaining","parameters":{}}"#, .getTimeRemaining),
        (#"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":42,"state":"background","reason":"locked"}}"#,
         .setAppState(target: .pid(42), state: "background", reason: "locked")),
        (#"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"unit":"app-x.scope","pid":null,"state":"foreground"}}"#,
         .setAppState(target: .unit("app-x.scope"), state: "foreground", reason: nil)),
        (#"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":1,"state":"nonsense"}}"#,
         .setAppState(target: .pid(1), state: "nonsense", reason: nil)),  // the handler refuses the state
    ]

    @Test func fromBytesAsFromTheGeneralCall() throws {
        for (text, fields) in Self.hot {
            guard case let .hot(call) = try Self.decode(text) else {
                Issue.record("not decoded from its bytes: \(text)")
                continue
            }
            #expect(call.fields == fields, "\(text)")
            let general = try VarlinkCall(message: JSON.parse(text))
            let method = try #require(HotMethod.allCases.first { $0.method.qualified == general.method })
            let fromGeneral = try HotCall(method, general: general)
            #expect(fromGeneral.fields == call.fields && fromGeneral.more == call.more && fromGeneral.oneway == call.oneway,
                    "\(text)")
        }
    }

    /// Each hot method's name, kept as static text to compare with a message's, is its
    /// qualified name; a name one byte short or long, or of another method, is none.
    @Test func eachHotMethodIsFoundByItsQualifiedNameOnly() {
        for method in HotMethod.allCases {
            #expect("\(method.qualifiedName)" == method.method.qualified)
            let name = Array(method.method.qualified.utf8)
            name.withUnsafeBufferPointer { #expect(HotMethod(named: $0) == method) }
            name.dropLast().withUnsafeBufferPointer { #expect(HotMethod(named: $0) == nil) }
            (name + [UInt8(ascii: "s")]).withUnsafeBufferPointer { #expect(HotMethod(named: $0) == nil) }
        }
        Array("io.bgtaskd.App.Subscribe".utf8).withUnsafeBufferPointer { #expect(HotMethod(named: $0) == nil) }
    }

    static let general = [
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"x","other":1}}"#,  // InvalidParameter
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":5}}"#,
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"expirationHandler":"yes"}}"#,
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"name":"caf\u00e9"}}"#,  // valid, decoded in general
        // Another hot method's parameter, with the method before or after it.
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"taskId":1}}"#,
        #"{"parameters":{"name":"x","state":"background"},"method":"io.bgtaskd.App.BeginTask"}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":1,"reason":null}}"#,
        #"{"method":"io.bgtaskd.App.GetTimeRemaining","parameters":{"pid":null}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":1,"state":"background","expirationHandler":true}}"#,
        // As long as a parameter's name, not it.
        #"{"method":"io.bgtaskd.App.BeginTask","parameters":{"nane":"x"}}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskIe":1}}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{}}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":null}}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":"1"}}"#,
        #"{"method":"io.bgtaskd.App.EndTask","parameters":{"taskId":1.0}}"#,
        #"{"method":"io.bgtaskd.App.GetTimeRemaining","parameters":{"x":null}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":1,"unit":"u","state":"background"}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":0,"state":"background"}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":4294967296,"state":"background"}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"pid":1}}"#,
        #"{"method":"io.bgtaskd.Manager.SetAppState","parameters":{"state":"background"}}"#,
        #"{"method":"io.bgtaskd.App.Subscribe","more":true}"#,
        #"{"method":"io.bgtaskd.App.BeginTaskX"}"#,
        #"{"method":"io.bgtaskd.App.BeginTask","upgrade":true}"#,
    ]

    @Test func theRestGoesTheGeneralWay() throws {
        for text in Self.general {
            guard case .general = try Self.decode(text) else {
                Issue.record("decoded from its bytes: \(text)")
                continue
            }
        }
        #expect(throws: (any Error).self) { try Self.decode(#"{"method":"io.bgtaskd.App.EndTask","#) }
    }

    /// The bytes a hot reply writes are the general reply's (also asserted on every reply in
    /// debug builds, which the end-to-end suites run).
    @Test func repliesAreTheGeneralText() {
        let task = TaskSnapshot(id: 9, app: ProcessIdentity(pid: 10, startTime: 1), owner: ProcessIdentity(pid: 11, startTime: 2),
                                uid: 1000, name: "n", state: .denied, reason: .noBackgroundTime, age: .zero,
                                expirationHandler: false)
        let replies: [HotReply] = [
            .task(task, continues: true), .task(task, continues: false), .task(7, .granted, nil, continues: false), .empty,
            .timeRemaining(quota: nil, time: nil, state: .foreground),
            .timeRemaining(quota: .milliseconds(1500), time: .seconds(29) + .nanoseconds(999_999_999), state: .background),
        ]
        for reply in replies {
            let bytes = ByteBuffer()
            reply.write(to: bytes)
            #expect(bytes.bytes(from: 0) + [0] == reply.general.frame)
        }
    }

    /// Every task state's text written directly is its general encoding.
    @Test func everyTaskStateIsQuotedAsTheGeneralText() {
        for state in TaskState.allCases { #expect("\(state.quoted)" == JSON.string(state.rawValue).serialized) }
        for state in AppState.allCases { #expect("\(state.quoted)" == JSON.string(state.rawValue).serialized) }
        for phase in BackgroundPhase.allCases { #expect("\(phase.quoted)" == JSON.string(phase.rawValue).serialized) }
        for containment in Containment.allCases { #expect("\(containment.quoted)" == JSON.string(containment.rawValue).serialized) }
    }

    /// A listing's task is written without its dictionary, and reads as the general encoding.
    @Test(arguments: [
        (TaskState.granted, nil as TaskReason?, Duration.zero, true, "upload"),
        (.denied, .noBackgroundTime, .milliseconds(1500), false, "a \"quoted\"\n\u{1b}name"),
        (.expiring, nil, .seconds(86_400 * 3), true, "émoji 😀"),
        (.pending, nil, .nanoseconds(1), false, ""),
    ])
    func aListedTaskIsTheGeneralText(state: TaskState, reason: TaskReason?, age: Duration, handler: Bool, name: String) {
        let task = TaskSnapshot(id: 123_456, app: ProcessIdentity(pid: 10, startTime: 1), owner: ProcessIdentity(pid: 4_000_000, startTime: 2),
                                uid: 4_294_967_294, name: name, state: state, reason: reason, age: age, expirationHandler: handler)
        let out = ByteBuffer()
        out.append("[")
        Wire.writeTask(task, to: out)
        #expect(String(decoding: out.bytes(from: 1), as: UTF8.self) == Wire.task(task).serialized)
    }

    /// A history entry and the monitor's events are written directly, and read as the
    /// general encoding: the reply a monitor would have been sent before.
    @Test func historyAndMonitorFramesAreTheGeneralText() {
        let task = TaskSnapshot(id: 7, app: ProcessIdentity(pid: 10, startTime: 1), owner: ProcessIdentity(pid: 11, startTime: 2),
                                uid: 1000, name: "sync \"all\"", state: .expiring, reason: nil, age: .milliseconds(2500),
                                expirationHandler: true)
        #expect(Wire.monitorFrame(task) == VarlinkReply(parameters: ["event": "taskChanged", "task": Wire.task(task)], continues: true).frame)
        let scratch = ByteBuffer(capacity: 8)  // as the daemon writes them: one buffer, emptied in turn
        #expect(Wire.monitorFrame(task, using: scratch) == Wire.monitorFrame(task))
        for (names, detail) in [([], nil), (["upload", "a\u{1b}[2Jb"], "SIGKILL after 2s"), (["é"], "")] as [([String], String?)] {
            for action in [AppAction.suspended, .resumed, .terminated] {
                let record = AppActionRecord(app: ProcessIdentity(pid: 42, startTime: 3), uid: 65534, command: "foot\tx",
                                             action: action, reason: .assertionsBeyondPermittedTime, taskNames: names, detail: detail)
                let entry = HistoryEntry(realtimeNanoseconds: 1_796_000_000_123_456_789, record: record)
                let out = ByteBuffer()
                Wire.writeHistoryEntry(entry, to: out)
                #expect(out.bytes(from: 0) == Array(Wire.historyEntry(entry).serialized.utf8))
                #expect(Wire.monitorFrame(entry, using: scratch) == Wire.monitorFrame(entry))
                #expect(Wire.monitorFrame(entry) == VarlinkReply(parameters: ["event": .string(action.rawValue), "entry": Wire.historyEntry(entry)],
                                                                 continues: true).frame)
            }
        }
    }

    /// Lifecycle events are written directly, for subscribers and (with the app's pid) for
    /// monitors, and read as the general encoding.
    @Test func lifecycleEventFramesAreTheGeneralText() {
        let events: [LifecycleEvent] = [
            .didEnterBackground(transitionTimeout: .seconds(5), backgroundTimeRemaining: .milliseconds(29_999_999) / 1000),
            .didEnterBackground(transitionTimeout: .zero, backgroundTimeRemaining: nil),
            .willEnterForeground, .taskGranted(1), .taskDenied(2, .noBackgroundTime),
            .taskExpiring([3], backgroundTimeRemaining: .milliseconds(4_250)), .taskExpiring([4, 5, 6], backgroundTimeRemaining: .zero),
            .taskExpired([]), .taskExpired([7, 8]),
            .didWake(reason: "push", payload: #"{"a":[1,"b"]}"#, backgroundTimeRemaining: .seconds(30)),
            .launchTask(identifier: "org.example.refresh", kind: .refresh, taskID: 9, backgroundTimeRemaining: nil),
        ]
        // As the daemon writes them: one small buffer for all, grown and emptied in turn.
        let scratch = ByteBuffer(capacity: 8)
        for event in events {
            #expect(Wire.eventFrame(event) == VarlinkReply(parameters: Wire.event(event), continues: true).frame, "\(event)")
            #expect(Wire.eventFrame(event, using: scratch) == Wire.eventFrame(event), "\(event)")
            var monitored = Wire.event(event)
            monitored["pid"] = 4242
            #expect(Wire.eventFrame(event, pid: 4242) == VarlinkReply(parameters: monitored, continues: true).frame, "\(event)")
            #expect(Wire.eventFrame(event, pid: 4242, using: scratch) == Wire.eventFrame(event, pid: 4242), "\(event)")
        }
    }
}
