// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskCore
import Testing

/// Unit apps and process identity in the model (DESIGN.md §2a), with explicit instants.
@Suite struct ContainmentModelTests {
    static let desktop = "/user.slice/user-1000.slice/user@1000.service/app.slice"

    @Test(arguments: [
        ("\(desktop)/app-org.gnome.Terminal-1234.scope", "\(desktop)/app-org.gnome.Terminal-1234.scope"),
        ("\(desktop)/app-foo.scope/sub/deeper", "\(desktop)/app-foo.scope"),
        ("/system.slice/cron.service", "/system.slice/cron.service"),
        ("/system.slice/bgtaskd.service", nil),  // the daemon's own
        ("/user.slice/user-1000.slice/user@1000.service/init.scope", nil),
        ("/user.slice/user-1000.slice/session-2.scope", nil),
        ("/init.scope", nil), ("/user.slice", nil), ("/", nil), ("/bgtaskd-test-app", nil),
    ] as [(String, String?)])
    func aProcessIsAUnitAppOnlyInAUnitOfItsOwn(cgroup: String, unit: String?) {
        #expect(AppUnit.of(cgroupPath: cgroup, daemonUnit: "/system.slice/bgtaskd.service") == unit)
    }

    @Test func aUnitsNameIsTheLastComponentOfItsPath() {
        let cases = ["/user.slice/user-1000.slice/app-foot-1.scope": "app-foot-1.scope", "app.scope": "app.scope",
                     "/a/b/": "b", "a//": "a", "/": "/", "//": "//", "": "", "/é/ünit.scope": "ünit.scope"]
        for (path, name) in cases {
            #expect(AppUnit.name(ofPath: path) == name, "\(path)")
            // The same as the last of its components, where it has one.
            #expect(AppUnit.name(ofPath: path) == path.split(separator: "/").last.map(String.init) ?? path)
        }
    }

    @Test func unitNamesAreCheckedBeforeAnythingIsLookedUp() {
        #expect(AppUnit.refusal(ofName: "app-foo.scope") == nil)
        #expect(AppUnit.refusal(ofName: "getty@tty1.service") == nil)
        for name in ["init.scope", "user.slice", "-.slice", "session-3.scope", "user@0.service", "../etc.scope",
                     "", ".scope", "a b.scope", String(repeating: "a", count: 250) + ".scope", "x.scope\n"] {
            #expect(AppUnit.refusal(ofName: name) != nil, "\(name)")
        }
    }

    @Test func everyProcessOfAUnitBelongsToItsAppWhateverItsParent() throws {
        var harness = ModelHarness()
        var main = harness.process(pid: 100)
        main.unit = "\(Self.desktop)/app-foo.scope"
        let app = try harness.model.register(main, at: harness.now, effects: &harness.effects)
        var worker = harness.process(pid: 200)  // double-forked: no registered ancestor
        worker.unit = main.unit
        #expect(harness.model.app(containing: worker) == app)
        #expect(try harness.model.register(worker, at: harness.now, effects: &harness.effects) == app)
        _ = try harness.begin(app, "main")
        _ = try harness.begin(app, "worker", owner: worker.identity)
        let snapshot = try #require(harness.model.snapshot(of: app, at: harness.now))
        #expect(snapshot.taskCount == 2 && snapshot.unit == main.unit && snapshot.containment == .unit)
        #expect(harness.model.listApps(at: harness.now).count == 1)
        #expect(harness.model.unitPaths(named: "app-foo.scope") == [main.unit!])
    }

    @Test func anotherUsersProcessInTheUnitIsAnAppOfItsOwn() throws {
        var harness = ModelHarness()
        var main = harness.process(pid: 100)
        main.unit = "/system.slice/cron.service"
        let app = try harness.model.register(main, at: harness.now, effects: &harness.effects)
        var job = harness.process(pid: 300, uid: 2000)
        job.unit = main.unit
        #expect(harness.model.app(containing: job) == nil)
        let other = try harness.model.register(job, at: harness.now, effects: &harness.effects)
        #expect(other != app)
        let snapshot = try #require(harness.model.snapshot(of: other, at: harness.now))
        #expect(snapshot.unit == nil && snapshot.containment == .tree)  // the unit stays the first app's
        harness.model.processExited(app, at: harness.now, effects: &harness.effects)
        #expect(harness.model.app(unit: main.unit!) == nil)  // freed with its app
    }

    /// Two processes on one pid that started within one clock tick differ by their pidfs
    /// inode: the second is never taken for the first's app.
    @Test func aPidRecycledWithinOneTickIsNotTheOldApp() throws {
        var harness = ModelHarness()
        let old = ProcessDescription(identity: ProcessIdentity(pid: 100, startTime: 5, inode: 7001), uid: 1000, command: "old")
        let app = try harness.model.register(old, at: harness.now, effects: &harness.effects)
        let recycled = ProcessDescription(identity: ProcessIdentity(pid: 100, startTime: 5, inode: 7002), uid: 1000,
                                          command: "new")
        #expect(harness.model.app(containing: recycled) == nil)
        let second = try harness.model.register(recycled, at: harness.now, effects: &harness.effects)
        #expect(second != app && harness.model.appCount == 2)
    }

    @Test func aStateFileWithoutInodesIsRenamedToLiveIdentities() throws {
        var saved = SavedState()
        let bare = ProcessIdentity(pid: 100, startTime: 5)
        saved.apps[bare] = SavedApp(identity: bare, uid: 1000, command: "a", unit: "/x.scope", containment: .unit,
                                    state: .suspended, phase: nil, deadline: nil, transitionDeadline: nil, warned: false)
        saved.tasks[1] = SavedTask(id: 1, app: bare, owner: bare, name: "t", expirationHandler: false, connectionBound: false,
                                   created: .zero, state: .granted, grantAt: .zero, ageWarned: false)
        saved.reidentify { ProcessIdentity(pid: $0.pid, startTime: $0.startTime, inode: 42) }
        let live = ProcessIdentity(pid: 100, startTime: 5, inode: 42)
        #expect(saved.apps[live]?.identity == live && saved.apps[bare] == nil)
        #expect(saved.tasks[1]?.app == live && saved.tasks[1]?.owner == live)
        var harness = ModelHarness()
        harness.model.restore(saved, at: .zero, effects: &harness.effects)
        #expect(harness.model.app(unit: "/x.scope") == live)
    }

    @Test func onlyAManagerThatMayMovesAProcessAppIntoAScope() {
        let user = "/user.slice/user-1000.slice/user@1000.service/init.scope"
        let session = "/user.slice/user-1000.slice/session-2.scope"
        #expect(Isolation.of(cgroupPath: user, uid: 1000, mode: .auto, daemonUID: 1000) == .user(1000))
        #expect(Isolation.of(cgroupPath: user, uid: 1000, mode: .auto, daemonUID: 0) == .user(1000))
        #expect(Isolation.of(cgroupPath: user, uid: 1000, mode: .auto, daemonUID: 2000) == nil)  // not its manager
        #expect(Isolation.of(cgroupPath: session, uid: 1000, mode: .auto, daemonUID: 0) == nil)  // not unless told to
        #expect(Isolation.of(cgroupPath: session, uid: 1000, mode: .yes, daemonUID: 0) == .system(slice: "user-1000.slice"))
        #expect(Isolation.of(cgroupPath: session, uid: 1000, mode: .yes, daemonUID: 1000) == nil)  // only root may ask
        #expect(Isolation.of(cgroupPath: user, uid: 1000, mode: .no, daemonUID: 0) == nil)
    }

    @Test func anIsolatedAppIsItsScopesApp() throws {
        var harness = ModelHarness()
        let app = try harness.app(pid: 100)
        #expect(harness.model.containment(of: app) == .tree)
        let scope = "/user.slice/user-1000.slice/app-bgtaskd-100.scope"
        #expect(harness.model.isolate(app, inScope: scope, effects: &harness.effects))
        #expect(!harness.model.isolate(app, inScope: scope + "x", effects: &harness.effects))  // once
        var worker = harness.process(pid: 300)
        worker.unit = scope
        #expect(harness.model.app(containing: worker) == app)
        let snapshot = try #require(harness.model.snapshot(of: app, at: harness.now))
        #expect(snapshot.containment == .scope && snapshot.unit == scope)
        #expect(harness.model.savedState().apps[app]?.containment == .scope)
    }
}
