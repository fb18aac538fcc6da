// SPDX-License-Identifier: Apache-2.0
// bgtask-libprobe: an app built on BackgroundApplication, scripted by end-to-end tests.
//
// Commands on stdin, one JSON object per line on stdout:
//   begin NAME [keep]      beginBackgroundTask; its handler reports, then ends the task
//                          (with "keep" it does not end it)        → {"begin": ID}
//   end ID                 endBackgroundTask                      → {"end": ID}
//   on-background NAME     the delegate begins NAME in applicationDidEnterBackground
//                                                               → {"onBackground": NAME}
//   remaining              → {"remaining": SECONDS or "max", "state": ...}
//   connected              → {"connected": BOOL}
//   with-task NAME         withBackgroundTask running until cancelled → {"withTask": ...}
//   stress THREADS COUNT   begin+end COUNT times on each of THREADS threads (each setting
//                          callTimeout too)                         → {"stress": {...}}
//   wake-mode MODE         how the delegate answers a wake: complete (default: calls the
//                          completion handler at once, twice), ignore (never), keep (begins a
//                          task it keeps, then completes)                → {"wakeMode": MODE}
// Wakes: {"wake": REASON, "payload": {...} or null, "completed": REALTIME_NS (when it did)}.
//   register ID MODE       BGTaskScheduler.register: the launch handler reports; MODE complete
//                          completes at once, hold keeps it until `complete ID` (its
//                          expiration handler reports, then completes as failed)  → {"registered": ID}
//   submit KIND ID AFTER [power] [network]   BGTaskScheduler.submit     → {"submitted": ID} or {"submitError": CODE}
//   complete ID            setTaskCompleted(success: true)             → {"completed": ID}
//   pending                getPendingTaskRequests                      → {"pending": [ID...]}
//   cancel ID              cancel(taskRequestWithIdentifier:)          → {"cancelled": ID}
// Launches: {"launched": ID, "kind": "refresh"|"processing", "state": ...}, {"launchExpired": ID}.
//   exit
// Events: {"delegate": ...}, {"notification": ...}, {"expired": ID, "reason": ...}.
import BGTaskClient
import BGTaskSystem
import Foundation
import Varlink

func emit(_ object: [String: JSON]) {
    FileHandle.standardOutput.write(Data((JSON.object(object).serialized + "\n").utf8))
}

final class Delegate: BackgroundApplicationDelegate, @unchecked Sendable {
    var taskOnBackground: String?
    var wakeMode = "complete"

    func application(_ application: BackgroundApplication,
                     performFetchWithCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void) {
        woke(application, reason: application.wakeReason ?? "", payload: .null, completionHandler)
    }

    func application(_ application: BackgroundApplication, didReceiveRemoteNotification userInfo: [String: Any],
                     fetchCompletionHandler completionHandler: @escaping @Sendable (BackgroundFetchResult) -> Void) {
        let data = (try? JSONSerialization.data(withJSONObject: userInfo)) ?? Data("{}".utf8)
        woke(application, reason: application.wakeReason ?? "",
             payload: (try? JSON.parse(String(decoding: data, as: UTF8.self))) ?? .null, completionHandler)
    }

    func woke(_ application: BackgroundApplication, reason: String, payload: JSON,
              _ completion: @escaping @Sendable (BackgroundFetchResult) -> Void) {
        switch wakeMode {
        case "ignore":
            emit(["wake": .string(reason), "payload": payload])
        case "keep":
            begin("kept", keep: true, in: application)
            fallthrough
        default:
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            emit(["wake": .string(reason), "payload": payload,
                  "completed": .int(Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec))])
            completion(.newData)
            completion(.newData)  // a second call changes nothing
        }
    }

    func applicationDidEnterBackground(_ application: BackgroundApplication) {
        emit(["delegate": "didEnterBackground"])
        if let name = taskOnBackground { begin(name, keep: false, in: application) }
    }

    func applicationWillEnterForeground(_ application: BackgroundApplication) {
        emit(["delegate": "willEnterForeground"])
    }
}

func begin(_ name: String, keep: Bool, in app: BackgroundApplication) {
    let id = Locked(BackgroundTaskIdentifier.invalid)
    let begun = app.beginBackgroundTask(withName: name) { (reason: ExpirationReason) in
        let task = id.withLock { $0 }
        var reasonText: String
        switch reason {
        case .backgroundTimeExpiring: reasonText = "expiring"
        case .backgroundTimeExpired: reasonText = "expired"
        case let .denied(why): reasonText = "denied:" + why
        case .daemonUnavailable: reasonText = "daemonUnavailable"
        }
        emit(["expired": .int(Int64(task.rawValue)), "reason": .string(reasonText)])
        if !keep { app.endBackgroundTask(task) }
    }
    id.withLock { $0 = begun }
    emit(["begin": .int(Int64(begun.rawValue)), "name": .string(name)])
}

let launches = Locked<[String: BGTask]>([:])

func register(_ identifier: String, mode: String) {
    let registered = BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: nil) { task in
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        emit(["launched": .string(task.identifier), "kind": .string(task is BGProcessingTask ? "processing" : "refresh"),
              "state": .string(app.applicationState.description),
              "at": .int(Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec))])
        if mode == "complete" { return task.setTaskCompleted(success: true) }
        launches.withLock { $0[task.identifier] = task }
        task.expirationHandler = {
            emit(["launchExpired": .string(task.identifier)])
            task.setTaskCompleted(success: false)
        }
    }
    emit(["registered": .string(identifier), "new": .bool(registered)])
}

let arguments = CommandLine.arguments
let socket = arguments.count > 2 && arguments[1] == "--socket" ? arguments[2] : nil
let queue = DispatchQueue(label: "handlers")
BackgroundApplication.logHandler = { line in emit(["log": .string(line)]) }
let app: BackgroundApplication
do {
    app = try BackgroundApplication(socketPath: socket, queue: queue)
} catch {
    emit(["error": .string("\(error)")])
    exit(1)
}
let delegate = Delegate()
app.delegate = delegate
for name in [BackgroundApplication.didEnterBackgroundNotification, BackgroundApplication.willEnterForegroundNotification] {
    _ = NotificationCenter.default.addObserver(forName: name, object: nil, queue: nil) { note in
        emit(["notification": .string(note.name.rawValue)])
    }
}
emit(["ready": .int(Int64(getpid()))])

while let line = readLine() {
    let words = line.split(separator: " ").map(String.init)
    switch words.first {
    case "begin"?: begin(words.count > 1 ? words[1] : "", keep: words.count > 2 && words[2] == "keep", in: app)
    case "end"?:
        app.endBackgroundTask(BackgroundTaskIdentifier(rawValue: Int(words.count > 1 ? words[1] : "") ?? 0))
        emit(["end": .int(Int64(words.count > 1 ? words[1] : "") ?? 0)])
    case "on-background"?:
        let name = words.count > 1 ? words[1] : "handler"
        queue.sync { delegate.taskOnBackground = name }
        emit(["onBackground": .string(name)])
    case "remaining"?:
        let left = app.backgroundTimeRemaining
        emit(["remaining": left == .greatestFiniteMagnitude ? "max" : .double(left), "state": .string(app.applicationState.description)])
    case "connected"?: emit(["connected": .bool(app.isConnected)])
    case "with-task"?:
        let name = words.count > 1 ? words[1] : "scoped"
        Task.detached {  // not on the main actor: its thread is busy reading stdin
            do {
                let result = try await app.withBackgroundTask(named: name) { () async throws -> String in
                    emit(["withTask": "running"])
                    while true { try await Task.sleep(for: .milliseconds(10)) }  // the work, until cancelled
                }
                emit(["withTask": .string(result)])
            } catch is CancellationError {
                emit(["withTask": "cancelled"])
            } catch {
                emit(["withTask": .string("error: \(error)")])
            }
        }
    case "stress"?:
        let threads = Int(words.count > 1 ? words[1] : "") ?? 8
        let count = Int(words.count > 2 ? words[2] : "") ?? 100
        let begun = Locked(0), invalid = Locked(0)
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            for _ in 0..<count {
                app.callTimeout = 5  // set from every thread too, as calls read it (make sanitize: no race)
                let id = app.beginBackgroundTask(withName: "stress", expirationHandler: nil)
                if id == .invalid { invalid.withLock { $0 += 1 } } else { begun.withLock { $0 += 1 } }
                app.endBackgroundTask(id)
            }
        }
        emit(["stress": .object(["begun": .int(Int64(begun.withLock { $0 })), "invalid": .int(Int64(invalid.withLock { $0 }))])])
    case "wake-mode"?:
        delegate.wakeMode = words.count > 1 ? words[1] : "complete"
        emit(["wakeMode": .string(delegate.wakeMode)])
    case "register"?: register(words.count > 1 ? words[1] : "", mode: words.count > 2 ? words[2] : "complete")
    case "submit"?:
        guard words.count >= 4, let after = Double(words[3]) else { emit(["error": "submit KIND ID AFTER"]); continue }
        let request: BGTaskRequest
        if words[1] == "processing" {
            let processing = BGProcessingTaskRequest(identifier: words[2])
            processing.requiresExternalPower = words.contains("power")
            processing.requiresNetworkConnectivity = words.contains("network")
            request = processing
        } else {
            request = BGAppRefreshTaskRequest(identifier: words[2])
        }
        request.earliestBeginDate = Date(timeIntervalSinceNow: after)
        do {
            try BGTaskScheduler.shared.submit(request)
            emit(["submitted": .string(words[2])])
        } catch let error as BGTaskScheduler.Error {
            emit(["submitError": .string("\(error.code)"), "message": .string(error.message)])
        } catch {
            emit(["submitError": .string("\(error)")])
        }
    case "complete"?:
        let identifier = words.count > 1 ? words[1] : ""
        launches.withLock { $0.removeValue(forKey: identifier) }?.setTaskCompleted(success: true)
        emit(["completed": .string(identifier)])
    case "pending"?:
        let done = DispatchSemaphore(value: 0)
        let found = Locked<[String]>([])
        BGTaskScheduler.shared.getPendingTaskRequests { requests in
            found.withLock { $0 = requests.map(\.identifier).sorted() }
            done.signal()
        }
        done.wait()
        emit(["pending": .array(found.withLock { $0 }.map { .string($0) })])
    case "cancel"?:
        BGTaskScheduler.shared.cancel(taskRequestWithIdentifier: words.count > 1 ? words[1] : "")
        emit(["cancelled": .string(words.count > 1 ? words[1] : "")])
    case "exit"?: exit(0)
    default: emit(["error": .string("unknown command '\(line)'")])
    }
}
