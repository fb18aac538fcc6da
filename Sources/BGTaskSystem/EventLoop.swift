// SPDX-License-Identifier: Apache-2.0
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

    /// Runs one iteration, waiting at most `timeoutMilliseconds` for an event (a test's loop
    /// without `run()`). `sd_event_run(3)`
    @discardableResult
    public func runOnce(timeoutMilliseconds: Int) throws(Errno) -> Int32 {
        try systemdCall("sd_event_run") { sd_event_run(event, UInt64(timeoutMilliseconds) * 1000) }
    }

    /// Makes `run()` return `code` after this pass. `sd_event_exit(3)`
    public func exit(code: Int32) { sd_event_exit(event, code) }
}

/// An event source; disabled and released when this object goes away.
public final class EventSource {
    let handler: (UInt32) -> Void
    var source: OpaquePointer?
    /// A member of an `IOGroup` instead of an sd-event source of its own.
    private let group: IOGroup?
    private let id: UInt64
    private let fd: Int32

    init(handler: @escaping (UInt32) -> Void) {
        self.handler = handler
        group = nil
        id = 0
        fd = -1
    }

    init(group: IOGroup, id: UInt64, fd: Int32) {
        handler = { _ in }
        self.group = group
        self.id = id
        self.fd = fd
    }

    deinit {
        if let group { group.remove(id: id, fd: fd) } else { sd_event_source_disable_unref(source) }
    }

    /// Changes the `EPOLL*` events an I/O source waits for. `sd_event_source_set_io_events(3)`
    public func setIOEvents(_ events: UInt32) {
        if let group { group.modify(id: id, fd: fd, events: events) } else { sd_event_source_set_io_events(source, events) }
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

/// Many descriptors behind one sd-event source: an epoll instance of their own, read in
/// batches. sd-event dispatches one source per iteration and asks epoll again before each,
/// so N descriptors ready at once cost O(N²) (10,000 apps exiting together kept the daemon
/// busy for seconds); a group hands everything ready to one dispatch, so its owner can also
/// finish the work of all of them together (the daemon's group commit).
public final class IOGroup {
    private let epoll: FileDescriptor
    private var source: EventSource?
    private var handlers: [UInt64: (UInt32) -> Void] = [:]
    private var nextID: UInt64 = 1
    private var ready = [epoll_event](repeating: epoll_event(), count: 256)
    /// The most handled in one dispatch, so one burst does not hold the loop: the rest are
    /// still ready, and the loop comes back to them after its other sources.
    static let maximumPerDispatch = 1024

    /// `onReady` runs when members are ready; it calls `dispatchReady()`, around whatever
    /// must happen before and after the members' handlers.
    public init(loop: EventLoop, _ onReady: @escaping () -> Void) throws(Errno) {
        epoll = FileDescriptor(try systemCall("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) })
        source = try loop.addIO(epoll.rawValue, events: IOEvents.readable) { _ in onReady() }
    }

    /// Calls `handler` with the `EPOLL*` events whenever `fd` is ready for `events`, from
    /// `dispatchReady()`. The member leaves the group when the returned source goes away,
    /// which must happen before `fd` is closed. `epoll_ctl(2)`
    public func add(_ fd: Int32, events: UInt32, _ handler: @escaping (UInt32) -> Void) throws(Errno) -> EventSource {
        let id = nextID
        nextID += 1
        var event = epoll_event()
        event.events = events
        event.data.u64 = id
        let group = epoll.rawValue
        try systemCall("epoll_ctl(ADD, \(fd))") { epoll_ctl(group, EPOLL_CTL_ADD, fd, &event) }
        handlers[id] = handler
        return EventSource(group: self, id: id, fd: fd)
    }

    func modify(id: UInt64, fd: Int32, events: UInt32) {
        var event = epoll_event()
        event.events = events
        event.data.u64 = id
        epoll_ctl(epoll.rawValue, EPOLL_CTL_MOD, fd, &event)
    }

    func remove(id: UInt64, fd: Int32) {
        handlers[id] = nil
        epoll_ctl(epoll.rawValue, EPOLL_CTL_DEL, fd, nil)
    }

    /// Runs the handler of every member ready now (up to `maximumPerDispatch`). A member
    /// removed by an earlier handler in the same batch is skipped.
    public func dispatchReady() {
        var handled = 0
        while handled < Self.maximumPerDispatch {
            let count = Int(epoll_wait(epoll.rawValue, &ready, Int32(ready.count), 0))
            guard count > 0 else { return }
            for index in 0..<count {
                if let handler = handlers[ready[index].data.u64] { handler(ready[index].events) }
            }
            handled += count
            if count < ready.count { return }
        }
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
