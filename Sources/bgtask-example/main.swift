// SPDX-License-Identifier: Apache-2.0
// bgtask-example: the whole background cycle, as an iOS developer would write it.
//
//   bgtaskd --socket /tmp/b/io.bgtaskd --set BackgroundTimeSec=3s --set ExpirationWarningSec=1s &
//   BGTASKD_SOCKET=/tmp/b/io.bgtaskd bgtask-example &
//   bgtaskctl --socket /tmp/b/io.bgtaskd background $!
//
// It uploads in the background, ends its task when warned, and is suspended; bring it back
// with `bgtaskctl foreground PID`.
import BGTaskClient
import Foundation

final class Uploader: BackgroundApplicationDelegate, @unchecked Sendable {
    var task = BackgroundTaskIdentifier.invalid
    var chunks = 0

    func applicationDidEnterBackground(_ application: BackgroundApplication) {
        say("entered the background with \(Int(application.backgroundTimeRemaining.rounded()))s of background time")
        task = application.beginBackgroundTask(withName: "upload") { [self] in
            // Runs once, on the main queue, shortly before time runs out.
            say("time is nearly up after \(chunks) chunks; ending the upload task")
            application.endBackgroundTask(task)
            task = .invalid
        }
        say("began background task \(task)")
        upload(application)
    }

    func upload(_ application: BackgroundApplication) {
        guard task != .invalid else { return }
        chunks += 1
        DispatchQueue.main.asyncAfter(deadline: .now() + 0.2) { self.upload(application) }
    }

    func applicationWillEnterForeground(_ application: BackgroundApplication) {
        say("back in the foreground; \(chunks) chunks uploaded so far")
    }
}

/// Prints a line at once, even when stdout is a pipe.
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

let uploader = Uploader()
do {
    let app = try BackgroundApplication()
    app.delegate = uploader
    say("pid \(getpid()) running in the foreground; move it with: bgtaskctl background \(getpid())")
    withExtendedLifetime(app) { dispatchMain() }
} catch {
    say("bgtask-example: \(error)")
    exit(1)
}
