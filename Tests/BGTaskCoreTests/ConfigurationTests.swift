// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

@Suite struct ConfigurationTests {
    @Test(arguments: [
        ("30", 30_000_000_000), ("30s", 30_000_000_000), ("500ms", 500_000_000), ("1min 5s", 65_000_000_000),
        ("1min5s", 65_000_000_000), ("1.5s", 1_500_000_000), ("2h", 7_200_000_000_000), ("250us", 250_000),
        ("0", 0), (" 5 s ", 5_000_000_000),
    ] as [(String, Int64)])
    func timeSpansParse(text: String, nanoseconds: Int64) {
        #expect(ConfigurationValue.parseTimeSpan(text)?.nanoseconds == nanoseconds)
    }

    @Test(arguments: ["", "s", "-5s", "5 parsecs", "1e3", "5s,", "..s"])
    func badTimeSpansAreRejected(text: String) {
        #expect(ConfigurationValue.parseTimeSpan(text) == nil)
    }

    @Test func timeSpansPrintAsSystemdDoes() {
        #expect(ConfigurationValue.formatTimeSpan(.seconds(65)) == "1min 5s")
        #expect(ConfigurationValue.formatTimeSpan(.milliseconds(50)) == "50ms")
        #expect(ConfigurationValue.formatTimeSpan(.zero) == "0")
        // Digits written by hand: zeros within and at the end of a part, parts skipped, the longest.
        #expect(ConfigurationValue.formatTimeSpan(.nanoseconds(100_000_000_010)) == "1min 40s 10ns")
        #expect(ConfigurationValue.formatTimeSpan(.nanoseconds(86_400_000_000_001)) == "1d 1ns")
        #expect(ConfigurationValue.formatTimeSpan(.nanoseconds(5_999_993_000)) == "5s 999ms 993us")
        #expect(ConfigurationValue.formatTimeSpan(.nanoseconds(Int64.max)) == "106751d 23h 47min 16s 854ms 775us 807ns")
    }

    /// Found by the fuzzer: a span with nanoseconds printed as "556ns", which did not parse.
    @Test func everyPrintedSpanParsesBack() {
        let span = ConfigurationValue.parseTimeSpan(".2555555555555555555555555555555555555555")!
        #expect(ConfigurationValue.formatTimeSpan(span) == "255ms 555us 556ns")
        #expect(ConfigurationValue.parseTimeSpan(ConfigurationValue.formatTimeSpan(span)) == span)
    }

    /// Found by the fuzzer: past 2^53 ns (104 days) a span summed in `Double`s lost its last
    /// nanoseconds, and one printed did not parse back to itself.
    @Test func longSpansParseToTheNanosecond() {
        let span = ConfigurationValue.parseTimeSpan("777777777.777777777777777777777777777777777777777777777777777777")
        #expect(span?.nanoseconds == 777_777_777_777_777_778)
        let printed = span.map(ConfigurationValue.formatTimeSpan)
        #expect(printed == "9002d 1h 22min 57s 777ms 777us 778ns")
        #expect(printed.flatMap(ConfigurationValue.parseTimeSpan) == span)
        #expect(ConfigurationValue.parseTimeSpan("1w 1ns")?.nanoseconds == 604_800_000_000_001)
        #expect(ConfigurationValue.parseTimeSpan("999999999.9999999994")?.nanoseconds == 999_999_999_999_999_999)
        #expect(ConfigurationValue.parseTimeSpan("999999999.9999999995") == nil)  // rounds to 10^18 ns: past the most
        #expect(ConfigurationValue.parseTimeSpan("99999999999999999999w") == nil)  // past Int64
        #expect(ConfigurationValue.parseTimeSpan("1.") == .seconds(1))
        #expect(ConfigurationValue.parseTimeSpan(".5ms") == .microseconds(500))
        #expect(ConfigurationValue.parseTimeSpan("1.2.3s") == nil)
    }

    @Test func asciiWhitespaceIsTrimmedAndNothingElse() {
        #expect(" \t a b \r\n".trimmingASCIIWhitespace() == "a b")
        #expect(" \r\n\t ".trimmingASCIIWhitespace() == "")
        #expect("".trimmingASCIIWhitespace() == "")
        #expect("\tÉté naïve 😀 ".trimmingASCIIWhitespace() == "Été naïve 😀")
        #expect("\u{A0}x\u{A0}".trimmingASCIIWhitespace() == "\u{A0}x\u{A0}")  // no-break spaces are not ASCII
        #expect(ConfigurationValue.parseSize("\t64K \r") == 65536)
    }

    @Test func sizesParse() {
        #expect(ConfigurationValue.parseSize("64K") == 65536)
        #expect(ConfigurationValue.parseSize("1M") == 1 << 20)
        #expect(ConfigurationValue.parseSize("4096") == 4096)
        #expect(ConfigurationValue.parseSize("2KiB") == 2048)
        #expect(ConfigurationValue.parseSize("K") == nil)
        #expect(ConfigurationValue.parseSize("-1") == nil)
        #expect(ConfigurationValue.formatSize(65536) == "64K")
    }

    @Test func setAppliesAndRejectsWithAReason() throws {
        var config = Configuration()
        try config.apply(assignment: "BackgroundTimeSec=500ms")
        #expect(config.backgroundTime == .milliseconds(500))
        try config.apply(assignment: "TerminateSignal=SIGTERM")
        #expect(config.terminateSignal == .term)
        let before = config
        #expect(throws: ConfigurationError(source: "--set", line: 0, message: "unknown key 'Nope'")) {
            try config.apply(assignment: "Nope=1")
        }
        #expect(throws: ConfigurationError.self) { try config.apply(assignment: "MaxApps=many") }
        #expect(throws: ConfigurationError.self) { try config.apply(assignment: "BackgroundTimeSec") }
        #expect(config == before)
    }

    @Test func crossKeyChecksRunOnceEverythingIsApplied() throws {
        var config = Configuration()
        try config.apply(assignment: "GrantLatencyMinSec=300ms")  // above the default max for a moment
        try config.apply(assignment: "GrantLatencyMaxSec=1s")
        try config.validate()
        try config.apply(assignment: "GrantLatencyMaxSec=100ms")
        #expect(throws: ConfigurationError(source: "configuration", line: 0,
                                           message: "GrantLatencyMinSec=300ms is greater than GrantLatencyMaxSec=100ms")) {
            try config.validate()
        }
    }

    @Test func fileErrorsNameTheLine() {
        var config = Configuration()
        let text = "# comment\n[Background]\nBackgroundTimeSec=10s\n\nExpirationWarningSec=soon\n"
        #expect(throws: ConfigurationError(source: "/etc/x.conf", line: 5,
                                           message: "ExpirationWarningSec: expected a time span such as 30s, 500ms or 1min 5s, got 'soon'")) {
            try config.apply(fileText: text, source: "/etc/x.conf")
        }
        #expect(throws: ConfigurationError(source: "f", line: 1, message: "unknown section [Nope]")) {
            try config.apply(fileText: "[Nope]\n", source: "f")
        }
        #expect(throws: ConfigurationError(source: "f", line: 2, message: "unknown key 'MaxApps' in [Background]")) {
            try config.apply(fileText: "[Background]\nMaxApps=3\n", source: "f")
        }
    }

    @Test func renderedDefaultsParseBackToTheDefaults() throws {
        var config = Configuration()
        config.maxApps = 3
        var parsed = Configuration()
        try parsed.apply(fileText: config.rendered(), source: "rendered")
        #expect(parsed == config)
        #expect(Configuration.keys.count == 29)
    }

    /// Every enum ↔ string table, one test: raw values are unique and round-trip.
    @Test func everyEnumRoundTripsThroughItsString() {
        func check<E: RawRepresentable & CaseIterable>(_: E.Type) where E.RawValue == String {
            let names = E.allCases.map(\.rawValue)
            #expect(Set(names).count == names.count)
            for value in E.allCases { #expect(E(rawValue: value.rawValue)?.rawValue == value.rawValue) }
        }
        check(AppState.self); check(BackgroundPhase.self); check(TaskState.self); check(TaskReason.self)
        check(ActionReason.self); check(AppAction.self); check(SuspendMode.self); check(KeepAwake.self); check(LogKind.self)
        for signal in TerminateSignal.all {
            #expect(TerminateSignal(parsing: signal.description) == signal)
            #expect(TerminateSignal(parsing: String(signal.number)) == signal)
        }
        #expect(TerminateSignal(parsing: "SIGSTOP") == nil)
    }
}
