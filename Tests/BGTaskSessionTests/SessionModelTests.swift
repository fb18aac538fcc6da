// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSession
import Testing

/// The session agent's rules, with time as an argument: no compositor, no daemon.
@Suite struct SessionModelTests {
    typealias Window = SessionModel.Window
    let one = SessionModel.AppKey.pid(101), two = SessionModel.AppKey.pid(102)
    func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }
    func window(_ app: SessionModel.AppKey, visible: Bool, focused: Bool = false, _ place: String = "workspace 1") -> Window {
        Window(app: app, visible: visible, focused: focused, place: place)
    }

    @Test func leavingTheScreenBackgroundsAfterTheDelayAndComingBackCancels() {
        var model = SessionModel(backgroundDelay: .milliseconds(500))
        #expect(model.observe([window(one, visible: true), window(two, visible: true, "workspace 2")], at: at(0)).isEmpty)
        // Workspace 2 shown: one leaves; nothing before the delay.
        #expect(model.observe([window(one, visible: false), window(two, visible: true, "workspace 2")], at: at(100)).isEmpty)
        #expect(model.nextDeadline == at(600))
        #expect(model.tick(at: at(599)).isEmpty)
        let gone = model.tick(at: at(600))
        #expect(gone == [.init(app: one, state: .background, reason: "window left workspace 1")])
        #expect(model.nextDeadline == nil)
        // Back: foreground at once.
        let back = model.observe([window(one, visible: true), window(two, visible: false, "workspace 2")], at: at(700))
        #expect(back == [.init(app: one, state: .foreground, reason: "window shown on workspace 1")])
        // two left at 700 and comes back at 900, within its delay: nothing is sent for it.
        #expect(model.observe([window(one, visible: true), window(two, visible: true, "workspace 2")], at: at(900)).isEmpty)
        #expect(model.tick(at: at(5000)).isEmpty)
        #expect(model.backgrounded.isEmpty)
    }

    @Test func aZeroDelayIsAtOnceAndForegroundNeverWaits() {
        var model = SessionModel(backgroundDelay: .zero)
        _ = model.observe([window(one, visible: true)], at: at(0))
        #expect(model.observe([window(one, visible: false)], at: at(1)).map(\.state) == [.background])
        #expect(model.observe([window(one, visible: true)], at: at(2)).map(\.state) == [.foreground])
    }

    @Test func anAppFirstSeenOffTheScreenGoesAfterTheDelay() {
        var model = SessionModel(backgroundDelay: .seconds(1))
        #expect(model.observe([window(one, visible: false, "workspace 3")], at: at(0)).isEmpty)
        #expect(model.tick(at: at(1000)) == [.init(app: one, state: .background, reason: "window on workspace 3 not shown")])
    }

    @Test func focusedModeForegroundsOnlyTheFocusedApp() {
        var model = SessionModel(focusMode: .focused, backgroundDelay: .zero)
        let decisions = model.observe([window(one, visible: true, focused: true), window(two, visible: true)], at: at(0))
        #expect(decisions == [.init(app: two, state: .background, reason: "window on workspace 1 not shown")])
        let swapped = model.observe([window(one, visible: true), window(two, visible: true, focused: true)], at: at(10))
        #expect(Set(swapped.map(\.state)) == [.foreground, .background])
        #expect(swapped.first { $0.app == two }?.state == .foreground)
        #expect(swapped.first { $0.app == one }?.state == .background)
    }

    @Test func closedWindowsBackgroundTheLivingProcessAndAnExitForgetsIt() {
        var model = SessionModel(backgroundDelay: .zero)
        _ = model.observe([window(one, visible: true)], at: at(0))
        #expect(model.observe([], at: at(1)) == [.init(app: one, state: .background, reason: "its windows closed")])
        model.forget(one)
        #expect(model.knownApps.isEmpty)
        #expect(model.releaseAll(reason: "stop").isEmpty)
    }

    @Test func aLockBackgroundsEveryShownAppAtOnceAndAnUnlockBringsBackTheVisibleOnes() {
        var model = SessionModel(backgroundDelay: .seconds(5))
        _ = model.observe([window(one, visible: true), window(two, visible: false, "workspace 2")], at: at(0))
        let locked = model.setLocked(true, reason: "session locked", at: at(10))
        // Both: one was shown, two was on its way (pending), and neither waits for the delay.
        #expect(locked.map(\.app) == [one, two] && locked.allSatisfy { $0.state == .background && $0.reason == "session locked" })
        #expect(model.nextDeadline == nil)
        #expect(model.setLocked(true, reason: "again", at: at(20)).isEmpty)
        let unlocked = model.setLocked(false, reason: "session unlocked and active", at: at(30))
        #expect(unlocked == [.init(app: one, state: .foreground, reason: "session unlocked and active")])
        #expect(model.backgrounded == [two])
    }

    /// An agent started in a locked session (restarted while the screen is locked): what is on
    /// the screen goes as the lock sends it, at once and saying so; what is off it waits its
    /// delay as ever; the unlock brings back what is on the screen.
    @Test func anAppArrivingOnALockedScreenGoesAsTheLockSendsIt() {
        var model = SessionModel(backgroundDelay: .seconds(5))
        #expect(model.setLocked(true, reason: "session locked", at: at(0)).isEmpty)
        let arrived = model.observe([window(one, visible: true), window(two, visible: false, "workspace 2")], at: at(10))
        #expect(arrived == [.init(app: one, state: .background, reason: "session locked")])
        #expect(model.nextDeadline == at(5010))
        #expect(model.tick(at: at(5010)) == [.init(app: two, state: .background, reason: "window on workspace 2 not shown")])
        #expect(model.observe([window(one, visible: true), window(two, visible: false, "workspace 2")], at: at(6000)).isEmpty)
        let unlocked = model.setLocked(false, reason: "session unlocked and active", at: at(7000))
        #expect(unlocked == [.init(app: one, state: .foreground, reason: "session unlocked and active")])
    }

    @Test func itNeverForegroundsAnAppItDidNotBackground() {
        var model = SessionModel(backgroundDelay: .zero)
        // Seen shown from the start: it was never the agent's to bring back.
        #expect(model.observe([window(one, visible: true)], at: at(0)).isEmpty)
        #expect(model.setLocked(false, reason: "unlocked", at: at(1)).isEmpty)
        #expect(model.releaseAll(reason: "stop").isEmpty)
    }

    @Test func stoppingBringsBackEverythingItBackgroundedAndAdoptedAppsAreItsOwn() {
        var model = SessionModel(backgroundDelay: .zero)
        model.adopt([two])  // an earlier run's
        _ = model.observe([window(one, visible: true)], at: at(0))
        _ = model.observe([window(one, visible: false)], at: at(1))
        let released = model.releaseAll(reason: "bgtask-session stopping")
        #expect(released.map(\.app) == [one, two] && released.allSatisfy { $0.state == .foreground })
        #expect(model.backgrounded.isEmpty && model.nextDeadline == nil)
    }

    @Test func anAdoptedAppOnTheScreenComesBackAtTheFirstReport() {
        var model = SessionModel(backgroundDelay: .seconds(5))
        model.adopt([one])
        #expect(model.observe([window(one, visible: true)], at: at(0)).map(\.state) == [.foreground])
    }

    @Test func settingsParseAndNameTheLine() throws {
        let settings = try SessionSettings.parse("[Session]\nFocusMode=focused\nBackgroundDelaySec=250ms\nCompositor=none\n", source: "s.conf")
        #expect(settings.focusMode == .focused && settings.backgroundDelay == .milliseconds(250) && settings.compositor == .none)
        #expect(try SessionSettings.parse("", source: "s.conf") == SessionSettings())
        #expect(throws: ConfigurationError(source: "s.conf", line: 3, message: "FocusMode must be visible or focused, not 'all'")) {
            try SessionSettings.parse("[Session]\n\nFocusMode=all\n", source: "s.conf")
        }
        #expect(throws: ConfigurationError.self) { try SessionSettings.parse("[Session]\nBackgroundDelaySec=forever\n", source: "s") }
        #expect(throws: ConfigurationError.self) { try SessionSettings.parse("[Session]\nColour=red\n", source: "s") }
        #expect(throws: ConfigurationError.self) { try SessionSettings.parse("[Other]\nFocusMode=visible\n", source: "s") }
    }
}

@Suite struct UnitNamingTests {
    @Test func theDesktopConventionNamesTheApp() {
        #expect(UnitNaming.unit("app-foot-1234.scope", isInstanceOf: "foot"))
        #expect(UnitNaming.unit("app-gnome-org.gnome.Terminal-4242.scope", isInstanceOf: "org.gnome.Terminal"))
        #expect(UnitNaming.unit("app-org.kde.konsole@a1b2.service", isInstanceOf: "org.kde.konsole"))
        #expect(UnitNaming.unit("app-firefox.service", isInstanceOf: "firefox"))
        #expect(UnitNaming.unit(#"app-my\x2dapp-7.scope"#, isInstanceOf: "my-app"))
        #expect(!UnitNaming.unit("app-my-app-7.scope", isInstanceOf: "my-app"))  // unescaped: another app, "app"
        #expect(!UnitNaming.unit("app-foot.scope", isInstanceOf: "foot"))  // a scope without its random part
        #expect(!UnitNaming.unit("app-footclient-1.scope", isInstanceOf: "foot"))
        #expect(!UnitNaming.unit("foot-1.scope", isInstanceOf: "foot"))
        #expect(!UnitNaming.unit("app-foot-1.scope", isInstanceOf: ""))
        #expect(UnitNaming.escape("a/b c\u{1b}") == #"a\x2fb\x20c\x1b"#)
    }
}
