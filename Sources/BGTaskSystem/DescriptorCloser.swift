// SPDX-License-Identifier: Apache-2.0
import Glibc

/// Closes descriptors on a thread of its own, for a loop that closes many at once.
///
/// Closing a client's socket is its whole teardown (the socket's buffers, its inode, its
/// epoll links, its peer's wake-up): about 6 µs, a sixth of the daemon's CPU when 10,000
/// apps warned together end their tasks by closing their streams (`perf`, the bench's
/// deadline burst). Nothing waits for it — the peer had hung up, or is told by its own
/// read, a moment later — so the loop gathers what it closes and hands a batch over
/// (`handOver()`: the daemon's before its pass's replies go out, the loop's before it waits)
/// to this thread, which closes them meanwhile, on another CPU where there is one. Fewer
/// than `batch` are closed there and then on the loop's thread, as before: waking this one
/// costs about what a few closes do, and a lone close stays in order with what is sent
/// after it. A descriptor handed over is not used again by anyone: its number is not reused
/// before this thread closes it, so nothing can mistake a new file for it.
public final class DescriptorCloser {
    /// What the loop's thread closed since its last hand-over (that thread's alone).
    private var gathered: [Int32] = []
    private let shared = Shared()
    private var thread: pthread_t?

    /// What the loop's thread and the closer's share, under `mutex`. The closer's thread
    /// holds this, not the closer, which goes away when its owner lets it go.
    private final class Shared: @unchecked Sendable {
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        let handedOver = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
        /// Handed over, not closed yet.
        var handed: [Int32] = []
        /// The thread waits for a hand-over: only then is it woken.
        var waiting = false
        /// The thread is to close what it has and end.
        var ending = false

        init() {
            pthread_mutex_init(mutex, nil)
            pthread_cond_init(handedOver, nil)
        }

        deinit {
            for fd in handed { Glibc.close(fd) }
            pthread_cond_destroy(handedOver)
            pthread_mutex_destroy(mutex)
            handedOver.deallocate()
            mutex.deallocate()
        }

        /// The thread: closes what is handed over as it comes, until `ending`.
        func closeHandedOver() {
            Host.nameThread("closer")
            var taken: [Int32] = []
            pthread_mutex_lock(mutex)
            while true {
                while handed.isEmpty, !ending {
                    waiting = true
                    pthread_cond_wait(handedOver, mutex)
                    waiting = false
                }
                if handed.isEmpty { break }
                swap(&taken, &handed)
                pthread_mutex_unlock(mutex)
                for fd in taken { Glibc.close(fd) }
                taken.removeAll(keepingCapacity: true)
                pthread_mutex_lock(mutex)
            }
            pthread_mutex_unlock(mutex)
        }
    }

    public init() {}

    /// Whether its thread was started (a batch was handed over).
    var threadStarted: Bool { thread != nil }

    /// Closes what is left, and ends the thread once it has closed what it was handed.
    deinit {
        for fd in gathered { Glibc.close(fd) }
        guard let thread else { return }
        pthread_mutex_lock(shared.mutex)
        shared.ending = true
        pthread_cond_signal(shared.handedOver)
        pthread_mutex_unlock(shared.mutex)
        pthread_join(thread, nil)
    }

    /// Closes `fd` soon, on the closer's thread, once it is handed over. `fd` is this
    /// closer's from now on.
    public func close(_ fd: Int32) {
        guard fd >= 0 else { return }
        gathered.append(fd)
    }

    /// The fewest descriptors handed to the thread at once; fewer are closed by `handOver`.
    public static let batch = 8

    /// Hands what was gathered to the thread (started at the first), waking it if it waits;
    /// closes it here if it is less than `batch`, or where no thread can be started.
    public func handOver() {
        guard !gathered.isEmpty else { return }
        if gathered.count < Self.batch || (thread == nil && !start()) {
            for fd in gathered { Glibc.close(fd) }
            gathered.removeAll(keepingCapacity: true)
            return
        }
        pthread_mutex_lock(shared.mutex)
        if shared.handed.isEmpty {
            swap(&shared.handed, &gathered)
        } else {
            shared.handed.append(contentsOf: gathered)
            gathered.removeAll(keepingCapacity: true)
        }
        if shared.waiting { pthread_cond_signal(shared.handedOver) }
        pthread_mutex_unlock(shared.mutex)
    }

    /// Starts the thread with every signal blocked: a process-directed signal the loop takes
    /// through a `signalfd` (sd-event's) must not be delivered to this thread instead.
    private func start() -> Bool {
        var all = sigset_t(), previous = sigset_t()
        sigfillset(&all)
        pthread_sigmask(SIG_SETMASK, &all, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        var created = pthread_t()
        let context = Unmanaged.passRetained(shared).toOpaque()
        guard pthread_create(&created, nil, { raw in
            Unmanaged<Shared>.fromOpaque(raw!).takeRetainedValue().closeHandedOver()
            return nil
        }, context) == 0 else {
            Unmanaged<Shared>.fromOpaque(context).release()
            return false
        }
        thread = created
        return true
    }
}
