// SPDX-License-Identifier: Apache-2.0
// The floor under the lateness rows, measured in the same run: the daemon's own loop with
// nothing to do but relay each instant.
import BGTaskSystem
import Foundation

/// The lateness rows' baseline: a thread running the daemon's loop (`EventLoop`, one
/// timerfd) whose only work, when an instant falls due, is to send it down a Unix socket to a
/// thread that timestamps its arrival, as the daemon sends a deadline's event to the bench's
/// monitor. The same path — a timer's wake-up, a send, a reader's wake-up — without the
/// daemon's work, at the same instants, beside the same apps and poller: what is left of a
/// lateness figure when the daemon costs nothing.
final class TimerRelay: @unchecked Sendable {
    /// How late each instant arrived, in milliseconds.
    let lateness = Locked<[Double]>([])
    /// When each was due, in the same order.
    let dues = Locked<[Int64]>([])
    private let instants: FileDescriptor
    private let loopThread: Thread

    init() throws {
        let (instantsRead, instantsWrite) = try Subprocess.pipe()
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw Errno.current("socketpair")
        }
        let relayWrite = FileDescriptor(pair[0]), relayRead = FileDescriptor(pair[1])
        instants = instantsWrite
        let handoff = Handoff((instantsRead, relayWrite))
        loopThread = Thread {
            let (instantsRead, relayWrite) = handoff.value
            do {
                let loop = try EventLoop()
                var pending: [Int64] = []  // due instants, latest first
                var timer: EventSource?
                timer = try loop.addTimer {
                    let now = Clock.monotonicNanoseconds()
                    while let next = pending.last, next <= now {
                        pending.removeLast()
                        _ = try? relayWrite.writeAll(withUnsafeBytes(of: next) { Array($0) })
                    }
                    timer?.arm(at: pending.last)
                }
                var buffered: [UInt8] = []
                let input = try loop.addIO(instantsRead.rawValue, events: IOEvents.readable) { _ in
                    guard let bytes = try? instantsRead.read(upTo: 4096), !bytes.isEmpty else { return loop.exit(code: 0) }
                    buffered += bytes
                    while buffered.count >= 8 {
                        pending.append(buffered.prefix(8).withUnsafeBytes { $0.loadUnaligned(as: Int64.self) })
                        buffered.removeFirst(8)
                    }
                    pending.sort(by: >)
                    timer?.arm(at: pending.last)
                }
                _ = input
                _ = try loop.run()
                relayWrite.close()
            } catch {
                say("timer relay: \(error)")
            }
        }
        let lateness = self.lateness
        let dues = self.dues
        Thread {
            var buffered: [UInt8] = []
            while let bytes = try? relayRead.read(upTo: 4096), !bytes.isEmpty {
                let arrived = now()
                buffered += bytes
                while buffered.count >= 8 {
                    let instant = buffered.prefix(8).withUnsafeBytes { $0.loadUnaligned(as: Int64.self) }
                    buffered.removeFirst(8)
                    lateness.withLock { $0.append(Double(arrived - instant) / 1e6) }
                    dues.withLock { $0.append(instant) }
                }
            }
        }.start()
        loopThread.start()
    }

    /// Relays `instant` (monotonic nanoseconds, as `now()`) when it falls due.
    func add(_ instant: Int64) throws {
        try instants.writeAll(withUnsafeBytes(of: instant) { Array($0) })
    }

    /// Ends the loop thread once it has read what was added; what is still pending is not relayed.
    func stop() { instants.close() }
}
