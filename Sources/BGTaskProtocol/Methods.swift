// SPDX-License-Identifier: Apache-2.0
import Varlink

/// The three interfaces bgtaskd serves (io.bgtaskd.varlink, and Varlink's own).
public enum Interface: String, CaseIterable, Sendable {
    case service = "org.varlink.service"
    case app = "io.bgtaskd.App"
    case manager = "io.bgtaskd.Manager"
}

/// `org.varlink.service`: what every Varlink service answers.
public enum ServiceMethod: String, CaseIterable, Sendable {
    case getInfo = "GetInfo"
    case getInterfaceDescription = "GetInterfaceDescription"
}

/// `io.bgtaskd.App`: an app's own calls, about itself.
public enum AppMethod: String, CaseIterable, Sendable {
    case subscribe = "Subscribe"
    case beginTask = "BeginTask"
    case endTask = "EndTask"
    case getTimeRemaining = "GetTimeRemaining"
    case finishBackgroundTransition = "FinishBackgroundTransition"
    case finishWake = "FinishWake"
    case submitTaskRequest = "SubmitTaskRequest"
    case cancelTaskRequest = "CancelTaskRequest"
    case cancelAllTaskRequests = "CancelAllTaskRequests"
    case getPendingTaskRequests = "GetPendingTaskRequests"
    case setTaskCompleted = "SetTaskCompleted"

    /// Whether the call only reads (answered even when the state cannot be written).
    public var reads: Bool { self == .getTimeRemaining || self == .getPendingTaskRequests }
}

/// `io.bgtaskd.Manager`: the session manager's and the administrator's calls.
public enum ManagerMethod: String, CaseIterable, Sendable {
    case setAppState = "SetAppState"
    case listApps = "ListApps"
    case listTasks = "ListTasks"
    case getStatus = "GetStatus"
    case getHistory = "GetHistory"
    case monitor = "Monitor"
    case terminate = "Terminate"
    case wake = "Wake"
    case expire = "Expire"
    case getPolicy = "GetPolicy"
    case reload = "Reload"
    case listTaskRequests = "ListTaskRequests"
    case launchTask = "LaunchTask"
}

/// A method of one of the interfaces, as a call names it.
public enum Method: Equatable, Sendable {
    case service(ServiceMethod)
    case app(AppMethod)
    case manager(ManagerMethod)

    /// Every method by its qualified name: one hash per call, no split (this is on every
    /// call's path; a String enum's `init(rawValue:)` compares case by case).
    private static let byName: [String: Method] = Dictionary(uniqueKeysWithValues:
        (ServiceMethod.allCases.map(Method.service) + AppMethod.allCases.map(Method.app)
            + ManagerMethod.allCases.map(Method.manager)).map { ($0.qualified, $0) })

    /// The method a fully qualified name means; the error names what is unknown: the
    /// interface (`InterfaceNotFound`) or the method in it (`MethodNotFound`).
    public init(qualified name: String) throws(VarlinkError) {
        if let known = Self.byName[name] {
            self = known
            return
        }
        let (interface, member) = VarlinkCall.split(name)
        switch Interface(rawValue: interface) {
        case .service?: if let m = ServiceMethod(rawValue: member) { self = .service(m); return }
        case .app?: if let m = AppMethod(rawValue: member) { self = .app(m); return }
        case .manager?: if let m = ManagerMethod(rawValue: member) { self = .manager(m); return }
        case nil: throw .interfaceNotFound(interface)
        }
        throw .methodNotFound(name)
    }

    public var qualified: String {
        switch self {
        case let .service(m): "\(Interface.service.rawValue).\(m.rawValue)"
        case let .app(m): "\(Interface.app.rawValue).\(m.rawValue)"
        case let .manager(m): "\(Interface.manager.rawValue).\(m.rawValue)"
        }
    }
}

extension VarlinkCall {
    public init(_ method: AppMethod, parameters: [String: JSON] = [:], more: Bool = false) {
        self.init(method: Method.app(method).qualified, parameters: parameters, more: more)
    }

    public init(_ method: ManagerMethod, parameters: [String: JSON] = [:], more: Bool = false) {
        self.init(method: Method.manager(method).qualified, parameters: parameters, more: more)
    }
}
