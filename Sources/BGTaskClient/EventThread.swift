// SPDX-License-Identifier: Apache-2.0
import BGTaskProtocol
import BGTaskSystem
import Foundation
import Varlink

/// The library's one thread: it follows the Subscribe stream, feeds its events and the
/// passing of time to the application's `ClientState`, and carries out what that returns.
/// It blocks only in `poll`, with a timeout at the state's next deadline: its own calls
/// (`FinishBackgroundTransition`, ends left over from a lost daemon) go out on a connection
/// of its own without waiting for their replies. What the state returns to a call made on
/// another thread is `post`ed to it: only it carries effects out, its connections its own.
final class EventThread: @unchecked Sendable {
    // Touched only on the thread once started.
    private var subscription: VarlinkConnection?
    private var calls: PipelinedConnection<DaemonCall>?
    private let wakeRead: FileDescriptor
    private let wakeWrite: FileDescriptor
    /// The thread once started: effects are carried out there alone (`perform`).
    private var thread: Thread?
    /// Effects the state returned on another thread, for this one to carry out (`post`).
    private let posted = Locked<[BackgroundApplication.Client.Effect]>([])

    init() throws(ClientError) {
        do {
            (wakeRead, wakeWrite) = try Subprocess.pipe()
            try wakeRead.setNonBlocking()
            try wakeWrite.setNonBlocking()
        } catch {
            throw ClientError(.protocolError, "cannot make the library's wake-up pipe: \(error)")
        }
    }

    func start(application: BackgroundApplication, subscription: VarlinkConnection) {
        self.subscription = subscription
        let thread = Thread { [self] in
            Host.nameThread("bgtask-events")
            self.run(application)
        }
        thread.name = "bgtask-events"
        self.thread = thread
        thread.start()
    }

    /// Makes the thread look at its state again.
    func wake() { _ = try? wakeWrite.writeFile([1]) }

    /// Hands the thread effects the state returned to a call on another thread (a wake's
    /// completion handler, `beginBackgroundTask`, on the app's queue), and wakes it. Carried
    /// out there, a completion's `FinishWake` raced the thread's own flush of the calls
    /// connection: the frame written twice, and the app stopped by "Can't remove more items
    /// from a collection than it has" in `PipelinedConnection.flush`.
    func post(_ effects: [BackgroundApplication.Client.Effect]) {
        posted.withLock { $0 += effects }
        wake()
    }

    private func run(_ app: BackgroundApplication) {
        while let deadline = app.state.withLock({ $0.closed ? nil : Optional($0.client.nextDeadline) }) {
            let timeout = deadline.map { due in
                Int32(max(0, min(60_000, (due - Clock.monotonicNanoseconds() + 999_999) / 1_000_000)))
            } ?? -1
            // The wake-up pipe, the subscription, the calls connection (writable when it must write).
            let watched = [(wakeRead.rawValue, false), (subscription?.fileDescriptor ?? -1, false),
                           (calls?.fileDescriptor ?? -1, calls?.wantsWrite ?? false)]
            let ready = (try? waitReady(watched, timeoutMilliseconds: timeout)) ?? []
            if ready.contains(0) { _ = try? wakeRead.readAvailable(upTo: 256) }
            if ready.contains(1) { follow(app) }
            if ready.contains(2) { exchangeCalls(app) }
            perform(posted.withLock { posted in defer { posted = [] }; return posted }, app)
            perform(app.state.withLock { $0.client.tick(at: Clock.monotonicNanoseconds()) }, app)
        }
        subscription?.close()
        calls?.close()
    }

    /// Reads every event waiting on the subscription.
    private func follow(_ app: BackgroundApplication) {
        while let stream = subscription {
            do {
                let reply = try stream.receive(timeoutMilliseconds: 0)
                guard reply.error == nil, reply.continues else {
                    return lost(app, why: reply.error ?? "the subscription ended")
                }
                handle(reply.parameters, app)
            } catch where error.code == .timedOut {
                return  // the rest of an event has not arrived yet
            } catch {
                return lost(app, why: "\(error)")
            }
            if !stream.hasBufferedReply { return }
        }
    }

    /// Applies one Subscribe event.
    func handle(_ parameters: [String: JSON], _ app: BackgroundApplication) {
        guard let event = DaemonEvent(parameters) else { return }
        perform(app.state.withLock { $0.client.receive(event, at: Clock.monotonicNanoseconds()) }, app)
    }

    /// Carries out what the state asked for: on this thread (or before it starts).
    func perform(_ effects: [BackgroundApplication.Client.Effect], _ app: BackgroundApplication) {
        assert(thread == nil || Thread.current === thread, "the library's effects are carried out on its thread")
        for effect in effects {
            switch effect {
            case let .runHandler(handler, reason):
                app.onQueue { handler(reason) }
            case .enterBackground:
                let delegate = app.delegateReference
                app.onQueue { [weak self] in
                    delegate.value()?.applicationDidEnterBackground(app)
                    NotificationCenter.default.post(name: BackgroundApplication.didEnterBackgroundNotification, object: app)
                    // Returning from the handler reports the transition finished (once the
                    // grants of tasks begun in it are in, or just before the deadline).
                    app.state.withLock { $0.client.backgroundDelegateReturned() }
                    self?.wake()
                }
            case .enterForeground:
                let delegate = app.delegateReference
                app.onQueue {
                    delegate.value()?.applicationWillEnterForeground(app)
                    NotificationCenter.default.post(name: BackgroundApplication.willEnterForegroundNotification, object: app)
                    app.state.withLock { $0.client.foregroundDelegateReturned() }
                }
            case let .wake(reason, payload):
                let delegate = app.delegateReference
                app.onQueue { [weak self] in
                    let completion = WakeCompletion { [weak self] in
                        self?.post(app.state.withLock { $0.client.wakeCompleted(at: Clock.monotonicNanoseconds()) })
                    }
                    let userInfo = payload.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
                    app.wakeReasonBox.withLock { $0 = reason }
                    if let userInfo {
                        delegate.value()?.application(app, didReceiveRemoteNotification: userInfo,
                                                      fetchCompletionHandler: completion.call)
                            ?? completion.call(.noData)
                    } else {
                        delegate.value()?.application(app, performFetchWithCompletionHandler: completion.call)
                            ?? completion.call(.noData)
                    }
                }
            case let .launch(identifier, kind, taskID):
                guard let (task, run) = BGTaskScheduler.shared.launch(identifier, kind: kind, taskID: taskID, in: app) else { continue }
                let early = app.state.withLock {
                    $0.client.begun(taskID, name: identifier, handler: { @Sendable _ in task.expire() })
                }
                perform(early, app)
                run()
            case let .send(call):
                send(call, app)
            case .reconnect:
                do {
                    subscription = try BackgroundApplication.subscribe(at: app.socketPath, nonBlocking: true)
                } catch {
                    app.state.withLock { $0.client.reconnectFailed(at: Clock.monotonicNanoseconds()) }
                }
            }
        }
    }

    /// Sends one of the library's own calls without waiting for its reply.
    private func send(_ call: DaemonCall, _ app: BackgroundApplication) {
        let message = switch call {
        case .finishBackgroundTransition: VarlinkCall(.finishBackgroundTransition)
        case .finishWake: VarlinkCall(.finishWake)
        case let .endTask(id): VarlinkCall(.endTask, parameters: [Field.taskId: .int(Int64(id))])
        }
        do {
            if calls == nil { calls = try PipelinedConnection(path: app.socketPath) }
            try calls?.send(message, tag: call)
        } catch {
            callsLost(app, also: call)
        }
    }

    /// Writes what waits and reads the replies of the library's own calls.
    private func exchangeCalls(_ app: BackgroundApplication) {
        guard let connection = calls else { return }
        do {
            try connection.flush()
            for (call, reply) in try connection.receiveAvailable() {
                guard let error = reply.error else { continue }
                switch (call, ErrorName(rawValue: error)) {
                case (.endTask, .noSuchTask?), (.finishBackgroundTransition, _), (.finishWake, _):
                    break  // ended meanwhile; or the transition or wake is over already
                case let (.endTask(id), _):
                    BackgroundApplication.emit("Ending background task \(id) failed: \(error)")
                }
            }
        } catch {
            callsLost(app)
        }
    }

    /// The calls connection broke: ends it did not deliver are sent once the daemon is back.
    private func callsLost(_ app: BackgroundApplication, also call: DaemonCall? = nil) {
        let undelivered = (calls?.unanswered ?? []) + (call.map { [$0] } ?? [])
        calls?.close()
        calls = nil
        app.state.withLock { state in
            for case let .endTask(id) in undelivered { state.client.endUndelivered(id) }
        }
    }

    /// The daemon went away: reconnection starts, and outstanding tasks wait for it.
    private func lost(_ app: BackgroundApplication, why: String) {
        subscription?.close()
        subscription = nil
        callsLost(app)
        app.dropCallConnection()
        if app.state.withLock({ $0.client.lost(at: Clock.monotonicNanoseconds()) }) {
            BackgroundApplication.emit("Lost bgtaskd (\(why)); reconnecting")
        }
    }
}
