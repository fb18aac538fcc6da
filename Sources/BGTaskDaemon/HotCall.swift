// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Glibc
import Varlink

/// The methods clients call all the time: an app's task calls, and the manager's state
/// changes (a screen lock is one per app).
enum HotMethod: CaseIterable {
    case beginTask, endTask, getTimeRemaining, setAppState

    var method: Method {
        switch self {
        case .beginTask: .app(.beginTask)
        case .endTask: .app(.endTask)
        case .getTimeRemaining: .app(.getTimeRemaining)
        case .setAppState: .manager(.setAppState)
        }
    }

    /// The parameters it takes (`HotField.bit`s).
    var fields: UInt8 {
        switch self {
        case .beginTask: HotField.name.bit | HotField.expirationHandler.bit
        case .endTask: HotField.taskId.bit
        case .getTimeRemaining: 0
        case .setAppState: HotField.pid.bit | HotField.unit.bit | HotField.state.bit | HotField.reason.bit
        }
    }

    /// `method.qualified`, as static text to compare with a message's bytes: a table of
    /// arrays was a lazy global's check and a retain and release of each entry per call.
    var qualifiedName: StaticString {
        switch self {
        case .beginTask: "io.bgtaskd.App.BeginTask"
        case .endTask: "io.bgtaskd.App.EndTask"
        case .getTimeRemaining: "io.bgtaskd.App.GetTimeRemaining"
        case .setAppState: "io.bgtaskd.Manager.SetAppState"
        }
    }

    /// The method whose qualified name `bytes` are.
    init?(named bytes: UnsafeBufferPointer<UInt8>) {
        for method in Self.allCases {
            let name = method.qualifiedName
            if name.utf8CodeUnitCount == bytes.count, memcmp(name.utf8Start, bytes.baseAddress!, bytes.count) == 0 {
                self = method
                return
            }
        }
        return nil
    }
}

/// A parameter of a hot method, by name.
enum HotField: UInt8 {
    case name, expirationHandler, taskId, pid, unit, state, reason

    var bit: UInt8 { 1 << rawValue }

    /// Its name in a call.
    var key: StaticString {
        switch self {
        case .name: "name"
        case .expirationHandler: "expirationHandler"
        case .taskId: "taskId"
        case .pid: "pid"
        case .unit: "unit"
        case .state: "state"
        case .reason: "reason"
        }
    }

    /// The field `key` names, if a hot method has one so named.
    init?(named key: UnsafeBufferPointer<UInt8>) {
        // By length, then one comparison.
        let field: HotField
        switch key.count {
        case 3: field = .pid
        case 4: field = key[0] == UInt8(ascii: "n") ? .name : .unit
        case 5: field = .state
        case 6: field = key[0] == UInt8(ascii: "t") ? .taskId : .reason
        case 17: field = .expirationHandler
        default: return nil
        }
        guard memcmp(key.baseAddress!, field.key.utf8Start, key.count) == 0 else { return nil }
        self = field
    }
}

/// A hot method's call with its fields. Decoded straight from a message's bytes
/// (`init?(flat:)`: no dictionary, no `JSON` value, no hash), or from a general call's
/// parameters (`init(_:general:)`, which throws what the general path throws): either way
/// it reaches the same handler (`Daemon.hotCall`), so the two cannot answer differently.
struct HotCall {
    enum Fields: Equatable {
        case beginTask(name: String?, expirationHandler: Bool?)
        case endTask(taskId: Int64)
        case getTimeRemaining
        case setAppState(target: AppTarget, state: String, reason: String?)
    }

    var fields: Fields
    var more: Bool
    var oneway: Bool

    /// A general call to `method`, its parameters checked by name and type.
    init(_ method: HotMethod, general call: VarlinkCall) throws(VarlinkError) {
        switch method {
        case .beginTask:
            let parameters = try Parameters(call.parameters, allowed: ["name", "expirationHandler"])
            fields = .beginTask(name: try parameters.optionalString("name"),
                                expirationHandler: try parameters.optionalBool("expirationHandler"))
        case .endTask:
            fields = .endTask(taskId: try Parameters(call.parameters, allowed: [Field.taskId]).int(Field.taskId))
        case .getTimeRemaining:
            _ = try Parameters(call.parameters, allowed: [])
            fields = .getTimeRemaining
        case .setAppState:
            let parameters = try Parameters(call.parameters, allowed: ["pid", "unit", "state", "reason"])
            fields = .setAppState(target: try parameters.target(), state: try parameters.string("state"),
                                  reason: try parameters.optionalString("reason"))
        }
        more = call.more
        oneway = call.oneway
    }

    /// A flat call (`FlatCall`) to a hot method whose parameters are all it takes, each of
    /// the right type: anything else (another method, a stray or mistyped parameter, pid
    /// and unit both) is `nil`, for the general path to answer.
    init?(flat bytes: UnsafeBufferPointer<UInt8>) {
        func text(_ range: Range<Int>) -> String { String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self) }
        // Each parameter is read into its field as the message is read, before its method
        // is known (it may come last); `given` says which were, for the method's check.
        // `FlatCall` gives each name once.
        var given: UInt8 = 0
        var name: String?, unit: String?, state: String?, reason: String?
        var taskId: Int64?, pid: Int64?, expirationHandler: Bool?
        let flat = FlatCall(bytes) { key, value in
            guard let field = HotField(named: key) else { return false }
            given |= field.bit
            switch (field, value) {
            case (.name, .null), (.expirationHandler, .null), (.pid, .null), (.unit, .null), (.reason, .null): break
            case let (.name, .string(range)): name = text(range)
            case let (.expirationHandler, .bool(flag)): expirationHandler = flag
            case let (.taskId, .int(id)): taskId = id
            case let (.pid, .int(number)): pid = number
            case let (.unit, .string(range)): unit = text(range)
            case let (.state, .string(range)): state = text(range)
            case let (.reason, .string(range)): reason = text(range)
            default: return false
            }
            return true
        }
        guard let call = flat else { return nil }
        // Lengths first: every name begins "io.bgtaskd.", a byte-by-byte look went that far.
        guard let method = HotMethod(named: UnsafeBufferPointer(rebasing: bytes[call.method])),
              given & ~method.fields == 0 else { return nil }
        let fields: Fields?
        switch method {
        case .beginTask: fields = .beginTask(name: name, expirationHandler: expirationHandler)
        case .endTask: fields = taskId.map { .endTask(taskId: $0) }
        case .getTimeRemaining: fields = .getTimeRemaining
        case .setAppState:
            guard let state else { return nil }
            switch (pid, unit) {
            case let (pid?, nil) where pid > 0 && pid <= Int64(Int32.max):
                fields = .setAppState(target: .pid(Int32(pid)), state: state, reason: reason)
            case let (nil, unit?): fields = .setAppState(target: .unit(unit), state: state, reason: reason)
            default: return nil
            }
        }
        guard let fields else { return nil }
        self.fields = fields
        more = call.more
        oneway = call.oneway
    }
}
