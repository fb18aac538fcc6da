// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskCore
import BGTaskProtocol
import BGTaskSession
import BGTaskSystem
import CSystemd
import CWayland
import Glibc
import Varlink

/// The agent's side of sway's (and i3's) IPC: the tree, the windows, their pids.
extension Agent {
    func connectCompositor() {
        switch source {
        case .sway: connectSway()
        case .wlr: connectWlr()
        case .none: break
        }
    }

    func connectSway() {
        guard let swayPath else { return }
        do {
            let socket = try UnixSocket.connect(path: swayPath, nonBlocking: true)
            let peer = try? UnixSocket.peerCredentials(socket)
            // Only the user's own compositor, or root's: what answers at `$SWAYSOCK` decides
            // which of the user's processes are suspended, with the user's rights, and sway's
            // socket is in `/tmp` without `$XDG_RUNTIME_DIR`, where another user can take the
            // path while sway restarts.
            guard let peer, peer.isThisUserOrRoot else {
                socket.close()
                refuseCompositor(at: swayPath, uid: peer?.uid)
                swayRetry.arm(at: Clock.monotonicNanoseconds() + 1_000_000_000)
                return
            }
            refusedCompositor = nil
            sway = socket
            compositorUnit = unit(of: peer.pid)
            framer = SwayIPC.Framer()
            swayOutput = SwayIPC.frame(.subscribe, #"["window","workspace","output","shutdown"]"#)
            treeInFlight = false
            treeDirty = false
            swaySource = try loop.addIO(socket.rawValue, events: UInt32(EPOLLIN.rawValue | EPOLLOUT.rawValue | EPOLLRDHUP.rawValue)) {
                [unowned self] _ in swayReady()
            }
            requestTree()
            log(6, "following sway at \(swayPath)")
        } catch {
            sway = nil
            swayRetry.arm(at: Clock.monotonicNanoseconds() + 1_000_000_000)
        }
    }

    /// Logs, once for each path and uid, a compositor socket not followed (looked at again
    /// every second: the real compositor may come back there).
    func refuseCompositor(at path: String, uid: UInt32?) {
        let key = "\(path) \(uid.map(String.init) ?? "?")"
        guard refusedCompositor != key else { return }
        refusedCompositor = key
        log(4, "the compositor at \(path) answers as \(uid.map { "uid \($0)" } ?? "an unknown user"), neither this user (uid \(self.uid)) nor root: not followed; looking again every second")
    }

    func requestTree() {
        if treeInFlight { treeDirty = true; return }
        treeInFlight = true
        swayOutput += SwayIPC.frame(.getTree)
        swaySource?.setIOEvents(UInt32(EPOLLIN.rawValue | EPOLLOUT.rawValue | EPOLLRDHUP.rawValue))
    }

    func swayReady() {
        guard let sway else { return }
        do {
            while !swayOutput.isEmpty, let written = try sway.writeAvailable(swayOutput) { swayOutput.removeFirst(written) }
            var total = 0
            while let bytes = try sway.readAvailable(upTo: 65536) {
                if bytes.isEmpty { return compositorGone("the compositor closed its socket") }
                framer.append(bytes)
                total += bytes.count
                while let frame = try framer.next() { handleSway(frame.type, frame.payload) }
                if total > 4 << 20 { break }  // others get their turn; the rest is read next pass
            }
            while let frame = try framer.next() { handleSway(frame.type, frame.payload) }
            swaySource?.setIOEvents(UInt32(EPOLLIN.rawValue | EPOLLRDHUP.rawValue) | (swayOutput.isEmpty ? 0 : UInt32(EPOLLOUT.rawValue)))
        } catch let error as SwayIPC.FrameError {
            compositorGone("the compositor sent \(error)")
        } catch {
            compositorGone("\(error)")
        }
    }

    func handleSway(_ type: UInt32, _ payload: [UInt8]) {
        if type & 0x8000_0000 != 0 { countCompositorEvent() }
        switch type {
        case SwayIPC.MessageType.getTree.rawValue:
            treeInFlight = false
            guard let tree = try? JSON.parse(payload) else {
                log(4, "sway sent a tree that is not JSON (\(payload.count) bytes); ignored")
                return
            }
            observe(SwayIPC.windows(ofTree: tree))
            if treeDirty { treeDirty = false; requestTree() }
        case SwayIPC.MessageType.windowEvent, SwayIPC.MessageType.workspaceEvent:
            requestTree()
        case SwayIPC.MessageType.shutdownEvent:
            compositorGone("sway is shutting down")
        default:
            break  // the subscription's reply
        }
    }

    func observe(_ windows: [SwayIPC.TreeWindow]) {
        var report: [SessionModel.Window] = []
        for window in windows where accept(window.pid) {
            report.append(.init(app: .pid(window.pid), visible: window.visible, focused: window.focused, place: window.place))
        }
        apply(model.observe(report, at: now))
        armDelay()
    }

    /// A window's process is managed if it is the user's own and alive (a pidfd watches its
    /// exit); pid 1, the agent itself, another user's process: logged once and left alone.
    func accept(_ pid: Int32) -> Bool {
        if processes[pid] != nil { return true }
        guard !refused.contains(pid) else { return false }
        var why: String?
        var info = stat()
        if pid <= 1 || pid == getpid() {
            why = "not an app"
        } else if stat("/proc/\(pid)", &info) != 0 {
            why = "no such process"
        } else if info.st_uid != uid {
            why = "another user's (uid \(info.st_uid))"
        } else if let compositorUnit, unit(of: pid) == compositorUnit {
            why = "it shares the compositor's unit \(AppUnit.name(ofPath: compositorUnit)) (bgtaskd would suspend the compositor"
                + " with it; launch apps in units of their own, app-NAME-RANDOM.scope)"
        }
        if why == nil {
            do {
                let pidfd = try Pidfd.open(pid: pid)
                let source = try loop.addIO(pidfd.descriptor.rawValue, events: UInt32(EPOLLIN.rawValue)) { [unowned self] _ in
                    forget(.pid(pid))
                }
                processes[pid] = (pidfd, source)
                log(7, "following pid \(pid)'s windows")
                return true
            } catch {
                why = "\(error)"
            }
        }
        if refused.count >= 4096 { refused.removeAll() }
        refused.insert(pid)
        log(5, "window of pid \(pid) left alone: \(why!)")
        return false
    }

    /// The unit cgroup that would make `pid` a unit app, as the daemon sees it.
    func unit(of pid: Int32) -> String? {
        Cgroup.of(pid: pid).flatMap { AppUnit.of(cgroupPath: $0.path, daemonUnit: nil) }
    }

    func forget(_ app: AppKey) {
        model.forget(app)
        outbox[app] = nil
        if case let .pid(pid) = app { processes[pid] = nil }
        armDelay()
    }

    /// Nothing is left stopped with nobody in charge: every app the agent backgrounded comes
    /// back; the compositor is looked for again each second.
    func compositorGone(_ why: String) {
        log(4, "\(why); bringing back the apps bgtask-session put in the background")
        swaySource = nil
        sway?.close()
        sway = nil
        wlrSource = nil
        bgtask_wlr_free(wlr)
        wlr = nil
        toplevels = [:]
        apply(model.releaseAll(reason: "compositor gone"))
        armDelay()
        swayRetry.arm(at: Clock.monotonicNanoseconds() + 1_000_000_000)
    }

}
