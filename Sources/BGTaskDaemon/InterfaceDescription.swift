// SPDX-License-Identifier: Apache-2.0
/// The interface text served by `org.varlink.service.GetInterfaceDescription`, from the
/// repository's `io.bgtaskd.varlink`, embedded at build time.
enum InterfaceDescription {
    static let version = "0.1.0"

    /// The whole file, as written.
    static let file = String(decoding: PackageResources.io_bgtaskd_varlink, as: UTF8.self)

    /// Each interface's block of the file, verbatim: from the comment above its
    /// `interface` line to just before the next block.
    static let blocks: [String: String] = {
        let lines = file.split(separator: "\n", omittingEmptySubsequences: false)
        var starts: [(name: String, line: Int)] = []
        for (index, line) in lines.enumerated() where line.hasPrefix("interface ") {
            var start = index
            while start > 0, lines[start - 1].hasPrefix("#") { start -= 1 }
            starts.append((String(line.dropFirst("interface ".count)), start))
        }
        var result: [String: String] = [:]
        for (position, entry) in starts.enumerated() {
            let end = position + 1 < starts.count ? starts[position + 1].line : lines.count
            var text = lines[entry.line..<end].joined(separator: "\n")
            while text.hasSuffix("\n\n") { text.removeLast() }
            if !text.hasSuffix("\n") { text += "\n" }
            result[entry.name] = text
        }
        result[service] = serviceText
        return result
    }()

    static let service = "org.varlink.service"

    /// The standard service interface (varlink.org).
    static let serviceText = """
    # The Varlink Service Interface is provided by every varlink service. It
    # describes the service and the interfaces it implements.
    interface org.varlink.service

    # Get a list of all the interfaces a service provides and information
    # about the implementation.
    method GetInfo() -> (
      vendor: string,
      product: string,
      version: string,
      url: string,
      interfaces: []string
    )

    # Get the description of an interface that is implemented by this service.
    method GetInterfaceDescription(interface: string) -> (description: string)

    # The requested interface was not found.
    error InterfaceNotFound (interface: string)

    # The requested method was not found
    error MethodNotFound (method: string)

    # The interface defines the requested method, but the service does not
    # implement it.
    error MethodNotImplemented (method: string)

    # One of the passed parameters is invalid.
    error InvalidParameter (parameter: string)

    # Client is denied access
    error PermissionDenied ()

    # Method is expected to be called with 'more' set to true, but wasn't
    error ExpectedMore ()

    """
}
