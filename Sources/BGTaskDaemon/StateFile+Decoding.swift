// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// Reading the state file back: every value checked as when it was first received (the file
/// is trusted no further).
extension StateFile {
    // MARK: Decoding

    static func int(_ value: JSON?) throws -> Int64 {
        guard let number = value?.intValue else { throw Malformed(description: "expected an integer") }
        return number
    }

    static func string(_ value: JSON?) throws -> String {
        guard let text = value?.stringValue else { throw Malformed(description: "expected a string") }
        return text
    }

    /// A command name as the daemon writes them: at most 64 bytes, escaped (no control
    /// characters). Anything else is escaped again rather than printed raw, and cut to the
    /// same 64 bytes: what is written back reads back the same (the `state` fuzz target
    /// found a command escaped past 64 bytes, kept once, refused at the next start).
    static func command(_ value: JSON?) throws -> String {
        let text = try string(value)
        guard text.utf8.count <= 64 else { throw Malformed(description: "command name too long") }
        guard text.containsControlCharacters else { return text }
        var escaped = String.UnicodeScalarView()
        var bytes = 0
        for scalar in text.cEscaped.unicodeScalars {
            bytes += UTF8.width(scalar)
            guard bytes <= 64 else { break }
            escaped.append(scalar)
        }
        return String(escaped)
    }

    /// A unit's cgroup path, checked as when it was found: the file is trusted no further.
    static func optionalUnit(_ value: JSON?) throws -> String? {
        guard let value else { return nil }
        let path = try string(value)
        guard path.hasPrefix("/"), path.utf8.count <= 4096, !path.containsControlCharacters,
              !path.split(separator: "/").contains(".."),
              AppUnit.of(cgroupPath: path, daemonUnit: nil) == path else {
            throw Malformed(description: "'\(path.cEscaped)' is not a unit's cgroup path")
        }
        return path
    }

    static func instant(_ value: JSON?) throws -> Instant { Instant(nanoseconds: try int(value)) }

    static func optionalInstant(_ value: JSON?) throws -> Instant? {
        value == nil || value == .null ? nil : try instant(value)
    }

    static func value<T: RawRepresentable<String>>(_ type: T.Type, _ json: JSON?) throws -> T {
        let text = try string(json)
        guard let value = T(rawValue: text) else { throw Malformed(description: "unknown \(T.self) '\(text)'") }
        return value
    }

    static func identity(_ value: JSON?) throws -> ProcessIdentity {
        let pid = try int(value?["pid"])
        guard pid > 1, pid <= Int64(Int32.max) else { throw Malformed(description: "pid \(pid) out of range") }
        // Files written before pidfs identities have no "ino": 0, filled in on restore.
        let inode = value?["ino"] == nil ? 0 : UInt64(bitPattern: try int(value?["ino"]))
        return ProcessIdentity(pid: Int32(pid), startTime: UInt64(bitPattern: try int(value?["start"])), inode: inode)
    }

    /// A termination: files of daemons before the grace ran from the signal have no `grace`,
    /// before a restart sent an unsent signal no `unsent` (taken as sent), before the
    /// processes signalled were saved no `signalled`, before the cgroup killed whole was
    /// saved no `cgroup`.
    static func termination(_ value: JSON) throws -> Termination {
        let unsent = try value["unsent"].map { json in
            let number = try int(json)
            guard let signal = TerminateSignal(parsing: String(number)), signal != .kill else {
                throw Malformed(description: "unsent signal \(number) is not a catchable TerminateSignal")
            }
            return signal
        }
        var signalled: [ProcessIdentity] = []
        if let json = value["signalled"] {
            guard let list = json.arrayValue else { throw Malformed(description: "signalled: expected an array") }
            signalled = try list.map { try identity($0) }
        }
        return Termination(killAt: try instant(value["killAt"]), uid: try uid(value["uid"]),
                           grace: value["grace"] == nil ? nil : .nanoseconds(try int(value["grace"])), unsent: unsent,
                           signalled: signalled, cgroup: try value["cgroup"].map(terminatedCgroup))
    }

    /// A terminated app's cgroup: a path below the mount point with no `..` in it (what the
    /// daemon writes `cgroup.kill` under), its inode, its invocation in hex (at most 64 bytes,
    /// what `Cgroup.instance` reads).
    static func terminatedCgroup(_ value: JSON) throws -> TerminatedCgroup {
        let path = try string(value["path"])
        guard path.hasPrefix("/"), path != "/", path.utf8.count <= 4096, !path.containsControlCharacters,
              !path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().contains(where: { $0.isEmpty || $0 == "." || $0 == ".." })
        else { throw Malformed(description: "'\(path.cEscaped)' is not a cgroup's path") }
        let invocation = try value["invocation"].map { json -> [UInt8] in
            let text = Array(try string(json).utf8)
            guard text.count % 2 == 0, text.count <= 128, let bytes = hexBytes(text) else {
                throw Malformed(description: "cgroup invocation: expected at most 64 bytes in hex")
            }
            return bytes
        }
        return TerminatedCgroup(path: path, inode: UInt64(bitPattern: try int(value["ino"])), invocation: invocation)
    }

    /// Pairs of hex digits as bytes; nil if any is not one.
    private static func hexBytes(_ text: [UInt8]) -> [UInt8]? {
        func digit(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: text.count, by: 2) {
            guard let high = digit(text[index]), let low = digit(text[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    static func uid(_ value: JSON?) throws -> UInt32 {
        let uid = try int(value)
        guard let result = UInt32(exactly: uid) else { throw Malformed(description: "uid \(uid) out of range") }
        return result
    }

    static func app(_ value: JSON) throws -> SavedApp {
        SavedApp(identity: try identity(value), uid: try uid(value["uid"]), command: try command(value["command"]),
                 unit: try optionalUnit(value["unit"]),
                 containment: value["containment"] == nil ? .tree : try Self.value(Containment.self, value["containment"]),
                 state: try Self.value(AppState.self, value["state"]),
                 phase: value["phase"] == nil ? nil : try Self.value(BackgroundPhase.self, value["phase"]),
                 deadline: try optionalInstant(value["deadline"]),
                 transitionDeadline: try optionalInstant(value["transitionDeadline"]),
                 warned: value["warned"]?.boolValue ?? false).withQuota(
                    key: value["quotaKey"] == nil ? nil : try string(value["quotaKey"]),
                    holdingSince: try optionalInstant(value["holdingSince"]))
            .withRequests(key: value["requestKey"] == nil ? nil : try key(value["requestKey"]))
    }

    /// What can be read of an app line refused as a whole, as a foreground app: its process
    /// and uid (checked against the live process at restore, as every app's), and what else
    /// reads; `nil` when not even those do.
    static func foregroundApp(_ value: JSON) -> SavedApp? {
        guard let identity = try? identity(value), let uid = try? uid(value["uid"]) else { return nil }
        return SavedApp(identity: identity, uid: uid, command: (try? command(value["command"])) ?? "?",
                        unit: (try? optionalUnit(value["unit"])) ?? nil,
                        containment: (try? Self.value(Containment.self, value["containment"])) ?? .tree,
                        state: .foreground, phase: nil, deadline: nil, transitionDeadline: nil, warned: false)
    }

    /// An app key (quota, requests): bounded, free of control characters.
    static func key(_ value: JSON?) throws -> String {
        let key = try string(value)
        guard key.utf8.count <= 8192, !key.containsControlCharacters else { throw Malformed(description: "bad app key") }
        return key
    }

    /// A key's scheduled requests, checked as when they were submitted.
    static func requests(_ value: JSON) throws -> (String, SavedRequests?) {
        let key = try key(value["key"])
        guard value["requests"] != nil else { return (key, nil) }
        let requests = try (value["requests"]?.arrayValue ?? []).prefix(11).map { item throws -> TaskRequest in
            let interval = try optionalInstant(item["interval"]).map { instant throws -> Duration in
                // Bounded as a submission's is: written back as nanoseconds, as here.
                guard instant.nanoseconds >= 0, instant.nanoseconds <= Int64(TaskRequest.maximumSeconds) * 1_000_000_000 else {
                    throw Malformed(description: "request interval \(instant.nanoseconds) ns out of range")
                }
                return .nanoseconds(instant.nanoseconds)
            }
            return TaskRequest(identifier: try TaskRequest.validate(identifier: try string(item["identifier"])),
                               kind: try Self.value(TaskRequestKind.self, item["kind"]),
                               earliestBegin: try instant(item["earliestBegin"]),
                               requiresExternalPower: item["power"]?.boolValue ?? false,
                               requiresNetworkConnectivity: item["network"]?.boolValue ?? false,
                               interval: interval.map { max($0, TaskRequest.minimumInterval) })
        }
        let launches = try (value["launches"]?.arrayValue ?? []).suffix(BackgroundModel.maximumCountedLaunches).map { try instant($0) }
        return (key, SavedRequests(uid: try uid(value["uid"]), requests: requests, lastSeen: try instant(value["lastSeen"]),
                                   launches: launches))
    }

    static func encode(_ book: SavedRequests?, key: String) -> JSON {
        guard let book else { return .object(["key": .string(key)]) }
        return .object([
            "key": .string(key), "uid": .int(Int64(book.uid)), "lastSeen": .int(book.lastSeen.nanoseconds),
            "launches": .array(book.launches.map { .int($0.nanoseconds) }),
            "requests": .array(book.requests.map { request in
                var object: [String: JSON] = [
                    "identifier": .string(request.identifier), "kind": .string(request.kind.rawValue),
                    "earliestBegin": .int(request.earliestBegin.nanoseconds),
                ]
                if request.requiresExternalPower { object["power"] = .bool(true) }
                if request.requiresNetworkConnectivity { object["network"] = .bool(true) }
                if let interval = request.interval { object["interval"] = .int(interval.nanoseconds) }
                return .object(object)
            }),
        ])
    }

    static func task(_ value: JSON) throws -> SavedTask {
        let id = try int(value["id"])
        guard id > 0 else { throw Malformed(description: "task id \(id) out of range") }
        // Names are checked as when they were received: the file is trusted no further.
        let name = try TaskName.validate(try string(value["name"]))
        return SavedTask(id: TaskID(id), app: try identity(value["app"]), owner: try identity(value["owner"]),
                         name: name, expirationHandler: value["expirationHandler"]?.boolValue ?? false,
                         connectionBound: value["connectionBound"]?.boolValue ?? false,
                         created: try instant(value["created"]), state: try Self.value(TaskState.self, value["state"]),
                         grantAt: try instant(value["grantAt"]), ageWarned: value["ageWarned"]?.boolValue ?? false)
    }

    static func historyEntry(_ value: JSON) throws -> HistoryEntry {
        HistoryEntry(realtimeNanoseconds: try int(value["time"]),
                     record: AppActionRecord(app: try identity(value), uid: try uid(value["uid"]),
                                             command: try command(value["command"]),
                                             action: try Self.value(AppAction.self, value["action"]),
                                             reason: try Self.value(ActionReason.self, value["reason"]),
                                             taskNames: (value["tasks"]?.arrayValue ?? []).compactMap(\.stringValue),
                                             detail: try value["detail"].map { try WakeReason.validate(try string($0)) }))
    }
}
