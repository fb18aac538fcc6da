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

    /// The qualified names' bytes, to compare with a message's.
    static let names: [(bytes: [UInt8], method: HotMethod)] = allCases.map { (Array($0.method.qualified.utf8), $0) }
}

/// A hot method's call with its fields. Decoded straight from a message's bytes
/// (`init?(flat:in:)`: no dictionary, no `JSON` value, no hash), or from a general call's
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
    init?(flat call: FlatCall, in bytes: UnsafeBufferPointer<UInt8>) {
        let qualified = UnsafeBufferPointer(rebasing: bytes[call.method])
        // Lengths first: every name begins "io.bgtaskd.", a byte-by-byte look went that far.
        guard let method = HotMethod.names.first(where: { entry in
            entry.bytes.count == qualified.count
                && entry.bytes.withUnsafeBufferPointer { memcmp($0.baseAddress!, qualified.baseAddress!, qualified.count) == 0 }
        })?.method else { return nil }
        func text(_ range: Range<Int>) -> String { String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self) }
        func named(_ key: UnsafeBufferPointer<UInt8>, _ name: StaticString) -> Bool {
            key.count == name.utf8CodeUnitCount && key.elementsEqual(UnsafeBufferPointer(start: name.utf8Start, count: key.count))
        }
        var fields: Fields?
        // Each parameter is read into its field; `FlatCall` gave each name once.
        var name: String?, unit: String?, state: String?, reason: String?
        var int: Int64?  // EndTask: taskId; SetAppState: pid
        var bool: Bool?
        let understood = call.forEachParameter(in: bytes) { key, value in
            switch (method, value) {
            case (.beginTask, .null): return named(key, "name") || named(key, "expirationHandler")
            case let (.beginTask, .string(range)) where named(key, "name"): name = text(range)
            case let (.beginTask, .bool(flag)) where named(key, "expirationHandler"): bool = flag
            case let (.endTask, .int(id)) where named(key, "taskId"): int = id
            case (.setAppState, .null): return named(key, "pid") || named(key, "unit") || named(key, "reason")
            case let (.setAppState, .int(pid)) where named(key, "pid"): int = pid
            case let (.setAppState, .string(range)) where named(key, "unit"): unit = text(range)
            case let (.setAppState, .string(range)) where named(key, "state"): state = text(range)
            case let (.setAppState, .string(range)) where named(key, "reason"): reason = text(range)
            default: return false
            }
            return true
        }
        guard understood else { return nil }
        switch method {
        case .beginTask: fields = .beginTask(name: name, expirationHandler: bool)
        case .endTask: fields = int.map { .endTask(taskId: $0) }
        case .getTimeRemaining: fields = call.parameters.isEmpty ? .getTimeRemaining : nil
        case .setAppState:
            guard let state else { return nil }
            switch (int, unit) {
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
