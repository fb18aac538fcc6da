// SPDX-License-Identifier: Apache-2.0
/// A Varlink error reply: a qualified name and its parameters.
public struct VarlinkError: Error, Equatable, Sendable, CustomStringConvertible {
    public var name: String
    public var parameters: [String: JSON]

    public init(_ name: String, parameters: [String: JSON] = [:]) {
        self.name = name
        self.parameters = parameters
    }

    /// `org.varlink.service.InterfaceNotFound`.
    public static func interfaceNotFound(_ interface: String) -> VarlinkError {
        VarlinkError("org.varlink.service.InterfaceNotFound", parameters: ["interface": .string(interface)])
    }

    /// `org.varlink.service.MethodNotFound`.
    public static func methodNotFound(_ method: String) -> VarlinkError {
        VarlinkError("org.varlink.service.MethodNotFound", parameters: ["method": .string(method)])
    }

    /// `org.varlink.service.MethodNotImplemented` (e.g. `upgrade`).
    public static func methodNotImplemented(_ method: String) -> VarlinkError {
        VarlinkError("org.varlink.service.MethodNotImplemented", parameters: ["method": .string(method)])
    }

    /// `org.varlink.service.InvalidParameter`, naming the parameter.
    public static func invalidParameter(_ parameter: String) -> VarlinkError {
        VarlinkError("org.varlink.service.InvalidParameter", parameters: ["parameter": .string(parameter)])
    }

    /// `org.varlink.service.ExpectedMore`: the method streams and needs `"more": true`.
    public static let expectedMore = VarlinkError("org.varlink.service.ExpectedMore")

    /// `org.varlink.service.PermissionDenied`.
    public static let permissionDenied = VarlinkError("org.varlink.service.PermissionDenied")

    public var description: String {
        parameters.isEmpty ? name : "\(name) \(JSON.object(parameters).serialized)"
    }
}
