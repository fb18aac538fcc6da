// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// What scheduled requests may require, read from the system and followed by events, never
/// polled: external power from the power-supply class (`/sys/class/power_supply/*/type` and
/// `online`; re-read on a `power_supply` uevent, or on an inotify event where the directory
/// is a test's own), a network as "a default route exists" (`/proc/net/route`,
/// `/proc/net/ipv6_route`; re-read on an rtnetlink route change). What the daemon sees is
/// its own network namespace.
public final class SystemConditions {
    public let powerSupplyPath: String
    /// Readable when something may have changed: call `changed()`.
    public private(set) var descriptors: [FileDescriptor] = []

    public init(powerSupplyPath: String) {
        self.powerSupplyPath = powerSupplyPath
        // Each source is best effort: one that cannot be watched is read at start only.
        let uevents = bgtask_netlink_listen(NETLINK_KOBJECT_UEVENT, 1)
        if uevents >= 0 { descriptors.append(FileDescriptor(uevents)) }
        let routes = bgtask_netlink_listen(NETLINK_ROUTE, bgtask_route_groups())
        if routes >= 0 { descriptors.append(FileDescriptor(routes)) }
        let inotify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        if inotify >= 0 {
            let mask = UInt32(IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB)
            _ = inotify_add_watch(inotify, powerSupplyPath, mask)
            for supply in Self.entries(powerSupplyPath) { _ = inotify_add_watch(inotify, powerSupplyPath + "/" + supply, mask) }
            descriptors.append(FileDescriptor(inotify))
        }
    }

    /// Drains `descriptor` (it was readable); the caller then reads the conditions again.
    public func drain(_ descriptor: FileDescriptor) {
        while let bytes = try? descriptor.readAvailable(upTo: 65536), !bytes.isEmpty {}
    }

    /// On external power: a Mains or USB supply online, or no battery at all (a desktop,
    /// a server, a VM: nothing runs on battery there).
    public var externalPower: Bool {
        var sawBattery = false
        for supply in Self.entries(powerSupplyPath) {
            let type = Self.word(powerSupplyPath + "/" + supply + "/type")
            if type == "Battery" { sawBattery = true }
            if type == "Mains" || type == "USB", Self.word(powerSupplyPath + "/" + supply + "/online") == "1" { return true }
        }
        return !sawBattery
    }

    /// A default route (IPv4 `00000000` destination with mask `00000000`, or IPv6 `::/0`
    /// other than the unreachable one the kernel keeps on `lo`).
    public static var network: Bool {
        if let text = try? readFile("/proc/net/route") {
            for line in String(decoding: text, as: UTF8.self).split(separator: "\n").dropFirst() {
                let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
                if fields.count > 7, fields[1] == "00000000", fields[7] == "00000000" { return true }
            }
        }
        if let text = try? readFile("/proc/net/ipv6_route") {
            for line in String(decoding: text, as: UTF8.self).split(separator: "\n") {
                let fields = line.split(separator: " ")
                // destination ::, prefix 0, device not lo, flags without RTF_REJECT (0x0200)
                if fields.count >= 10, fields[0] == "00000000000000000000000000000000", fields[1] == "00",
                   fields[9] != "lo", let flags = UInt32(fields[8], radix: 16), flags & 0x0200 == 0 { return true }
            }
        }
        return false
    }

    static func entries(_ directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir), names.count < 256 {
            let name = entryName(entry)
            if !name.hasPrefix(".") { names.append(name) }
        }
        return names.sorted()
    }

    static func word(_ path: String) -> String? {
        guard let bytes = try? readFile(path), bytes.count < 4096 else { return nil }
        return String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: " \n")
    }
}

private extension String {
    func trimmingCharacters(in set: String) -> String {
        var scalars = Substring(self)
        while let first = scalars.first, set.contains(first) { scalars.removeFirst() }
        while let last = scalars.last, set.contains(last) { scalars.removeLast() }
        return String(scalars)
    }
}
