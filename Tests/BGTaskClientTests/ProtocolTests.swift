// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Foundation
import Testing
import Varlink

/// BGTaskProtocol is the one table of the wire's names and the client rules' numbers: it
/// matches io.bgtaskd.varlink, libbgtask's copy (bgtask-protocol.h) matches it, and no error
/// name is spelled anywhere else in the products.
@Suite struct ProtocolTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path
    static func read(_ path: String) throws -> String {
        try String(contentsOfFile: repository + "/" + path, encoding: .utf8)
    }

    /// `method Name(` and `error Name (` lines of the interface file, by interface.
    static func declared(_ keyword: String) throws -> [String: Set<String>] {
        var interface = "", found: [String: Set<String>] = [:]
        for line in try read("Sources/BGTaskDaemon/io.bgtaskd.varlink").split(separator: "\n") {
            let words = line.split(whereSeparator: { $0 == " " || $0 == "(" })
            if words.first == "interface", words.count > 1 { interface = String(words[1]) }
            if words.first.map(String.init) == keyword, words.count > 1 { found[interface, default: []].insert(String(words[1])) }
        }
        return found
    }

    @Test func everyErrorNameRoundTripsAndIsDeclared() throws {
        #expect(Set(ErrorName.allCases.map(\.rawValue)).count == ErrorName.allCases.count)
        for name in ErrorName.allCases {
            #expect(ErrorName(rawValue: name.rawValue) == name)
            #expect(ErrorName(name(["x": 1])) == name)
            #expect(name.matches(VarlinkError(name.rawValue)))
            #expect(Interface.allCases.contains { name.rawValue.hasPrefix($0.rawValue + ".") }, "\(name)")
        }
        let errors = try Self.declared("error")
        let ours = Set(ErrorName.allCases.map(\.rawValue).filter { $0.hasPrefix("io.bgtaskd.") })
        let declared = Set(errors.flatMap { interface, names in names.map { "\(interface).\($0)" } })
        #expect(ours == declared)
    }

    @Test func theMethodsAreTheInterfaceFilesMethods() throws {
        let methods = try Self.declared("method")
        #expect(Set(AppMethod.allCases.map(\.rawValue)) == methods[Interface.app.rawValue])
        #expect(Set(ManagerMethod.allCases.map(\.rawValue)) == methods[Interface.manager.rawValue])
        for method in AppMethod.allCases.map(Method.app) + ManagerMethod.allCases.map(Method.manager)
            + ServiceMethod.allCases.map(Method.service) {
            #expect(try Method(qualified: method.qualified) == method)
        }
        #expect(throws: ErrorName.methodNotFound(["method": "io.bgtaskd.App.Nothing"])) { try Method(qualified: "io.bgtaskd.App.Nothing") }
        #expect(throws: ErrorName.interfaceNotFound(["interface": "io.bgtaskd.Nothing"])) { try Method(qualified: "io.bgtaskd.Nothing.Begin") }
    }

    /// libbgtask's bgtask-protocol.h: one `#define NAME value` per line.
    @Test func libbgtasksCopyMatches() throws {
        var defines: [String: String] = [:]
        for line in try Self.read("libbgtask/bgtask-protocol.h").split(separator: "\n") where line.hasPrefix("#define BGTASK_") {
            let parts = line.split(separator: " ", maxSplits: 2).map(String.init)
            if parts.count == 3 { defines[parts[1]] = parts[2].trimmingCharacters(in: CharacterSet(charactersIn: "\"")) }
        }
        let errors = defines.filter { $0.key.hasPrefix("BGTASK_ERROR_") }.values
        #expect(!errors.isEmpty)
        for error in errors { #expect(ErrorName(rawValue: error) != nil, "\(error)") }
        let events = Set(defines.filter { $0.key.hasPrefix("BGTASK_EVENT_") }.values)
        #expect(events == Set(EventName.allCases.map(\.rawValue)))
        let methods = defines.filter { $0.key.hasPrefix("BGTASK_METHOD_") }.values
        for method in methods { #expect(AppMethod(rawValue: method) != nil, "\(method)") }
        #expect(defines["BGTASK_INTERFACE_APP"] == Interface.app.rawValue)
        let numbers = defines.compactMapValues { Int64($0.replacingOccurrences(of: "ULL", with: "")) }
        #expect(numbers["BGTASK_FINISH_MARGIN_NS"] == ClientRules.finishMargin)
        #expect(numbers["BGTASK_RECONNECT_FIRST_NS"] == ClientRules.reconnectFirst)
        #expect(numbers["BGTASK_RECONNECT_MAXIMUM_NS"] == ClientRules.reconnectMaximum)
        #expect(numbers["BGTASK_RESTART_GRACE_NS"] == ClientRules.restartGrace)
        #expect(numbers["BGTASK_MAXIMUM_SECONDS"] == Int64(ClientRules.maximumSeconds))
        #expect(numbers["BGTASK_MAXIMUM_MESSAGE_BYTES"] == Int64(ClientRules.maximumMessageBytes))
        #expect(numbers["BGTASK_MAXIMUM_PENDING_ENDS"] == Int64(ClientRules.maximumPendingEnds))
    }

    /// An error name spelled by hand is one the table does not hold together: only
    /// BGTaskProtocol, the generic Varlink library (Varlink's own errors), the interface file
    /// and libbgtask's checked copy may. The tests spell them on purpose, as an outsider would.
    @Test func noErrorNameIsSpelledOutsideTheProtocol() throws {
        let allowed = ["Sources/BGTaskProtocol/", "Sources/Varlink/", "Sources/BGTaskDaemon/io.bgtaskd.varlink",
                       "libbgtask/bgtask-protocol.h"]
        var offenders: [String] = []
        for root in ["Sources", "Tools", "libbgtask"] {
            guard let walker = FileManager.default.enumerator(atPath: Self.repository + "/" + root) else { continue }
            while let relative = walker.nextObject() as? String {
                let path = root + "/" + relative
                guard [".swift", ".c", ".h"].contains(where: path.hasSuffix), !allowed.contains(where: path.hasPrefix),
                      let text = try? Self.read(path) else { continue }
                for name in ErrorName.allCases where text.contains(name.rawValue) { offenders.append("\(path): \(name.rawValue)") }
            }
        }
        #expect(offenders.isEmpty, "\(offenders)")
    }
}
