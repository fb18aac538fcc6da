// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskProtocol
import Varlink

/// The Varlink endpoint: decodes each call's method, hands it to its interface
/// (Endpoint+Service, +App, +Manager), and turns model errors into Varlink errors. Access
/// checks are in Endpoint+Access, who the caller is in Endpoint+Caller.
extension Daemon {
    func dispatch(_ call: VarlinkCall, on connection: Connection, at now: Instant,
                  effects: inout [Effect]) throws(VarlinkError) -> Answer {
        do {
            switch try Method(qualified: call.method) {
            case let .service(method): return .reply(try serviceCall(method, call))
            case let .app(method): return .reply(try appCall(method, call, on: connection, at: now, effects: &effects))
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
