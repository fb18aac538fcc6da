// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// One client connection: its socket, what the kernel says about its peer, its input
/// framing and output buffer, and the stream it is in, if any.
///
/// Calls are answered in order, and input is read only while the connection can take
/// another call (backpressure, as sd-varlink does): not while a call streams (`more`), not
/// while a large reply is still being produced, not while replies wait unread. So a client
/// never makes the daemon buffer more than `MaxMessageBytes` plus one read of its input,
/// nor more than one reply (or slice of one) of its output, whatever it sends.
final class Connection {
    /// What a streaming call is following.
    enum Stream: Equatable {
        case subscription(ProcessIdentity)
        case task(TaskID)
        case monitor
    }

    let id: ConnectionID
    let socket: FileDescriptor
    let credentials: PeerCredentials
    /// The peer's pidfd (`SO_PEERPIDFD`), taken at accept; released at `close()`.
    private(set) var peerPidfd: Pidfd?
    var source: EventSource?
    var framer: VarlinkFramer
    var stream: Stream?
    /// A large reply being produced a slice at a time, between other connections' work.
    var listing: ListingReply?
    /// The caller as resolved at its first `io.bgtaskd.App` call.
    var caller: ProcessDescription?
    /// The caller as `SetAppState` names it (`Daemon.managerName`), once made.
    var managerName: String?
    /// The app the caller's calls are about, once known (`Daemon.connectionsByApp`).
    var app: ProcessIdentity?
    /// The caller is its own app, of `uid`, as found while the model's apps of that uid were
    /// at `generation` (`Daemon.appCaller`).
    var ownApp: (app: ProcessIdentity, uid: UInt32, generation: UInt64)?
    /// What waits to be written, in order: chunks — event bytes shared with every other
    /// subscriber they went to (encoded once, referenced by all), a listing's slices, and
    /// replies sealed in behind them (`sealOwn`) — then `own`.
    private var queue: [[UInt8]] = []
    /// The first chunk of `queue` not yet written whole (written chunks are dropped in bulk:
    /// a stream behind by thousands of shared events must not cost a shift per event).
    private var head = 0
    /// Bytes of `queue[head]` already written.
    private var written = 0
    /// `queue[head]` is chunks joined already (`joinWaiting`): not joined again, so every
    /// byte is copied at most once, however slowly the peer reads.
    private var headIsJoined = false
    /// Replies, written into the output where they lie, after everything in `queue`: most
    /// connections only ever have these, and they go out from here in one `send`, the
    /// storage kept for the next (an array per reply, copied into, queued and emptied, was
    /// ~300 instructions a call: callgrind).
    private let own = ByteBuffer(capacity: 64)
    /// Bytes of `own` already written.
    private var ownWritten = 0
    /// The most storage `own` keeps once written out (a large reply's is given back).
    static let ownKept = 64 << 10
    private(set) var pendingOutputBytes = 0
    /// What the connection's user's connections share: their count, their unread output,
    /// the loop time their calls took in the pass.
    let account: UserAccount
    /// Its input is peeked and taken from the socket only once its replies went out
    /// (`readInput`, `takeInput`): false where the kernel has no peek offset.
    let peeks: Bool
    /// Bytes peeked and not taken yet.
    private(set) var peeked = 0
    /// Peeks that found input since the last take.
    private(set) var peeksSinceTake = 0
    /// When input answered was last left in the socket (`Daemon.settleInput`), `nil` if none is.
    var leftAt: Int64?
    /// Input may wait in the socket that no edge will report (the socket is edge-triggered):
    /// the last read filled the buffer, input was reported while no call was taken, or the
    /// peer hung up after sending (reported once). `updateEvents` has the kernel look again.
    var inputMayWait = false
    private var ioEvents: UInt32 = 0
    private(set) var isClosed = false
    /// Whether the daemon has it in this pass's list of connections to flush.
    var isTouched = false
    /// Bytes of stream events the peer has not read yet; past this the connection is dropped.
    static let maximumPendingOutput = 8 << 20
    /// Calls are read and answered only while less than this waits to be written.
    static let outputLowWater = 64 << 10
    /// The most read from the socket at once.
    static let readSize = 65536

    /// `peeking: false` reads input as it comes, as on a kernel without a peek offset.
    init(id: ConnectionID, socket: FileDescriptor, credentials: PeerCredentials, peerPidfd: Pidfd?,
         maximumMessageBytes: Int, account: UserAccount, peeking: Bool = true) {
        self.id = id
        self.socket = socket
        self.credentials = credentials
        self.peerPidfd = peerPidfd
        self.account = account
        self.framer = VarlinkFramer(maximumMessageBytes: maximumMessageBytes)
        peeks = peeking && UnixSocket.enablePeekOffset(socket)
    }

    /// Reads what the peer sent into `buffer`: how many bytes, `nil` when nothing waits, 0
    /// when the peer is gone. The bytes stay in the socket, peeked, until `takeInput`: the
    /// kernel wakes whoever sleeps on an `AF_UNIX` stream when its peer takes what it sent
    /// (`unix_write_space`), whatever the sleeper waits for, so a client blocked in `read(2)`
    /// for its reply would be woken for nothing as its call is read, and again by the reply
    /// a pass later. Taken after the reply, or a few calls later (`Daemon.settleInput`), the
    /// client's wake-up is its reply's. A reader has the connection in its pass's commit
    /// (`Daemon.touch`), which settles the input.
    func readInput(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int? {
        let count = peeks ? try socket.peekAvailable(into: buffer) : try socket.readAvailable(into: buffer)
        inputMayWait = count == buffer.count
        if peeks, let count, count > 0 {
            peeked += count
            peeksSinceTake += 1
        }
        return count
    }

    /// Input answered may stay in the socket while it is this small: a few calls, in a few
    /// writes of the client (`Daemon.settleInput`). Each write is a buffer charged to the
    /// client's socket until taken (about 768 bytes for a small one); a client polling for
    /// `POLLOUT` waits while they exceed a quarter of its send buffer (53 KiB by default).
    var mayLeaveInput: Bool { peeked <= 2048 && peeksSinceTake <= 8 }

    /// Takes from the socket what `readInput` peeked, `scratch` receiving it again. Returns
    /// false if it cannot (the connection must be closed).
    func takeInput(through scratch: UnsafeMutableRawBufferPointer) -> Bool {
        guard peeked > 0 else { return true }
        do {
            try socket.consume(peeked, through: scratch)
        } catch {
            return false
        }
        peeked = 0
        peeksSinceTake = 0
        leftAt = nil
        return true
    }

    /// Its calls used up their turn: the rest wait for the next (`Daemon.turnLength`), and
    /// nothing more is read meanwhile.
    var awaitsTurn = false

    /// Whether the connection takes another call now.
    var wantsInput: Bool {
        !isClosed && !awaitsTurn && stream == nil && listing == nil && pendingOutputBytes < Self.outputLowWater
    }

    /// Queues a reply; the daemon writes it at the end of the pass, after the state file
    /// (`Daemon.commit`). Returns false if the peer is too far behind, in which case the
    /// caller must close the connection.
    func send(_ reply: VarlinkReply) -> Bool {
        send(writing: { out in
            var text: [UInt8] = []
            reply.write(to: &text)
            out.append(contentsOf: text)
        })
    }

    /// Queues a reply `write` puts into the output (without its NUL), as `send` does.
    func send(writing write: (ByteBuffer) -> Void) -> Bool {
        guard !isClosed, pendingOutputBytes <= Self.maximumPendingOutput else { return false }
        let before = own.count
        write(own)
        own.append(0)
        grow(by: own.count - before)
        return true
    }

    /// Queues bytes shared with other connections (one event to many subscribers), already
    /// framed. Returns false as `send` does.
    func send(shared frame: [UInt8]) -> Bool {
        guard !isClosed, pendingOutputBytes <= Self.maximumPendingOutput else { return false }
        enqueue(frame)
        return true
    }

    /// Queues a chunk behind everything waiting, replies in `own` included.
    private func enqueue(_ chunk: [UInt8]) {
        sealOwn()
        queue.append(chunk)
        grow(by: chunk.count)
    }

    /// Moves the replies in `own` not written yet into `queue`, as its last chunk: what is
    /// queued after them goes after them. (Counted already: no change to the pending bytes.)
    private func sealOwn() {
        guard own.count > ownWritten else { return }
        queue.append(own.bytes(from: ownWritten))
        own.removeAll(keepingCapacityUpTo: Self.ownKept)
        ownWritten = 0
    }

    private func grow(by bytes: Int) {
        pendingOutputBytes += bytes
        account.outputBytes += bytes
    }

    /// Queues the next slice of the listing being sent, if the peer has read the last one.
    func continueListing() {
        guard let listing, pendingOutputBytes < Self.outputLowWater else { return }
        let (slice, done) = listing.produce()
        if done { self.listing = nil }
        enqueue(slice)
    }

    /// Writes buffered output, the chunks waiting joined into one write (`joinWaiting`), then
    /// the replies in `own` — those sealed in behind the chunks when there are any, so that
    /// they go out in the same write.
    func flush() -> Bool {
        if head < queue.count { sealOwn() }
        joinWaiting()
        while head < queue.count {
            do {
                guard let count = try socket.writeAvailable(queue[head][written...]) else { break }
                written += count
                grow(by: -count)
            } catch {
                return false
            }
            guard written == queue[head].count else { continue }
            head += 1
            written = 0
            headIsJoined = false
            if head == queue.count {
                queue.removeAllKeepingCapacity()
                head = 0
            }
        }
        if head > 64, head * 2 > queue.count {
            queue.removeFirst(head)
            head = 0
        }
        guard head == queue.count else { return true }
        while ownWritten < own.count {
            let count: Int?
            do {
                count = try own.withBytes { bytes throws(Errno) in
                    try socket.writeAvailable(UnsafeRawBufferPointer(rebasing: bytes[ownWritten...]))
                }
            } catch {
                return false
            }
            guard let count else { break }
            ownWritten += count
            grow(by: -count)
        }
        if ownWritten == own.count, ownWritten > 0 {
            own.removeAll(keepingCapacityUpTo: Self.ownKept)
            ownWritten = 0
        }
        return true
    }

    /// The most bytes of waiting chunks copied together for one write.
    static let joinLimit = 64 << 10

    /// Joins the chunks waiting (up to `joinLimit` bytes) into one: a monitor or subscriber
    /// sent 32 events in a pass, each a chunk shared with other connections, gets one
    /// `send` rather than 32 (a copy of a few kilobytes costs less than one system call).
    /// A large chunk (a listing's slice) is written as it is; a joined chunk is not joined
    /// again while it waits (a peer that never reads would otherwise have it copied at
    /// every event queued behind it).
    private func joinWaiting() {
        guard !headIsJoined, queue.count - head > 1 else { return }
        var end = head + 1, total = queue[head].count - written
        while end < queue.count, total + queue[end].count <= Self.joinLimit {
            total += queue[end].count
            end += 1
        }
        guard end - head > 1 else { return }
        var joined: [UInt8] = []
        joined.reserveCapacity(total)
        joined.append(contentsOf: queue[head][written...])
        for index in head + 1..<end { joined.append(contentsOf: queue[index]) }
        // A copy of its own: replies may be appended to it when it is the last.
        queue.replaceSubrange(head..<end, with: CollectionOfOne(joined))
        written = 0
        headIsJoined = true
    }

    /// Waits for what the connection can do next: input while it takes calls, output while
    /// some waits or a listing goes on, and always the peer hanging up or sending
    /// out-of-band data (`MSG_OOB`, which Varlink has no use for: `Daemon.handleIO`).
    /// Edge-triggered: input peeked and left in the socket (`Daemon.settleInput`) must not
    /// report the socket ready at every wait; new input does.
    func updateEvents() {
        guard !isClosed else { return }
        var events = IOEvents.edgeTriggered | IOEvents.peerHangup | IOEvents.priority
        if wantsInput { events |= IOEvents.readable }
        if pendingOutputBytes > 0 || listing != nil { events |= IOEvents.writable }
        // Set again, the kernel looks at the socket at once: input waiting is reported. (Room
        // to write needs no such look: each buffer the peer reads reports it while there is
        // room, `unix_write_space`, so a listing goes on as its client reads.)
        if events != ioEvents || inputMayWait {
            ioEvents = events
            inputMayWait = false
            source?.setIOEvents(events)
        }
    }

    /// The peer is resolved and its process watched through a pidfd of the daemon's own:
    /// this one need not be held too (a client that streams keeps one descriptor, not two).
    func releasePeerPidfd() { peerPidfd = nil }

    /// Closes the connection: its socket through the loop's closer (`EventSource.close`), or
    /// with `now` here and at once.
    func close(now: Bool = false) {
        isClosed = true
        listing = nil
        grow(by: -pendingOutputBytes)
        queue = []
        head = 0
        headIsJoined = false
        own.removeAll()
        ownWritten = 0
        source?.close(socket, now: now)  // the connection's socket is its file's only descriptor
        source = nil
        socket.close()
        // Released now, not when the last reference to this object goes (the pass's list
        // of connections to flush may hold it a little longer).
        peerPidfd = nil
    }
}

/// What one user's connections share, whatever their number: how many there are
/// (`MaxConnectionsPerUser`), what they have waiting to be written in all (bounded per user,
/// not only per connection: `Daemon.maximumOutputBytesPerUser`), and the loop time their
/// calls took in the current pass (a turn is the user's, not each connection's:
/// `Daemon.processInput`).
final class UserAccount {
    var connections = 0
    /// Its `Monitor` streams (`Daemon.maximumMonitorsPerUser`).
    var monitors = 0
    var outputBytes = 0
    private var loopTime: Int64 = 0
    private var loopTimePass: UInt64 = 0

    /// Nanoseconds of loop time its calls took in pass `pass`.
    func loopTime(in pass: UInt64) -> Int64 { loopTimePass == pass ? loopTime : 0 }

    func charge(_ nanoseconds: Int64, in pass: UInt64) {
        if loopTimePass != pass {
            loopTimePass = pass
            loopTime = 0
        }
        loopTime += nanoseconds
    }
}

/// A reply too large to build in one go (`ListTasks` of 100,000 tasks is 14 MB of JSON):
/// its items are taken at the call and encoded a slice at a time, each slice once the peer
/// has read the previous one, so no call holds the loop and an unread reply costs one slice.
final class ListingReply {
    /// Items encoded per slice: about a millisecond of work.
    static let sliceSize = 256
    private var prefix: [UInt8]?
    private let count: Int
    private var next = 0
    private let write: (Int, ByteBuffer) -> Void

    /// `{"parameters":{"<key>":[items...]}}`, item `i` written by `write(i, output)`.
    init(key: String, count: Int, write: @escaping (Int, ByteBuffer) -> Void) {
        var prefix = Array("{\"parameters\":{".utf8)
        JSON.string(key).write(to: &prefix)
        prefix += Array(":[".utf8)
        self.prefix = prefix
        self.count = count
        self.write = write
    }

    /// The same, item `i` being `encode(i)`.
    convenience init(key: String, count: Int, encode: @escaping (Int) -> JSON) {
        self.init(key: key, count: count) { index, output in output.appendJSON(encode(index)) }
    }

    /// The next slice, and whether the reply is complete with it (NUL included).
    func produce() -> (slice: [UInt8], done: Bool) {
        // Written in a buffer of its own, given back once copied out: a listing waiting for a
        // slow reader holds only the chunk queued.
        let output = ByteBuffer(capacity: 4096)
        if let prefix {
            output.append(contentsOf: prefix)
            self.prefix = nil
        }
        let end = min(count, next + Self.sliceSize)
        while next < end {
            if next > 0 { output.append(UInt8(ascii: ",")) }
            write(next, output)
            next += 1
        }
        if next == count {
            output.append("]}}")
            output.append(0)
        }
        return (output.bytes(from: 0), next == count)
    }
}
