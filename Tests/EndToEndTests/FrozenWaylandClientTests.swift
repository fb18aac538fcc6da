// SPDX-License-Identifier: Apache-2.0
import BGTaskSystem
import Glibc
import Testing
import TestSupport
import Varlink

/// Does a real Wayland client survive being suspended? A suspended client reads nothing;
/// what the compositor sends it piles up in its socket, and libwayland's server side
/// disconnects a client whose buffer fills (measured here, sway 1.7 and libwayland 1.21: a
/// foot suspended on a hidden workspace is gone after about 300-450 workspace flips or
/// output mode changes, whatever the time: see the README). So the session agent lets the
/// apps it suspended read their backlog (a `Wake`) every 100 compositor events.
/// This runs the real thing for 60 s (BGTASKD_FROZEN_SECONDS): foot suspended on workspace
/// 1 while the user flips between 2 and 3, the output changes mode every round and another
/// client sets the clipboard; then back to workspace 1, foot must still be connected and
/// answer.
@Suite struct FrozenWaylandClientTests {
    @Test(.enabled(if: SwaySession.available && FileSystem.exists("/usr/bin/wl-copy"), "needs sway, foot and wl-clipboard"))
    func aSuspendedFootSurvivesAMinuteOfCompositorEvents() throws {
        let seconds = Double(Host.environment("BGTASKD_FROZEN_SECONDS") ?? "") ?? 60
        let sway = try SwaySession()
        let daemon = try TestDaemon(["WakeTimeSec=300ms"])
        let foot = try sway.openFoot(on: "1")
        try sway.msg("workspace", "2")
        let log = sway.directory + "/agent.log"
        let agent = try sway.agent(socket: daemon.socketPath, ["BackgroundDelaySec=0"], log: log)
        defer { agent.killTree(); _ = try? agent.wait(timeout: 5) }
        try waitUntil("foot suspended", timeout: 5) { processState(foot) == "T" }
        var events = (modes: 0, clipboard: 0, flips: 0)
        let start = Clock.monotonicNanoseconds()
        var round = 0
        while Double(Clock.monotonicNanoseconds() - start) / 1e9 < seconds {
            round += 1
            try sway.msg("workspace", round % 2 == 0 ? "2" : "3")
            try sway.msg("output", "HEADLESS-1", "resolution", round % 2 == 0 ? "1280x720" : "1024x768")
            events.flips += 1
            events.modes += 1
            if round % 3 == 0 {
                try sway.msg("exec", "wl-copy clipboard-\(round)")
                events.clipboard += 1
            }
        }
        let wakes = daemon.log().filter { $0.contains("App pid \(foot)") && $0.contains("compositor-backlog") }.count
        try sway.msg("workspace", "1")
        try waitUntil("foot running", timeout: 5) { processState(foot) != nil && processState(foot) != "T" }
        // Still a client: sway finds its window, and it takes the focus.
        let swayLog = String(decoding: (try? readFile(sway.logPath)) ?? [], as: UTF8.self)
        #expect(try sway.windowPIDs().contains(foot),
                "foot's window is gone: \(swayLog.split(separator: "\n").filter { $0.contains("err") }.suffix(4))")
        try sway.msg("[pid=\(foot)]", "focus")
        #expect(wakes > 0, "the agent let foot read its backlog")
        print("FrozenWaylandClientTests: foot suspended \(Int(seconds)) s through \(events.modes) output mode changes, "
              + "\(events.clipboard) clipboard offers, \(events.flips) workspace flips, woken \(wakes) times to read them: still connected")
    }
}
