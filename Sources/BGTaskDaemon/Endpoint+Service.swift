// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import Varlink

/// `org.varlink.service`: what the service is and its interfaces' text.
extension Daemon {
    func serviceCall(_ method: ServiceMethod, _ call: VarlinkCall) throws -> VarlinkReply {
        switch method {
        case .getInfo:
            _ = try Parameters(call.parameters, allowed: [])
            return VarlinkReply(parameters: [
                "vendor": .string("bgtaskd"), "product": .string("bgtaskd"),
                // No URL: the project has no public home yet, and GetInfo says only what is true.
                "version": .string(InterfaceDescription.version), "url": .string(""),
                "interfaces": .array(Interface.allCases.map { .string($0.rawValue) }),
            ])
        case .getInterfaceDescription:
            let parameters = try Parameters(call.parameters, allowed: ["interface"])
            let name = try parameters.string("interface")
            guard let text = InterfaceDescription.blocks[name] else { throw VarlinkError.interfaceNotFound(name) }
            return VarlinkReply(parameters: ["description": .string(text)])
        }
    }
}
