// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskClient
import Foundation
import Testing
import Varlink

/// The client vectors (Tests/ClientVectors, format in its README) against the Swift
/// `ClientState`; Tests/libbgtask/vectors.c runs the same files against libbgtask.
@Suite struct ClientVectorTests {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("ClientVectors").path
    static let files = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
        .filter { $0.hasSuffix(".json") }.sorted()

    @Test func thereAreVectors() {
        #expect(Self.files.count >= 10, "\(Self.directory)")
    }

    @Test(arguments: files)
    func vector(_ file: String) throws {
        let text = try String(contentsOfFile: Self.directory + "/" + file, encoding: .utf8)
        let vector = try JSON.parse(text)
        var runner = Runner()
        for (index, step) in (vector["steps"]?.arrayValue ?? []).enumerated() {
            let failures = runner.run(step)
            #expect(failures.isEmpty, "\(file) step \(index): \(failures.joined(separator: "; "))")
        }
    }

    /// One library's state and what it did, step by step.
    struct Runner {
        var state = ClientState<Int>()
        var handlers: [[JSON]] = []
        var calls: [String] = []
        var lifecycle: [String] = []
        var reconnect = false

        /// Applies a step, then a tick at its instant; returns what differs from its expectations.
        mutating func run(_ step: JSON) -> [String] {
            let now = Int64(((step["at"]?.doubleValue ?? 0) * 1e6).rounded())
            handlers = []; calls = []; lifecycle = []; reconnect = false
            var failures: [String] = []
            if let parameters = step["daemon"]?.objectValue {
                if let event = DaemonEvent(parameters) { perform(state.receive(event, at: now)) }
            } else if let id = step["begin"]?.intValue.map(Int.init) {
                let handler = step["handler"]?.boolValue ?? true
                perform(state.begun(id, name: "", handler: handler ? id : nil, granted: step["granted"]?.boolValue ?? false))
            } else if let id = step["end"]?.intValue.map(Int.init) {
                let ending = switch state.end(id) {
                case .send: "send"
                case .alreadyEnded: "alreadyEnded"
                case .unknown: "unknown"
                }
                if ending != step["ending"]?.stringValue { failures.append("ending \(ending)") }
            } else if let id = step["endUndelivered"]?.intValue.map(Int.init) {
                state.endUndelivered(id)
            } else if step["lost"] != nil {
                _ = state.lost(at: now)
            } else if step["reconnectFailed"] != nil {
                state.reconnectFailed(at: now)
            } else if step["wakeCompleted"] != nil {
                perform(state.wakeCompleted(at: now))
            }
            perform(state.tick(at: now))
            let sortedHandlers = handlers.sorted { ($0.first?.intValue ?? 0) < ($1.first?.intValue ?? 0) }
            if JSON.array(sortedHandlers.map { JSON.array($0) }) != (step["handlers"] ?? .array([])) { failures.append("handlers \(sortedHandlers)") }
            if calls != (step["calls"]?.arrayValue ?? []).compactMap(\.stringValue) { failures.append("calls \(calls)") }
            if lifecycle != (step["lifecycle"]?.arrayValue ?? []).compactMap(\.stringValue) {
                failures.append("lifecycle \(lifecycle)")
            }
            if reconnect != (step["reconnect"]?.boolValue ?? false) { failures.append("reconnect \(reconnect)") }
            if let expected = step["state"]?.stringValue {
                let actual = switch state.state {
                case .active: "active"
                case .inactive: "inactive"
                case .background: "background"
                }
                if actual != expected { failures.append("state \(actual)") }
            }
            if let expected = step["connected"]?.boolValue, expected != state.connected {
                failures.append("connected \(state.connected)")
            }
            if let expected = step["remaining"] {
                let left = state.backgroundTimeRemaining(at: now)
                let unlimited = left >= .greatestFiniteMagnitude
                let matches = expected.isNull ? unlimited : !unlimited && abs(left - (expected.doubleValue ?? .nan)) < 1e-6
                if !matches { failures.append("remaining \(unlimited ? "unlimited" : "\(left)")") }
            }
            return failures
        }

        mutating func perform(_ effects: [ClientState<Int>.Effect]) {
            for effect in effects {
                switch effect {
                case let .runHandler(id, reason):
                    let entry: [JSON] = switch reason {
                    case .backgroundTimeExpiring: [.int(Int64(id)), "expiring"]
                    case .backgroundTimeExpired: [.int(Int64(id)), "expired"]
                    case let .denied(why): [.int(Int64(id)), "denied", .string(why)]
                    case .daemonUnavailable: [.int(Int64(id)), "daemonUnavailable"]
                    }
                    handlers.append(entry)
                case .enterBackground:
                    lifecycle.append("didEnterBackground")
                    state.backgroundDelegateReturned()  // the delegate returns at once, as libbgtask's handler does
                case .enterForeground:
                    lifecycle.append("willEnterForeground")
                    state.foregroundDelegateReturned()
                case let .wake(reason, payload):
                    lifecycle.append("didWake \(reason)" + (payload == nil ? "" : "+payload"))
                case let .send(call):
                    let name = switch call {
                    case .finishBackgroundTransition: "FinishBackgroundTransition"
                    case .finishWake: "FinishWake"
                    case let .endTask(id): "EndTask \(id)"
                    }
                    calls.append(name)
                case .reconnect:
                    reconnect = true
                case let .launch(identifier, kind, taskID):
                    lifecycle.append("launchTask \(identifier) \(kind)")
                    perform(state.begun(taskID, name: identifier, handler: taskID))  // as the library's scheduler does
                }
            }
        }
    }
}
