// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// A single-threaded event loop: I/O, one-shot timers (`CLOCK_MONOTONIC`, `CLOCK_BOOTTIME`), signals, groups
/// of descriptors handled together, and the systemd watchdog.
///
/// The loop is one epoll instance of its own. Descriptors and timers (`timerfd`s) are its
/// members, so a ready client costs one `epoll_wait` and its handler; sd-event is a member
/// too, for what it does best and is not on any call's path: signals, sd-bus connections
/// attached to it, and the watchdog. sd-event is turned (`sd_event_wait`, dispatch,
/// `sd_event_prepare`) only when its descriptor is ready or its sources were changed from
/// outside its dispatch (`eventSourcesChanged()`); between turns it stays armed, and its
/// descriptor is ready exactly when it has work. (Nesting the other way — the clients'
/// epoll as one sd-event source — cost a second `epoll_wait` and a turn of sd-event per
/// call: about 1,200 instructions and one system call in four.)
public final class EventLoop {
    /// For sd-bus connections attached to the loop (`sd_bus_attach_event(3)`).
    let event: OpaquePointer
    private let epoll: FileDescriptor
    private var members: [Member] = []
    private var freeMembers: [Int] = []
    private let ready: UnsafeMutablePointer<epoll_event>
    /// Groups with members ready in this iteration, in the order they became ready.
    private var readyGroups: [IOGroup] = []
    /// sd-event waits for its descriptor (`sd_event_prepare` returned 0).
    private var eventArmed = false
    /// sd-event must be turned before the loop blocks.
    private var eventNeedsTurn = true
    /// `soon` runs at the end of the next iteration (`runSoon()`).
    private var soonPending = false
    /// Work that yields to what else is ready and goes on right after it (a connection's next
    /// turn): run once at the end of the iteration after `runSoon()`, whose wait does not
    /// block. A timer armed at the present did the same at the cost of a `timerfd_settime`
    /// (two, with the next deadline armed again after it), the timer's interrupt and a read
    /// of it: for every 2 ms turn of a screen lock's 200 pipelined calls.
    public var soon: (() -> Void)?
    private var exitCode: Int32?
    /// Closes what the loop's sources close (`EventSource.close`), a batch off the loop's
    /// thread: handed over by the loop's owner (`handOverClosed()`), and before each wait.
    let closer = DescriptorCloser()

    /// Closes the descriptors its sources closed since the last time, or hands them to the
    /// closer's thread (`DescriptorCloser.handOver`): for an owner about to send what follows
    /// their close.
    public func handOverClosed() { closer.handOver() }

    /// The most events one wait takes, and so the most members of a group handled in one
    /// dispatch: one burst does not hold the loop, and the rest are still ready next time.
    public static let maximumPerWait = 1024
    /// The epoll token of sd-event's descriptor; members' tokens are index and generation.
    private static let eventToken = UInt64.max

    private struct Member {
        var generation: UInt32 = 0
        var handler: ((UInt32) -> Void)?
        var group: IOGroup?
    }

    /// A new loop. `epoll_create1(2)`, `sd_event_new(3)`
    public init() throws(Errno) {
        epoll = FileDescriptor(try systemCall("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) })
        var event: OpaquePointer?
        try systemdCall("sd_event_new") { sd_event_new(&event) }
        self.event = event!
        ready = .allocate(capacity: Self.maximumPerWait)
        var member = epoll_event()
        member.events = IOEvents.readable
        member.data.u64 = Self.eventToken
        let loop = epoll.rawValue, fd = sd_event_get_fd(event)
        try systemCall("epoll_ctl(ADD, sd-event)") { epoll_ctl(loop, EPOLL_CTL_ADD, fd, &member) }
    }

    deinit {
        ready.deallocate()
        sd_event_unref(event)
    }

    /// The monotonic time at which this loop pass woke, in nanoseconds; before the first
    /// wait (a daemon restoring its state), the clock's.
    public var now: Int64 { wokeAt ?? Clock.monotonicNanoseconds() }
    private var wokeAt: Int64?

    /// How long the machine had slept since it booted when this pass woke
    /// (`Clock.sleptNanoseconds`, read with `now`); before the first wait, the clocks'.
    public var slept: Int64 { sleptAtWake ?? Clock.sleptNanoseconds() }
    private var sleptAtWake: Int64?

    /// Calls `handler` with the `EPOLL*` events whenever `fd` is ready for `events`. The
    /// source must go away before `fd` is closed. `epoll_ctl(2)`
    public func addIO(_ fd: Int32, events: UInt32, _ handler: @escaping (UInt32) -> Void) throws(Errno) -> EventSource {
        EventSource(loop: self, token: try add(fd, events: events, handler: handler, group: nil), fd: fd, events: events)
    }

    /// What a timer counts.
    public enum TimerClock: Sendable {
        /// `CLOCK_MONOTONIC`: time the machine is awake.
        case monotonic
        /// `CLOCK_BOOTTIME`: that and the time it slept; a timer whose instant passed in a
        /// sleep fires as the machine wakes.
        case boottime
    }

    /// A one-shot timer on `clock`, initially off; arm it with `EventSource.arm(at:)`. A
    /// `timerfd` of its own, exact to the nanosecond: deadlines are never coalesced, and a
    /// timer re-armed after it became ready but before its turn does not fire early.
    /// `timerfd_create(2)`
    public func addTimer(clock: TimerClock = .monotonic, _ handler: @escaping () -> Void) throws(Errno) -> EventSource {
        let timer = FileDescriptor(try systemCall("timerfd_create") {
            timerfd_create(clock == .boottime ? CLOCK_BOOTTIME : CLOCK_MONOTONIC, Int32(TFD_NONBLOCK | TFD_CLOEXEC))
        })
        let fd = timer.rawValue
        let token = try add(fd, events: IOEvents.readable, handler: { _ in
            var expirations: UInt64 = 0
            if Glibc.read(fd, &expirations, MemoryLayout<UInt64>.size) == MemoryLayout<UInt64>.size { handler() }
        }, group: nil)
        return EventSource(loop: self, token: token, timer: timer)
    }

    /// Blocks `signal` for the process and handles it on the loop (through sd-event).
    /// `sd_event_add_signal(3)`
    public func addSignal(_ signal: Int32, _ handler: @escaping () -> Void) throws(Errno) -> EventSource {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, signal)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        let box = Unmanaged.passRetained(SignalHandler(handler))
        var raw: OpaquePointer?
        do {
            try systemdCall("sd_event_add_signal(\(signal))") {
                sd_event_add_signal(event, &raw, signal, { _, _, userdata in
                    Unmanaged<SignalHandler>.fromOpaque(userdata!).takeUnretainedValue().handler()
                    return 0
                }, box.toOpaque())
            }
        } catch {
            box.release()
            throw error
        }
        eventSourcesChanged()
        return EventSource(loop: self, signal: raw!, handler: box)
    }

    /// Sends `WATCHDOG=1` from the loop at half of `WATCHDOG_USEC`, when systemd asks for it:
    /// a stuck loop stops the pings. Returns whether the watchdog is on. `sd_event_set_watchdog(3)`
    @discardableResult
    public func enableWatchdog() -> Bool {
        eventSourcesChanged()
        return sd_event_set_watchdog(event, 1) > 0
    }

    /// sd-event's sources changed outside its dispatch (an sd-bus connection opened or a
    /// call sent from another member's handler): it is turned before the loop next blocks,
    /// so what it must wait for (a socket writable, a reply's timeout) is armed.
    func eventSourcesChanged() { eventNeedsTurn = true }

    /// Runs until `exit(code:)`; returns the code.
    public func run() throws(Errno) -> Int32 {
        exitCode = nil
        while exitCode == nil { try iterate(timeoutMilliseconds: -1) }
        return exitCode!
    }

    /// Runs one iteration, waiting at most `timeoutMilliseconds` for an event (a test's loop
    /// without `run()`).
    public func runOnce(timeoutMilliseconds: Int) throws(Errno) {
        try iterate(timeoutMilliseconds: Int32(timeoutMilliseconds))
    }

    /// Makes `run()` return `code` after this iteration.
    public func exit(code: Int32) { exitCode = code }

    /// Runs `soon` at the end of the next iteration, after the handlers of what is ready by
    /// then (this iteration's, if called from one of its handlers: then the next wait does
    /// not block).
    public func runSoon() { soonPending = true }

    /// One wait, then every handler of what it found: members on their own first, in the
    /// order the kernel listed them, then each group's ready members together.
    /// `epoll_wait(2)`
    private func iterate(timeoutMilliseconds: Int32) throws(Errno) {
        if eventNeedsTurn { try turnEvent() }
        closer.handOver()
        let count = epoll_wait(epoll.rawValue, ready, Int32(Self.maximumPerWait),
                               eventNeedsTurn || soonPending ? 0 : timeoutMilliseconds)
        guard count >= 0 else {
            if errno == EINTR { return }
            throw Errno(errno, "epoll_wait")
        }
        // `CLOCK_BOOTTIME` first, so the sleep read is never more than it is.
        let boottime = Clock.boottimeNanoseconds()
        let monotonic = Clock.monotonicNanoseconds()
        wokeAt = monotonic
        sleptAtWake = Clock.slept(boottime: boottime, monotonic: monotonic)
        for index in 0..<Int(count) {
            let token = ready[index].data.u64
            if token == Self.eventToken {
                eventNeedsTurn = true
                continue
            }
            guard isMember(token) else { continue }
            let slot = Int(token & 0xffff_ffff)
            if let group = members[slot].group {
                if group.readyMembers.isEmpty { readyGroups.append(group) }
                group.readyMembers.append((token, ready[index].events))
            } else {
                members[slot].handler?(ready[index].events)
            }
        }
        if !readyGroups.isEmpty {
            for group in readyGroups {
                group.handleReady(readClock: { wokeAt = Clock.monotonicNanoseconds() })
            }
            readyGroups.removeAllKeepingCapacity()
        }
        if soonPending {
            soonPending = false
            soon?()
        }
    }

    /// Brings sd-event to its next armed state: collects and dispatches what it has
    /// pending (one source per turn, as `sd_event_run(3)` does), then arms it again. When
    /// a dispatch happened it is turned again after the loop's next (non-blocking) wait, so
    /// a busy bus cannot starve the loop's members. `sd_event_wait(3)`
    private func turnEvent() throws(Errno) {
        eventNeedsTurn = false
        if eventArmed {
            eventArmed = false
            let found = sd_event_wait(event, 0)
            guard found >= 0 else { throw Errno(-found, "sd_event_wait") }
            if found > 0 {
                try dispatchEvent()
                return
            }
        }
        let pending = sd_event_prepare(event)
        guard pending >= 0 else { throw Errno(-pending, "sd_event_prepare") }
        if pending > 0 { try dispatchEvent() } else { eventArmed = true }
    }

    private func dispatchEvent() throws(Errno) {
        let dispatched = sd_event_dispatch(event)
        guard dispatched >= 0 else { throw Errno(-dispatched, "sd_event_dispatch") }
        eventNeedsTurn = true
    }

    // MARK: Members

    fileprivate func add(_ fd: Int32, events: UInt32, handler: @escaping (UInt32) -> Void, group: IOGroup?) throws(Errno) -> UInt64 {
        let index: Int
        if let free = freeMembers.popLast() {
            index = free
        } else {
            index = members.count
            members.append(Member())
        }
        let token = UInt64(members[index].generation) << 32 | UInt64(index)
        var event = epoll_event()
        event.events = events
        event.data.u64 = token
        let loop = epoll.rawValue
        do {
            try systemCall("epoll_ctl(ADD, \(fd))") { epoll_ctl(loop, EPOLL_CTL_ADD, fd, &event) }
        } catch {
            freeMembers.append(index)
            throw error
        }
        members[index].handler = handler
        members[index].group = group
        return token
    }

    fileprivate func modify(_ token: UInt64, fd: Int32, events: UInt32) {
        var event = epoll_event()
        event.events = events
        event.data.u64 = token
        epoll_ctl(epoll.rawValue, EPOLL_CTL_MOD, fd, &event)
    }

    /// A member leaves: its token is never handed out again (the generation moves on), so an
    /// event already collected for it is skipped.
    fileprivate func remove(_ token: UInt64, fd: Int32) {
        epoll_ctl(epoll.rawValue, EPOLL_CTL_DEL, fd, nil)
        forget(token)
    }

    /// Frees a member's slot without `EPOLL_CTL_DEL`: its file left the epoll set as its last
    /// descriptor closed (`EventSource.close`).
    fileprivate func forget(_ token: UInt64) {
        let index = Int(token & 0xffff_ffff)
        members[index] = Member(generation: members[index].generation &+ 1)
        freeMembers.append(index)
    }

    /// Whether `token` names a member still in the loop (not one removed, nor its slot's
    /// next occupant).
    private func isMember(_ token: UInt64) -> Bool {
        let index = Int(token & 0xffff_ffff)
        return index < members.count && members[index].generation == UInt32(token >> 32) && members[index].handler != nil
    }

    /// The handler of the member `token` names, if it is still in the loop. Only what is
    /// called is read: the pair with its group was a retain and release of each per event.
    fileprivate func handler(_ token: UInt64) -> ((UInt32) -> Void)? {
        isMember(token) ? members[Int(token & 0xffff_ffff)].handler : nil
    }
}

private final class SignalHandler {
    let handler: () -> Void
    init(_ handler: @escaping () -> Void) { self.handler = handler }
}

/// An event source; it leaves the loop when this object goes away.
public final class EventSource {
    private enum Kind {
        /// A member of the loop's epoll (an I/O source, a group's member).
        case member(fd: Int32)
        /// A `timerfd` in the loop's epoll.
        case timer(FileDescriptor)
        /// An sd-event source, with the handler it calls.
        case signal(OpaquePointer, Unmanaged<SignalHandler>)
    }
    private let loop: EventLoop
    private let token: UInt64
    private let kind: Kind
    /// A member's events are edge-triggered (`EPOLLET`), as last set.
    private var edgeTriggered = false
    /// Left the loop with its descriptor (`close`).
    private var closed = false

    fileprivate init(loop: EventLoop, token: UInt64, fd: Int32, events: UInt32) {
        self.loop = loop
        self.token = token
        kind = .member(fd: fd)
        edgeTriggered = events & IOEvents.edgeTriggered != 0
    }

    fileprivate init(loop: EventLoop, token: UInt64, timer: FileDescriptor) {
        self.loop = loop
        self.token = token
        kind = .timer(timer)
    }

    fileprivate init(loop: EventLoop, signal: OpaquePointer, handler: Unmanaged<SignalHandler>) {
        self.loop = loop
        token = 0
        kind = .signal(signal, handler)
    }

    /// Leaves the loop by closing `descriptor`, the one it watches, through the loop's closer
    /// (`DescriptorCloser`: at its next hand-over, a batch on a thread of its own): the kernel
    /// takes a file out of every epoll set when its last descriptor closes, so no
    /// `EPOLL_CTL_DEL` (a system call per client connection closed). Until it is closed, an
    /// event the file still reports carries this source's token, which the loop skips (its
    /// generation moved on); an edge-triggered member reports one only for something new (a
    /// peer that writes on), so the loop does not spin on it meanwhile. Only for a member
    /// edge-triggered as last set whose descriptor is its file's only one (never duplicated,
    /// inherited or sent): a file open elsewhere would stay in the set. Any other source
    /// leaves the loop as it goes away. With `now`, the descriptor is closed here, before
    /// this returns: for a caller that needs its number free at once (a listener paused for
    /// want of descriptors, a daemon stopping).
    public func close(_ descriptor: FileDescriptor, now: Bool = false) {
        guard case let .member(fd) = kind, fd == descriptor.rawValue, !closed else { return }
        precondition(edgeTriggered, "a level-triggered member closed later would keep the loop busy")
        closed = true
        if now { descriptor.close() } else { loop.closer.close(descriptor.disown()) }
        loop.forget(token)
    }

    deinit {
        guard !closed else { return }
        switch kind {
        case let .member(fd): loop.remove(token, fd: fd)
        case let .timer(timer): loop.remove(token, fd: timer.rawValue)
        case let .signal(source, handler):
            sd_event_source_disable_unref(source)
            handler.release()
        }
    }

    /// Changes the `EPOLL*` events an I/O source waits for. `epoll_ctl(2)`
    public func setIOEvents(_ events: UInt32) {
        guard case let .member(fd) = kind else { return }
        edgeTriggered = events & IOEvents.edgeTriggered != 0
        loop.modify(token, fd: fd, events: events)
    }

    /// Arms a timer to fire once at `nanoseconds` on its clock, or turns it off for `nil`.
    /// `timerfd_settime(2)`
    public func arm(at nanoseconds: Int64?) {
        guard case let .timer(timer) = kind else { return }
        var when = itimerspec()
        if let ns = nanoseconds {
            // Zero would disarm: a deadline already passed is the earliest instant there is.
            let at = max(1, ns)
            when.it_value = timespec(tv_sec: Int(at / 1_000_000_000), tv_nsec: Int(at % 1_000_000_000))
        }
        timerfd_settime(timer.rawValue, Int32(TFD_TIMER_ABSTIME), &when, nil)
    }
}

/// Many members of the loop handled together: whatever of them one wait finds ready goes to
/// one `onReady`, which calls `dispatchReady()` around whatever must happen before and after
/// their handlers — so their owner can finish the work of all of them at once (the daemon's
/// group commit). (sd-event dispatches one source per iteration and asks epoll again
/// before each: N descriptors ready at once cost O(N²); 10,000 apps exiting together kept
/// the daemon busy for seconds.)
public final class IOGroup {
    private unowned let loop: EventLoop
    fileprivate let onReady: () -> Void
    fileprivate var readyMembers: [(token: UInt64, events: UInt32)] = []

    public init(loop: EventLoop, _ onReady: @escaping () -> Void) throws(Errno) {
        self.loop = loop
        self.onReady = onReady
    }

    /// Calls `handler` with the `EPOLL*` events whenever `fd` is ready for `events`, from
    /// `dispatchReady()`. The member leaves the group when the returned source goes away,
    /// which must happen before `fd` is closed. `epoll_ctl(2)`
    public func add(_ fd: Int32, events: UInt32, _ handler: @escaping (UInt32) -> Void) throws(Errno) -> EventSource {
        EventSource(loop: loop, token: try loop.add(fd, events: events, handler: handler, group: self), fd: fd, events: events)
    }

    /// The most ready members one `onReady` handles. The loop calls `onReady` again for the
    /// rest, its clock read anew: a pass that handles a thousand members at once (apps
    /// warned together, all ending their tasks) does not hold back the timers that fall due
    /// meanwhile — each pass fires what is due first.
    public var membersPerPass = Int.max
    /// The first of `readyMembers` not handled yet.
    fileprivate var nextReady = 0

    /// Runs the handler of the next ready members the loop's wait found (at most
    /// `membersPerPass` of them, and `EventLoop.maximumPerWait` in all). A member removed by
    /// an earlier handler in the same batch is skipped.
    public func dispatchReady() {
        let end = nextReady + min(membersPerPass, readyMembers.count - nextReady)
        while nextReady < end {
            let (token, events) = readyMembers[nextReady]
            nextReady += 1
            loop.handler(token)?(events)
        }
    }

    /// Calls `onReady` until every ready member was handled, each call after the first with
    /// the clock read anew (`readClock`).
    fileprivate func handleReady(readClock: () -> Void) {
        onReady()
        while nextReady < readyMembers.count {
            let before = nextReady
            readClock()
            onReady()
            if nextReady == before { break }  // an owner that does not dispatch
        }
        readyMembers.removeAllKeepingCapacity()
        nextReady = 0
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
    /// Reported when the descriptor becomes ready, not for as long as it is (`EPOLLET`).
    public static let edgeTriggered = UInt32(EPOLLET.rawValue)
}

/// 64 random bits from the kernel. `getrandom(2)`
public func randomSeed() -> UInt64 {
    var seed = UInt64(bitPattern: Clock.realtimeNanoseconds()) ^ UInt64(getpid())
    _ = getrandom(&seed, MemoryLayout<UInt64>.size, 0)
    return seed
}
