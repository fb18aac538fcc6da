// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// The daemon's state on disk, so a restart (or a crash) loses no app, task or deadline:
/// `bgtaskd.state` in `$RUNTIME_DIRECTORY`, else in the socket's directory (DESIGN.md §5).
///
/// A log of JSON lines, one per change, appended before the change is carried out; read
/// back by applying the lines in order. Appending is a copy into a shared mapping of the
/// file (`MappedLog`): no system call per change, and durable against a crash of the
/// daemon the moment it is copied. When the log has grown well past the state it
/// describes it is rewritten whole (to a new file, renamed over the old one). No fsync: the
/// directory is a tmpfs under /run, and deadlines mean nothing after a reboot anyway (the
/// first line names the boot where `/proc/sys` is visible; a file from another boot is
/// ignored. Under the shipped unit's `ProcSubset=pid` it is not, and /run, emptied at
/// boot, is what keeps an old file away).
final class StateFile {
    static let fileName = "bgtaskd.state"
    static let format = 1
    /// The longest line read back: a history line names at most 9 tasks (History.bounded),
    /// an app at most 1,000 tasks of at most 256 bytes each. Longer lines are skipped, never
    /// held whole.
    static let maximumLineBytes = 1 << 20
    /// The most read back: far beyond any real state (MaxApps apps, their tasks, history).
    static let maximumBytes = 512 << 20

    let directory: StateDirectory
    var path: String { directory.path + "/" + Self.fileName }
    private var log: MappedLog?
    private var linesSinceRewrite = 0
    /// Lines recorded and not yet in the log. A failed append (a full disk) leaves them all
    /// here: the log never holds half a line followed by another line.
    private let pending = ByteBuffer()
    /// The last process identity written in a task line, and its text (`appendTask`).
    private var lastIdentity: (process: ProcessIdentity?, text: [UInt8]) = (nil, [])
    /// The next task id written: no id at or past it has been given out.
    private var lastNextTaskID = 0
    static let taskIDBlock = 1024

    /// What a previous daemon left, and what could not be read of it.
    struct Loaded {
        var state = SavedState()
        var history: [HistoryEntry] = []
        var problems: [String] = []
        var found = false
    }

    /// The state file in `directory`, which the daemon has locked.
    init(directory: StateDirectory) {
        self.directory = directory
    }

    // MARK: Reading

    func load() -> Loaded {
        var loaded = Loaded()
        var number = 0
        var header: JSON?
        var rejected = false
        // Of a file of this boot in another format (another version's), only the apps whose
        // process reads, in the foreground: what it stopped is resumed, not left so.
        var released = SavedState()
        do {
            loaded.found = try directory.readLines(Self.fileName, maximumLineBytes: Self.maximumLineBytes,
                                                   maximumBytes: Self.maximumBytes) { line in
                number += 1
                switch line {
                case .tooLong where number == 1:
                    rejected = true
                case .tooLong:
                    if !rejected { loaded.problems.append("\(path) line \(number) ignored: longer than \(Self.maximumLineBytes) bytes") }
                case let .text(bytes) where number == 1:
                    header = try? JSON.parse(bytes)
                    rejected = header?["format"]?.intValue != Int64(Self.format)
                case let .text(bytes) where rejected:
                    guard header?["boot"]?.stringValue == Self.bootID, case let .object(fields)? = try? JSON.parse(bytes),
                          fields.count == 1 else { return }
                    if let app = fields["app"].flatMap(Self.foregroundApp) { released.apply(.app(app)) }
                    if let gone = try? Self.identity(fields["gone"]) { released.apply(.gone(gone)) }
                case let .text(bytes):
                    do {
                        try Self.apply(JSON.parse(bytes), to: &loaded)
                    } catch {
                        // Only the last line can be cut short (a write interrupted by a crash).
                        loaded.problems.append("\(path) line \(number) ignored: \(error)")
                    }
                }
            }
        } catch {
            loaded.problems.append("\(path) not read: \(error); starting afresh")
            return Loaded(problems: loaded.problems, found: true)
        }
        guard loaded.found else { return loaded }
        if rejected || header == nil {
            // Kept for whoever wants to look at it; never read again.
            directory.rename(Self.fileName, to: Self.fileName + ".unreadable")
            let kept = released.apps.isEmpty ? "" : "; \(released.apps.count) of its apps kept, in the foreground"
            return Loaded(state: released, problems: ["\(path) is not a bgtaskd state file of format \(Self.format); moved to \(path).unreadable, starting afresh\(kept)"],
                          found: true)
        }
        guard header?["boot"]?.stringValue == Self.bootID else {
            return Loaded(problems: ["\(path) was written before the machine rebooted; starting afresh"], found: true)
        }
        return loaded
    }

    struct Malformed: Error, CustomStringConvertible {
        var description: String
    }

    /// One line read back into what is loaded (the fuzz target's entry too: `scripts/fuzz state`).
    static func apply(_ line: JSON, to loaded: inout Loaded) throws {
        guard case let .object(fields) = line, fields.count == 1, let (kind, value) = fields.first else {
            throw Malformed(description: "not a one-key object")
        }
        switch kind {
        case "app":
            do {
                loaded.state.apply(.app(try Self.app(value)))
            } catch {
                // Dropped, its process would stay as the last daemon left it — stopped, frozen
                // — with nobody to resume it: kept in the foreground, where it runs free (the
                // restore resumes it), if at least whose process it is can be read.
                guard let kept = Self.foregroundApp(value) else { throw error }
                loaded.state.apply(.app(kept))
                throw Malformed(description: "\(error); app pid \(kept.identity.pid) kept, in the foreground")
            }
        case "terminating":
            loaded.state.apply(.terminating(try Self.identity(value), try Self.termination(value)))
        case "gone": loaded.state.apply(.gone(try Self.identity(value)))
        case "task": loaded.state.apply(.task(try Self.task(value)))
        case "taskGone": loaded.state.apply(.gone(TaskID(try Self.int(value))))
        case "nextTaskId": loaded.state.nextTaskID = TaskID(try Self.int(value))
        case "history": loaded.history.append(try Self.historyEntry(value))
        case "quota":
            let key = try Self.string(value["key"])
            guard key.utf8.count <= 8192, !key.containsControlCharacters else { throw Malformed(description: "bad quota key") }
            let used = try (value["used"]?.arrayValue ?? []).prefix(1024).map { pair throws -> QuotaInterval in
                guard let bounds = pair.arrayValue, bounds.count == 2 else { throw Malformed(description: "bad quota interval") }
                return QuotaInterval(start: try Self.instant(bounds[0]), end: try Self.instant(bounds[1]))
            }
            loaded.state.quota[key] = used.isEmpty ? nil : used
        case "requests":
            let (key, book) = try Self.requests(value)
            loaded.state.requests[key] = book
        case "sleep":
            let slept = try Self.int(value)
            guard slept >= 0 else { throw Malformed(description: "bad sleep") }
            loaded.state.sleep = .nanoseconds(slept)
        default: throw Malformed(description: "unknown record '\(kind)'")
        }
    }

    // MARK: Writing

    /// Whether the log is open: false until this daemon's first rewrite succeeds.
    var isOpen: Bool { log != nil }

    /// The room kept prepared past the log's text (`MappedLog.prepare`): as much as the last
    /// run of appends between two pauses took (a screen lock's is much like the one before),
    /// and no less than the whole state at the last rewrite (a burst that changes every app
    /// once, a deadline burst's, appends 2–3 times that). At least 256 KiB, at most 8 MiB (the
    /// most `MappedLog` reserves ahead at a growth: the log's memory stays within what it was).
    private var roomWanted = 256 << 10
    private var wholeAtRewrite = 0
    /// The log's length when the room was last prepared.
    private var lengthAtPrepare = 0
    static let roomBounds = (256 << 10)...(8 << 20)
    private static func room(_ bytes: Int) -> Int { min(max(bytes, roomBounds.lowerBound), roomBounds.upperBound) }

    /// Whether the room prepared has fallen below half of what is wanted, or a preparation
    /// is under way (`prepareRoom`).
    var needsRoom: Bool { preparing || log.map { $0.prepared < roomWanted / 2 } ?? false }
    /// Whether a preparation has more slices to go (its `roomWanted` is set).
    private var preparing = false

    /// Prepares the room wanted past the log's text: the page faults of the next appends,
    /// taken now, at most `slice` bytes of them per call; returns whether more is left (the
    /// caller goes on in a later pass, so that a call arriving meanwhile waits for one slice,
    /// not for megabytes). With no room on the file system for it, nothing is prepared until
    /// the next rewrite (appends go on into the room there is, faulting as before).
    @discardableResult
    func prepareRoom(slice: Int = .max) -> Bool {
        guard let log else { return false }
        if !preparing {
            let run = max(0, log.length - lengthAtPrepare)
            roomWanted = Self.room(max(run, wholeAtRewrite))
            lengthAtPrepare = log.length
        }
        do {
            try log.prepare(ahead: roomWanted, atMost: slice)
            preparing = log.prepared < roomWanted
        } catch {
            roomWanted = 0
            preparing = false
        }
        return preparing
    }

    /// Whether something recorded is still to be flushed.
    var hasPendingRecords: Bool { !pending.isEmpty }

    /// Notes one of the model's changes to an app (`flush()` writes what was noted).
    func record(_ change: SavedProcessChange) {
        switch change {
        case let .app(app): appendApp(app)
        case let .terminating(process, termination):
            var object = Self.fields(process)
            object["killAt"] = .int(termination.killAt.nanoseconds)
            object["uid"] = .int(Int64(termination.uid))
            if let grace = termination.grace { object["grace"] = .int(grace.nanoseconds) }
            if let unsent = termination.unsent { object["unsent"] = .int(Int64(unsent.number)) }
            if !termination.signalled.isEmpty { object["signalled"] = .array(termination.signalled.map { .object(Self.fields($0)) }) }
            if let cgroup = termination.cgroup {
                var fields: [String: JSON] = ["path": .string(cgroup.path), "ino": .int(Int64(bitPattern: cgroup.inode))]
                if let invocation = cgroup.invocation { fields["invocation"] = .string(Self.hex(invocation)) }
                object["cgroup"] = .object(fields)
            }
            append("terminating", .object(object))
        case let .gone(process): append("gone", .object(Self.fields(process)))
        }
    }

    /// Notes a task record.
    func record(_ change: SavedTaskChange) {
        switch change {
        case let .task(task): appendTask(task)
        case let .gone(id):
            raw("{\"taskGone\":"); number(Int64(id)); raw("}\n")
            linesSinceRewrite += 1
        }
    }

    /// Notes the next task id to be given, when it is past the block of ids reserved.
    func record(nextTaskID: TaskID) {
        // Ids are reserved a block at a time, so a BeginTask costs no extra line: a restart
        // goes on from the end of the block, and an id is never given out twice.
        if nextTaskID > lastNextTaskID {
            lastNextTaskID = nextTaskID + Self.taskIDBlock
            append("nextTaskId", .int(Int64(lastNextTaskID)))
        }
    }

    /// Notes a quota record: the key's whole list of used intervals (empty: none left).
    func record(quota changes: [(key: String, intervals: [QuotaInterval])]) {
        for change in changes {
            append("quota", .object(["key": .string(change.key), "used": .array(change.intervals.map {
                .array([.int($0.start.nanoseconds), .int($0.end.nanoseconds)])
            })]))
        }
    }

    /// Notes a key's scheduled requests (`nil`: forgotten).
    func record(requests changes: [(key: String, requests: SavedRequests?)]) {
        for change in changes { append("requests", Self.encode(change.requests, key: change.key)) }
    }

    /// Notes how long the machine had slept since it booted, as the model last counted it
    /// (`BackgroundModel.machineSlept`): the instants of the requests and quota records
    /// written after count that sleep.
    func record(sleep: Duration) {
        append("sleep", .int(sleep.nanoseconds))
    }

    /// A history line, written directly as `appendTask` is (one per action: a screen lock's
    /// burst writes thousands); the same text as `JSON.object(["history": encode(entry)])`,
    /// checked in debug builds.
    func record(_ entry: HistoryEntry) {
        let start = pending.count
        let record = entry.record
        func string(_ value: String) { pending.appendString(value) }
        raw("{\"history\":{\"action\":"); string(record.action.rawValue)
        raw(",\"command\":"); string(record.command)
        if let detail = record.detail { raw(",\"detail\":"); string(detail) }
        if record.app.inode != 0 { raw(",\"ino\":"); number(Int64(bitPattern: record.app.inode)) }
        raw(",\"pid\":"); number(Int64(record.app.pid))
        raw(",\"reason\":"); string(record.reason.rawValue)
        raw(",\"start\":"); number(Int64(bitPattern: record.app.startTime))
        raw(",\"tasks\":[")
        for (index, name) in record.taskNames.enumerated() {
            if index > 0 { raw(",") }
            string(name)
        }
        raw("],\"time\":"); number(entry.realtimeNanoseconds)
        raw(",\"uid\":"); number(Int64(record.uid))
        raw("}}\n")
        linesSinceRewrite += 1
        assert(pending.bytes(from: start) == Array((JSON.object(["history": Self.encode(entry)]).serialized + "\n").utf8))
    }

    /// A task line, written directly: one goes out per `BeginTask` and per grant, and
    /// building a `JSON` value for it doubled the daemon's instructions per call. The same
    /// text as `JSON.object(["task": encode(task)])`, which debug builds (the tests) check.
    func appendTask(_ task: SavedTask) {
        let start = pending.count
        func flag(_ value: Bool) { value ? raw("true") : raw("false") }
        func identity(_ process: ProcessIdentity) {
            // A task's app and owner are most often one process, and the same as the line
            // before's: its text is written once and copied after (three numbers were a
            // fifth of a task line's instructions, callgrind).
            if process != lastIdentity.process {
                let from = pending.count
                raw("{")
                if process.inode != 0 { raw("\"ino\":"); number(Int64(bitPattern: process.inode)); raw(",") }
                raw("\"pid\":"); number(Int64(process.pid))
                raw(",\"start\":"); number(Int64(bitPattern: process.startTime)); raw("}")
                lastIdentity = (process, pending.bytes(from: from))
                return
            }
            lastIdentity.text.withUnsafeBytes { pending.append($0) }
        }
        raw("{\"task\":{\"ageWarned\":"); flag(task.ageWarned)
        raw(",\"app\":"); identity(task.app)
        raw(",\"connectionBound\":"); flag(task.connectionBound)
        raw(",\"created\":"); number(task.created.nanoseconds)
        raw(",\"expirationHandler\":"); flag(task.expirationHandler)
        raw(",\"grantAt\":"); number(task.grantAt.nanoseconds)
        raw(",\"id\":"); number(Int64(task.id))
        raw(",\"name\":"); pending.appendString(task.name)
        raw(",\"owner\":"); identity(task.owner)
        raw(",\"state\":"); raw(task.state.quoted); raw("}}\n")
        linesSinceRewrite += 1
        assert(pending.bytes(from: start) == Array((JSON.object(["task": Self.encode(task)]).serialized + "\n").utf8))
    }

    /// An app line, written directly as `appendTask` is (one goes out with most calls: the
    /// app's tasks or phase changed); the same text as `JSON.object(["app": encode(app)])`,
    /// checked in debug builds. Keys in the serializer's order.
    func appendApp(_ app: SavedApp) {
        let start = pending.count
        func string(_ value: String) { pending.appendString(value) }
        raw("{\"app\":{\"command\":"); string(app.command)
        raw(",\"containment\":"); raw(app.containment.quoted)
        if let deadline = app.deadline { raw(",\"deadline\":"); number(deadline.nanoseconds) }
        if let since = app.holdingSince { raw(",\"holdingSince\":"); number(since.nanoseconds) }
        if app.identity.inode != 0 { raw(",\"ino\":"); number(Int64(bitPattern: app.identity.inode)) }
        if let phase = app.phase { raw(",\"phase\":"); raw(phase.quoted) }
        raw(",\"pid\":"); number(Int64(app.identity.pid))
        if let key = app.quotaKey { raw(",\"quotaKey\":"); string(key) }
        if let key = app.requestKey { raw(",\"requestKey\":"); string(key) }
        raw(",\"start\":"); number(Int64(bitPattern: app.identity.startTime))
        raw(",\"state\":"); raw(app.state.quoted)
        if let deadline = app.transitionDeadline { raw(",\"transitionDeadline\":"); number(deadline.nanoseconds) }
        raw(",\"uid\":"); number(Int64(app.uid))
        if let unit = app.unit { raw(",\"unit\":"); string(unit) }
        if app.warned { raw(",\"warned\":true") }
        raw("}}\n")
        linesSinceRewrite += 1
        assert(pending.bytes(from: start) == Array((JSON.object(["app": Self.encode(app)]).serialized + "\n").utf8))
    }

    @inline(__always) private func raw(_ text: StaticString) {
        pending.append(text)
    }

    private func number(_ value: Int64) { pending.appendInteger(value) }

    private func append(_ kind: String, _ value: JSON) {
        var text: [UInt8] = []
        JSON.object([kind: value]).write(to: &text)
        text.append(UInt8(ascii: "\n"))
        text.withUnsafeBytes { pending.append($0) }
        linesSinceRewrite += 1
    }

    /// Appends what was recorded to the log, whole or not at all. True if the log should
    /// now be rewritten. On failure nothing recorded is lost: the next call appends it.
    func flush(liveRecords: Int) throws(Errno) -> Bool {
        guard !pending.isEmpty, let log else { return false }
        try pending.withBytes { bytes in Result { () throws(Errno) in try log.append(bytes) } }.get()
        pending.removeAll(keepingCapacityUpTo: 1 << 20)
        return linesSinceRewrite > Self.rewriteLines(liveRecords)
    }

    /// Whether the log has grown to twice the size at which a rewrite falls due: then it is
    /// rewritten even while calls go on (`Daemon.whenStateQuiet`).
    func isOverdue(liveRecords: Int) -> Bool { linesSinceRewrite > 2 * Self.rewriteLines(liveRecords) }

    /// Lines appended since the last rewrite at which the next one falls due.
    private static func rewriteLines(_ liveRecords: Int) -> Int { max(4096, 4 * liveRecords) }

    /// Replaces the file with the whole state, then appends to the new one. If that fails
    /// (no room for the copy), the old log and what is still to be appended to it stay.
    func rewrite(_ state: SavedState, history: [HistoryEntry]) throws(Errno) {
        let unwritten = pending.bytes(from: 0)
        let unwrittenLines = linesSinceRewrite
        let whole = wholeText(state, history: history)
        let file: FileDescriptor
        do {
            file = try directory.replace(Self.fileName, with: whole)
        } catch {
            unwritten.withUnsafeBytes { pending.append($0) }
            linesSinceRewrite = unwrittenLines
            throw error
        }
        // The new file holds everything; the old log is gone. If the new one cannot be
        // mapped (no room reserved past it), it is not open, and the next write rewrites.
        linesSinceRewrite = 0
        log = nil
        log = try MappedLog(file: file, length: whole.count)
        wholeAtRewrite = whole.count
        lengthAtPrepare = whole.count
        roomWanted = Self.room(whole.count)
        preparing = false
    }

    // MARK: Encoding

    /// A new log's text: the header, then the whole state as every record changed at once.
    /// Leaves nothing pending.
    func wholeText(_ state: SavedState, history: [HistoryEntry]) -> [UInt8] {
        pending.removeAll()
        defer { pending.removeAll() }
        var header: [UInt8] = []
        JSON.object(["format": .int(Int64(Self.format)), "boot": .string(Self.bootID)]).write(to: &header)
        header.append(UInt8(ascii: "\n"))
        header.withUnsafeBytes { pending.append($0) }
        for entry in history { record(entry) }
        for app in state.apps.values { record(.app(app)) }
        for (process, termination) in state.terminating { record(.terminating(process, termination)) }
        for task in state.tasks.values { record(.task(task)) }
        record(quota: state.quota.keys.sorted().map { ($0, state.quota[$0]!) })
        record(requests: state.requests.keys.sorted().map { ($0, state.requests[$0]) })
        if let sleep = state.sleep { record(sleep: sleep) }
        lastNextTaskID = max(lastNextTaskID, state.nextTaskID)
        append("nextTaskId", .int(Int64(lastNextTaskID)))
        return pending.bytes(from: 0)
    }

    /// This boot's id: monotonic instants and process start times mean nothing in another.
    static let bootID: String = {
        let bytes = (try? readFile("/proc/sys/kernel/random/boot_id")) ?? []
        return String(decoding: bytes, as: UTF8.self).filter { $0 != "\n" }
    }()

    /// Bytes as lowercase hex digits, two a byte.
    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] }, as: UTF8.self)
    }

    static func fields(_ process: ProcessIdentity) -> [String: JSON] {
        var object: [String: JSON] = ["pid": .int(Int64(process.pid)), "start": .int(Int64(bitPattern: process.startTime))]
        if process.inode != 0 { object["ino"] = .int(Int64(bitPattern: process.inode)) }
        return object
    }

    static func encode(_ app: SavedApp) -> JSON {
        var object = fields(app.identity)
        object["uid"] = .int(Int64(app.uid))
        object["command"] = .string(app.command)
        if let unit = app.unit { object["unit"] = .string(unit) }
        object["containment"] = .string(app.containment.rawValue)
        object["state"] = .string(app.state.rawValue)
        if let phase = app.phase { object["phase"] = .string(phase.rawValue) }
        if let deadline = app.deadline { object["deadline"] = .int(deadline.nanoseconds) }
        if let deadline = app.transitionDeadline { object["transitionDeadline"] = .int(deadline.nanoseconds) }
        if let key = app.quotaKey { object["quotaKey"] = .string(key) }
        if let since = app.holdingSince { object["holdingSince"] = .int(since.nanoseconds) }
        if let key = app.requestKey { object["requestKey"] = .string(key) }
        if app.warned { object["warned"] = .bool(true) }
        return .object(object)
    }

    static func encode(_ task: SavedTask) -> JSON {
        .object([
            "id": .int(Int64(task.id)), "app": .object(fields(task.app)), "owner": .object(fields(task.owner)),
            "name": .string(task.name), "expirationHandler": .bool(task.expirationHandler),
            "connectionBound": .bool(task.connectionBound), "created": .int(task.created.nanoseconds),
            "state": .string(task.state.rawValue), "grantAt": .int(task.grantAt.nanoseconds),
            "ageWarned": .bool(task.ageWarned),
        ])
    }

    static func encode(_ entry: HistoryEntry) -> JSON {
        let record = entry.record
        var object = fields(record.app)
        object["time"] = .int(entry.realtimeNanoseconds)
        object["uid"] = .int(Int64(record.uid))
        object["command"] = .string(record.command)
        object["action"] = .string(record.action.rawValue)
        object["reason"] = .string(record.reason.rawValue)
        object["tasks"] = .array(record.taskNames.map { .string($0) })
        if let detail = record.detail { object["detail"] = .string(detail) }
        return .object(object)
    }
}
