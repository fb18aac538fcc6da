// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc
import Testing

/// What the session agent reads from logind's `PropertiesChanged` (`bgtask_logind_changed`):
/// real sd-bus messages, built as logind sends them (on a bus over a socket pair: a message
/// needs a bus, not a daemon), sealed and read back.
@Suite struct LoginSessionTests {
    /// Builds a sealed `PropertiesChanged` of `interface` with boolean `values` and
    /// `invalidated` names, and returns what `bgtask_logind_changed` makes of it.
    func changed(_ values: [(String, Bool)], of interface: String = "org.freedesktop.login1.Session",
                 invalidated: [String] = [], other: Bool = false) throws -> (found: Int32, locked: Int32, active: Int32) {
        var pair: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
        defer { close(pair[1]) }
        var bus: OpaquePointer?
        try #require(sd_bus_new(&bus) >= 0)
        defer { sd_bus_close_unref(bus) }  // nothing to flush: the other end never answers
        try #require(sd_bus_set_fd(bus, pair[0], pair[0]) >= 0 && sd_bus_start(bus) >= 0)
        var message: OpaquePointer?
        try #require(sd_bus_message_new_signal(bus, &message, "/org/freedesktop/login1/session/_31",
                                               "org.freedesktop.DBus.Properties", "PropertiesChanged") >= 0)
        defer { sd_bus_message_unref(message) }
        var r = sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), interface)
        r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "a")), "{sv}"))
        if other {  // a property of another type first (logind's IdleSinceHint is a t)
            r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "e")), "sv"))
            r = min(r, sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), "IdleSinceHint"))
            r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "v")), "t"))
            var since: UInt64 = 42
            r = min(r, sd_bus_message_append_basic(message, CChar(UInt8(ascii: "t")), &since))
            r = min(r, sd_bus_message_close_container(message))
            r = min(r, sd_bus_message_close_container(message))
        }
        for (name, value) in values {
            r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "e")), "sv"))
            r = min(r, sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), name))
            r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "v")), "b"))
            var flag: Int32 = value ? 1 : 0
            r = min(r, sd_bus_message_append_basic(message, CChar(UInt8(ascii: "b")), &flag))
            r = min(r, sd_bus_message_close_container(message))
            r = min(r, sd_bus_message_close_container(message))
        }
        r = min(r, sd_bus_message_close_container(message))
        r = min(r, sd_bus_message_open_container(message, CChar(UInt8(ascii: "a")), "s"))
        for name in invalidated { r = min(r, sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), name)) }
        r = min(r, sd_bus_message_close_container(message))
        r = min(r, sd_bus_message_seal(message, 1, 0))
        r = min(r, sd_bus_message_rewind(message, 1))
        try #require(r >= 0, "building the message: \(r)")
        var locked: Int32 = -1, active: Int32 = -1
        let found = bgtask_logind_changed(message, &locked, &active)
        return (found, locked, active)
    }

    @Test func aLockCarriesItsValue() throws {
        let lock = try changed([("LockedHint", true)])
        #expect(lock.found == 1 && lock.locked == 1 && lock.active == -1)
        let unlock = try changed([("LockedHint", false)], other: true)
        #expect(unlock.found == 1 && unlock.locked == 0)
        let both = try changed([("Active", false), ("LockedHint", true)], other: true)
        #expect(both.found == 3 && both.locked == 1 && both.active == 0)
    }

    /// Another property's change says nothing of these (no read, no decision); one named
    /// without its value must be read; another interface's is not the session's.
    @Test func whatDoesNotCarryTheValuesSaysSo() throws {
        #expect(try changed([], other: true).found == 0)
        #expect(try changed([("IdleHint", true)]).found == 0)
        #expect(try changed([], invalidated: ["LockedHint"]).found == 4)
        #expect(try changed([("LockedHint", true)], invalidated: ["Active"]).found == 5)
        #expect(try changed([], invalidated: ["IdleHint"]).found == 0)
        #expect(try changed([("LockedHint", true)], of: "org.freedesktop.login1.User").found == 0)
    }
}
