// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore

/// Drives a model with explicit instants and collects its effects.
struct ModelHarness {
    var model: BackgroundModel
    var effects: [Effect] = []
    var now = Instant.zero
    var nextStart: UInt64 = 1000

    /// Budget 30 s, warning 5 s, transition 5 s, grant latency exactly 50 ms unless changed.
    init(_ configure: (inout Configuration) -> Void = { _ in }) {
        var config = Configuration()
        config.grantLatencyMin = .milliseconds(50)
        config.grantLatencyMax = .milliseconds(50)
        configure(&config)
        model = BackgroundModel(configuration: config, seed: 42)
    }

    /// Moves the clock to `seconds` and fires what is due.
    mutating func at(_ seconds: Double) {
        now = .seconds(seconds)
        model.advance(to: now, effects: &effects)
    }

    /// Returns and clears the collected effects.
    mutating func take() -> [Effect] {
        defer { effects = [] }
        return effects
    }

    mutating func process(pid: Int32, ancestors: [ProcessIdentity] = [], uid: UInt32 = 1000) -> ProcessDescription {
        nextStart += 1
        return ProcessDescription(identity: ProcessIdentity(pid: pid, startTime: nextStart), uid: uid,
                                  command: "app\(pid)", ancestors: ancestors)
    }

    /// Registers a new app process.
    mutating func app(pid: Int32 = 100, uid: UInt32 = 1000, subscribed: Bool = false) throws -> ProcessIdentity {
        let description = process(pid: pid, uid: uid)
        let app = try model.register(description, at: now, effects: &effects)
        if subscribed { model.subscribe(app) }
        return app
    }

    @discardableResult
    mutating func begin(_ app: ProcessIdentity, _ name: String = "work", owner: ProcessIdentity? = nil,
                        connection: ConnectionID? = nil) throws(BGTaskError) -> TaskID {
        try model.beginTask(in: app, owner: owner ?? app, name: name, expirationHandler: true,
                            connection: connection, at: now, effects: &effects).id
    }

    mutating func end(_ id: TaskID, in app: ProcessIdentity) throws(BGTaskError) {
        try model.endTask(id, in: app, at: now, effects: &effects)
    }

    mutating func background(_ app: ProcessIdentity) throws {
        _ = try model.setState(of: app, to: .background, at: now, effects: &effects)
    }

    mutating func foreground(_ app: ProcessIdentity) throws {
        _ = try model.setState(of: app, to: .foreground, at: now, effects: &effects)
    }

    mutating func finishTransition(_ app: ProcessIdentity) {
        model.finishTransition(of: app, at: now, effects: &effects)
    }

    func state(_ app: ProcessIdentity) -> AppState? { model.snapshot(of: app, at: now)?.state }
    func phase(_ app: ProcessIdentity) -> BackgroundPhase? { model.snapshot(of: app, at: now)?.phase }
    func taskState(_ id: TaskID) -> TaskState? { model.listTasks(at: now).first { $0.id == id }?.state }
}

extension [Effect] {
    /// The suspend/resume/terminate actions, in order.
    var actions: [(AppAction, ActionReason)] {
        compactMap { if case let .act(record, _) = $0 { (record.action, record.reason) } else { nil } }
    }

    var lifecycle: [LifecycleEvent] {
        compactMap { if case let .lifecycle(_, _, event) = $0 { event } else { nil } }
    }

    /// Final states of tasks that left the active states, with reasons.
    var finishedTasks: [(TaskID, TaskState, TaskReason?)] {
        compactMap {
            if case let .taskChanged(task) = $0, !task.state.isActive { (task.id, task.state, task.reason) } else { nil }
        }
    }
}
