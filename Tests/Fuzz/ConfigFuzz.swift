// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the configuration parser (INI files, --set, time spans and sizes) and
// the policy-file parser, its matcher and globs, on the same input.
// Built by scripts/fuzz together with Sources/BGTaskCore (one module, so no import).
//
// Beyond "no crash": a configuration that loads renders to a file that loads back to the
// same configuration, and every time span or size that parses formats to one that parses
// back to the same value.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfiguration(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    var configuration = Configuration()
    if (try? configuration.apply(fileText: text, source: "fuzz")) != nil, (try? configuration.validate()) != nil {
        let rendered = configuration.rendered()
        var again = Configuration()
        do {
            try again.apply(fileText: rendered, source: "rendered")
        } catch {
            preconditionFailure("rendered configuration does not load: \(error)\n\(rendered)")
        }
        precondition(again.rendered() == rendered, "rendering round trip changed\n\(rendered)")
    }
    // The same bytes as a policy file: parsed or refused with a line inside the file, and
    // matched (globs included) against facts made of its own lines, without crashing.
    do {
        let policy = try AppPolicy(file: "fuzz.policy", text: text, base: Configuration())
        let words = text.split(whereSeparator: { $0 == "\n" || $0 == " " }).prefix(4).map(String.init)
        _ = policy.matches(AppFacts(unit: words.first, executable: words.dropFirst().first, uid: 1000, user: words.last))
    } catch {
        precondition(error.line >= 0 && error.line <= text.split(separator: "\n", omittingEmptySubsequences: false).count,
                     "policy error names line \(error.line) of a shorter file")
    }
    for line in text.split(separator: "\n").prefix(8) {
        var assigned = Configuration()
        _ = try? assigned.apply(assignment: String(line))
        if let span = ConfigurationValue.parseTimeSpan(String(line)) {
            let formatted = ConfigurationValue.formatTimeSpan(span)
            precondition(ConfigurationValue.parseTimeSpan(formatted) == span, "time span \(line) → \(formatted)")
        }
        if let bytes = ConfigurationValue.parseSize(String(line)) {
            let formatted = ConfigurationValue.formatSize(bytes)
            precondition(ConfigurationValue.parseSize(formatted) == bytes, "size \(line) → \(formatted)")
        }
    }
    return 0
}
