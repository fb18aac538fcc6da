// SPDX-License-Identifier: Apache-2.0
@testable import BGTaskClient
import Dispatch
import BGTaskSystem
import Foundation
import Testing

/// `BGTaskRequest` is `Sendable`, as UIKit's properties are atomic: a request may be set on
/// one thread while another reads or submits it. (The check has its teeth under TSan, which
/// `make sanitize` runs: with plain stored properties it reports the race; here every read
/// must at least be one of the values written.)
@Suite struct TaskRequestTests {
    @Test func aRequestsPropertiesMayBeSetAndReadFromManyThreads() {
        let request = BGProcessingTaskRequest(identifier: "sync")
        let dates = (0..<4).map { Date(timeIntervalSince1970: 1_000_000 * Double($0 + 1)) }
        let strays = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 4) { thread in
            for round in 0..<5_000 {
                if thread < 2 {
                    request.earliestBeginDate = dates[(thread + round) % 4]
                    request.interval = Double(900 + round % 4)
                    request.requiresExternalPower = round % 2 == 0
                } else {
                    let date = request.earliestBeginDate, interval = request.interval
                    let settings = request.settings.withLock { $0 }  // what `submit` reads, at once
                    let known = (date == nil || dates.contains(date!)) && (interval == nil || (900...903).contains(interval!))
                        && (settings.earliestBeginDate == nil || dates.contains(settings.earliestBeginDate!))
                    if !known { strays.withLock { $0 += 1 } }
                }
            }
        }
        #expect(strays.withLock { $0 } == 0)
        #expect(request.earliestBeginDate.map(dates.contains) == true && request.interval.map { (900...903).contains($0) } == true)
    }
}
