// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Testing

@Suite struct HostTests {
    /// History entries' times: UTC, milliseconds, always 24 bytes, before 1970 too.
    @Test func rfc3339IsUTCToTheMillisecond() {
        #expect(Host.rfc3339(0) == "1970-01-01T00:00:00.000Z")
        #expect(Host.rfc3339(1_796_000_000_123_456_789) == "2026-11-30T00:53:20.123Z")
        #expect(Host.rfc3339(951_782_400_999_999_999) == "2000-02-29T00:00:00.999Z")
        #expect(Host.rfc3339(-1) == "1969-12-31T23:59:59.999Z")
    }
}
