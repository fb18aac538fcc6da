// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// Many timers due at once are fired a slice at a time (the daemon sends each slice's events
/// before firing the next): the same effects, in the same order, as all at once.
@Suite struct SliceTests {
    /// 50 apps backgrounded at the same instant, each holding a task: 50 warnings, then 50
    /// terminations, all due together.
    static func crowd() throws -> ModelHarness {
        var harness = ModelHarness()
        for pid in Int32(100)..<150 {
            let app = try harness.app(pid: pid)
            try harness.begin(app)
        }
        harness.at(0.1)  // granted
        for app in harness.model.listApps(at: harness.now) { try harness.background(app.identity) }
        _ = harness.take()
        return harness
    }

    @Test func slicesGiveTheSameEffectsAsOneGo() throws {
        var whole = try Self.crowd()
        whole.at(40)
        let expected = whole.take()

        var sliced = try Self.crowd()
        sliced.now = .seconds(40)
        var effects: [Effect] = []
        var slices = 0
        while !sliced.model.advance(to: sliced.now, limit: 16, effects: &effects) { slices += 1 }
        #expect(slices >= 100 / 16, "100 timers due, 16 per slice")
        #expect(effects.count == expected.count)
        #expect("\(effects)" == "\(expected)")
        #expect(sliced.model.nextDeadline().map { $0 > sliced.now } ?? true)
    }

    @Test func aSliceStopsAtItsLimitAndSaysMoreIsDue() throws {
        var harness = try Self.crowd()
        var effects: [Effect] = []
        #expect(!harness.model.advance(to: .seconds(40), limit: 1, effects: &effects))
        let warned = effects.filter { if case .taskChanged = $0 { true } else { false } }
        #expect(warned.count == 1, "one timer fired: one app's warning")
    }
}
