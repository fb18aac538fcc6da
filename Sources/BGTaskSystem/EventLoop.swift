import CSystemd
import Glibc

/// A single-threaded event loop over sd-event: I/O, one-shot timers on `CLOCK_MONOTONIC`,
/// signals, a post-dispatch hook, and the systemd watchdog.
public final class EventLoop {
    let event: OpaquePointer

    /// A new loop. `sd_event_new(3)`
    public init() throws(Errno) {
        var event: OpaquePointer?
        try systemdCall("sd_event_new") { sd_event_new(&event) }
        self.event = event!
    }

    deinit { sd_event_unref(event) }

    /// The monotonic time at which this loop pass woke, in nanoseconds. `sd_event_now(3)`
    public var now: Int64 {
        var usec: UInt64 = 0
        if sd_event_now(event, CLOCK_MONOTONIC, &usec) < 0 { return Clock.monotonicNanoseconds() }
        return Int64(usec) * 1000
    }

    /// Calls `handler` with the `EPOLL*` events whenever `fd` is ready for `events`.
    /// `sd_event_add_io(3)`
    public func addIO(_ fd: Int32, events: UInt32, _ handler: @escaping (UInt32) -> Void) throws(Errno) -> EventSource {
        let source = EventSource(handler: handler)
        var raw: OpaquePointer?
        try systemdCall("sd_event_add_io") {
            sd_event_add_io(event, &raw, fd, events, { _, _, revents, userdata in
                let source = Unmanaged<EventSource>.fromOpaque(userdata!).takeUnretainedValue()
                source.handler(revents)
                return 0
            }, Unmanaged.passUnretained(source).toOpaque())
        }
        source.source = raw
        return source
    }

    /// A one-shot `CLOCK_MONOTONIC` timer, initially off; arm it with `EventSource.arm(at:)`.
    /// Accuracy is 1 µs: deadlines must not be coalesced. `sd_event_add_time(3)`
    public func addTimer(_ handler: @escaping () -> Void) throws(Errno) -> EventSource {
        let source = EventSource(handler: { _ in handler() })
        var raw: OpaquePointer?
        try systemdCall("sd_event_add_time") {
            sd_event_add_time(event, &raw, CLOCK_MONOTONIC, UInt64.max, 1, { _, _, userdata in
                let source = Unmanaged<EventSource>.fromOpaque(userdata!).takeUnretainedValue()
                source.handler(0)
                return 0
            }, Unmanaged.passUnretained(source).toOpaque())
        }
        source.source = raw
        sd_event_source_set_enabled(raw, Int32(SD_EVENT_OFF))
        return source
    }

    /// Blocks `signal` for the process and handles it on the loop. `sd_event_add_signal(3)`
    public func addSignal(_ signal: Int32, _ handler: @escaping () -> Void) throws(Errno) -> EventSource {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, signal)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        let source = EventSource(handler: { _ in handler() })
        var raw: OpaquePointer?
        try systemdCall("sd_event_add_signal(\(signal))") {
            sd_event_add_signal(event, &raw, signal, { _, _, userdata in
                let source = Unmanaged<EventSource>.fromOpaque(userdata!).takeUnretainedValue()
                source.handler(0)
                return 0
            }, Unmanaged.passUnretained(source).toOpaque())
        }
        source.source = raw
        return source
    }

    /// Sends `WATCHDOG=1` from the loop at half of `WATCHDOG_USEC`, when systemd asks for it:
    /// a stuck loop stops the pings. Returns whether the watchdog is on. `sd_event_set_watchdog(3)`
    @discardableResult
    public func enableWatchdog() -> Bool { sd_event_set_watchdog(event, 1) > 0 }

    /// Runs until `exit(code:)`; returns the code. `sd_event_loop(3)`
    public func run() throws(Errno) -> Int32 {
        try systemdCall("sd_event_loop") { sd_event_loop(event) }
    }

    /// Makes `run()` return `code` after this pass. `sd_event_exit(3)`
    public func exit(code: Int32) { sd_event_exit(event, code) }
}

/// An event source; disabled and released when this object goes away.
public final class EventSource {
    let handler: (UInt32) -> Void
    var source: OpaquePointer?

    init(handler: @escaping (UInt32) -> Void) { self.handler = handler }

    deinit { sd_event_source_disable_unref(source) }

    /// Changes the `EPOLL*` events an I/O source waits for. `sd_event_source_set_io_events(3)`
    public func setIOEvents(_ events: UInt32) {
        sd_event_source_set_io_events(source, events)
    }

    /// Arms a timer to fire once at `monotonicNanoseconds` (rounded up to the microsecond, so
    /// it never fires early), or turns it off for `nil`. `sd_event_source_set_time(3)`
    public func arm(at monotonicNanoseconds: Int64?) {
        guard let ns = monotonicNanoseconds else {
            sd_event_source_set_enabled(source, Int32(SD_EVENT_OFF))
            return
        }
        let usec = UInt64(max(0, (ns + 999) / 1000))
        sd_event_source_set_time(source, usec)
        sd_event_source_set_enabled(source, Int32(SD_EVENT_ONESHOT))
    }
}

/// `EPOLL*` bits for I/O sources, so callers need not import the C module.
public enum IOEvents {
    public static let readable = UInt32(EPOLLIN.rawValue)
    public static let writable = UInt32(EPOLLOUT.rawValue)
    public static let error = UInt32(EPOLLERR.rawValue)
    public static let hangup = UInt32(EPOLLHUP.rawValue)
    /// The peer shut down its side (`EPOLLRDHUP`): seen even while not reading.
    public static let peerHangup = UInt32(EPOLLRDHUP.rawValue)
    /// Out-of-band: kernfs files such as `cgroup.events` report changes this way.
    public static let priority = UInt32(EPOLLPRI.rawValue)
}

/// 64 random bits from the kernel. `getrandom(2)`
public func randomSeed() -> UInt64 {
    var seed = UInt64(bitPattern: Clock.realtimeNanoseconds()) ^ UInt64(getpid())
    _ = getrandom(&seed, MemoryLayout<UInt64>.size, 0)
    return seed
}
