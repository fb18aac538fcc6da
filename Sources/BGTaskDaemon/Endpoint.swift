// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// The Varlink endpoint: decodes each call's method, hands it to its interface
/// (Endpoint+Service, +App, +Manager), and turns model errors into Varlink errors. Access
/// checks are in Endpoint+Access, who the caller is in Endpoint+Caller. The hot methods'
/// calls, decoded from their bytes or not, are handled in Endpoint+Hot.
extension Daemon {
    func dispatch(_ request: Request, on connection: Connection, at now: Instant,
                  effects: inout [Effect]) throws(VarlinkError) -> Answer {
        do {
            let call: VarlinkCall
            switch request {
            case let .hot(hot): return .hot(try hotCall(hot, on: connection, at: now, effects: &effects))
            case let .general(general): call = general
            }
            if call.upgrade { throw VarlinkError.methodNotImplemented(call.method) }
            switch try Method(qualified: call.method) {
            case let .service(method): return .reply(try serviceCall(method, call))
            case let .app(method): return try appCall(method, call, on: connection, at: now, effects: &effects)
            case let .manager(method): return try managerCall(method, call, on: connection, at: now, effects: &effects)
            }
        } catch let error as BGTaskError {
            throw error.varlink
        } catch let error as VarlinkError {
            throw error
        } catch {
            throw ErrorName.invalidParameter(["parameter": .string("\(error)")])
        }
    }
}

/// A call as it was read: a hot method's, decoded straight from its bytes, or any call.
enum Request {
    case hot(HotCall)
    case general(VarlinkCall)

    var oneway: Bool {
        switch self {
        case let .hot(call): call.oneway
        case let .general(call): call.oneway
        }
    }
}
