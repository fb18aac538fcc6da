// SPDX-License-Identifier: Apache-2.0
/// A method call: `{"method", "parameters", "more", "oneway", "upgrade"}`.
public struct VarlinkCall: Equatable, Sendable {
    /// Fully qualified: `io.bgtaskd.App.BeginTask`.
    public var method: String
    public var parameters: [String: JSON]
    /// The caller accepts several replies (`"more": false` is the same as absent).
    public var more: Bool
    /// The caller wants no reply.
    public var oneway: Bool
    /// The caller asks to leave Varlink after the reply (not supported by bgtaskd).
    public var upgrade: Bool

    public init(method: String, parameters: [String: JSON] = [:], more: Bool = false, oneway: Bool = false,
                upgrade: Bool = false) {
        self.method = method
        self.parameters = parameters
        self.more = more
        self.oneway = oneway
        self.upgrade = upgrade
    }

    /// The interface part of `method`: everything before the last dot.
    public var interface: String { Self.split(method).interface }

    /// The method's own name: everything after the last dot.
    public var member: String { Self.split(method).member }

    /// Splits on the last dot, by bytes (a Character walk costs more than the whole call).
    public static func split(_ method: String) -> (interface: String, member: String) {
        let bytes = method.utf8
        guard let dot = bytes.lastIndex(of: UInt8(ascii: ".")) else { return ("", method) }
        return (String(method[..<dot]), String(method[method.utf8.index(after: dot)...]))
    }

    /// Decodes a message; `nil` when it is not a call object.
    public init(message: JSON) throws(VarlinkProtocolError) {
        guard let object = message.objectValue else { throw .notAnObject }
        guard let method = object["method"]?.stringValue, !method.isEmpty else { throw .missingMethod }
        var parameters: [String: JSON] = [:]
        switch object["parameters"] {
        case nil, .null?: break
        case let .object(members)?: parameters = members
        default: throw .badField("parameters")
        }
        func flag(_ name: String) throws(VarlinkProtocolError) -> Bool {
            switch object[name] {
            case nil, .null?: return false
            case let .bool(value)?: return value
            default: throw .badField(name)
            }
        }
        self.init(method: method, parameters: parameters, more: try flag("more"), oneway: try flag("oneway"),
                  upgrade: try flag("upgrade"))
    }

    /// The call as a JSON object.
    public var json: JSON {
        var object: [String: JSON] = ["method": .string(method)]
        if !parameters.isEmpty { object["parameters"] = .object(parameters) }
        if more { object["more"] = .bool(true) }
        if oneway { object["oneway"] = .bool(true) }
        if upgrade { object["upgrade"] = .bool(true) }
        return .object(object)
    }
}

/// A reply: `{"parameters", "continues", "error"}`.
public struct VarlinkReply: Equatable, Sendable {
    public var parameters: [String: JSON]
    /// More replies to this call follow.
    public var continues: Bool
    /// The error's qualified name; `parameters` then describe it.
    public var error: String?

    public init(parameters: [String: JSON] = [:], continues: Bool = false, error: String? = nil) {
        self.parameters = parameters
        self.continues = continues
        self.error = error
    }

    /// An error reply.
    public init(error: VarlinkError) {
        self.init(parameters: error.parameters, continues: false, error: error.name)
    }

    public init(message: JSON) throws(VarlinkProtocolError) {
        guard let object = message.objectValue else { throw .notAnObject }
        var parameters: [String: JSON] = [:]
        switch object["parameters"] {
        case nil, .null?: break
        case let .object(members)?: parameters = members
        default: throw .badField("parameters")
        }
        let continues: Bool
        switch object["continues"] {
        case nil, .null?: continues = false
        case let .bool(value)?: continues = value
        default: throw .badField("continues")
        }
        let error: String?
        switch object["error"] {
        case nil, .null?: error = nil
        case let .string(name)?: error = name
        default: throw .badField("error")
        }
        self.init(parameters: parameters, continues: continues, error: error)
    }

    public var json: JSON {
        var object: [String: JSON] = ["parameters": .object(parameters)]
        if continues { object["continues"] = .bool(true) }
        if let error { object["error"] = .string(error) }
        return .object(object)
    }

    /// Appends `json`'s text (keys in order: continues, error, parameters) without building
    /// the outer object: a reply goes out for every call.
    public func write(to out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        if continues { out.append(contentsOf: "\"continues\":true,".utf8) }
        if let error {
            out.append(contentsOf: "\"error\":".utf8)
            JSON.writeString(error, to: &out)
            out.append(UInt8(ascii: ","))
        }
        out.append(contentsOf: "\"parameters\":".utf8)
        JSON.writeObject(parameters, to: &out)
        out.append(UInt8(ascii: "}"))
    }

    /// The reply's bytes on the wire, NUL included.
    public var frame: [UInt8] {
        var out: [UInt8] = []
        write(to: &out)
        out.append(0)
        return out
    }
}

/// A message that is JSON but not a Varlink call or reply.
public enum VarlinkProtocolError: Error, Equatable, Sendable, CustomStringConvertible {
    case notAnObject
    case missingMethod
    case badField(String)

    public var description: String {
        switch self {
        case .notAnObject: "message is not a JSON object"
        case .missingMethod: "message has no method"
        case let .badField(name): "field '\(name)' has the wrong type"
        }
    }
}

extension JSON {
    /// The message's bytes on the wire, NUL included.
    public var varlinkFrame: [UInt8] {
        var out: [UInt8] = []
        write(to: &out)
        out.append(0)
        return out
    }
}
