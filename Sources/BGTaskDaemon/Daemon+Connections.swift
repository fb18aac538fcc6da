// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem
import Varlink

/// Clients: accepting them, reading their calls in order, answering, closing.
extension Daemon {
    /// Accepts what waits on the listener, at most `acceptsPerPass`: the listener polls
    /// readable while more wait, and they are taken at the next pass, after the clients and
    /// timers ready with it. (Unbounded, a user connecting and closing in a loop from four
    /// processes held the daemon here for as long as it went on: root's `GetStatus` waited
    /// 5.7 s of a 6 s flood, measured, and no deadline fired meanwhile.)
    func acceptConnections() {
        for _ in 0..<Self.acceptsPerPass {
            let socket: FileDescriptor
            do {
                guard let accepted = try UnixSocket.accept(listener) else { return }
                socket = accepted
            } catch where error.isShortage {
                guard refuseWaitingConnection() else { return }
                continue
            } catch {
                pauseAccepting("accept failed: \(error)")
                return
            }
            guard let credentials = try? UnixSocket.peerCredentials(socket) else { continue }
            let account = accounts[credentials.uid] ?? UserAccount()
            guard account.connections < model.configuration.maxConnectionsPerUser else {
                refuse(socket, .limitExceeded("MaxConnectionsPerUser=\(model.configuration.maxConnectionsPerUser) reached"))
                continue
            }
            // Its peer's pidfd is as much a part of a connection as its socket: without it
            // (`EMFILE` once the socket took the last descriptor) the caller would be named by
            // its pid alone, later. Refused instead, like a connection that could not be accepted.
            let pidfd: Pidfd?
            do {
                pidfd = try UnixSocket.peerPidfd(socket).flatMap { (fd) throws(Errno) in try Pidfd.adopt(fd) }
            } catch where error.isShortage {
                refuseForShortage(socket)
                continue
            } catch {
                pidfd = nil  // the peer is gone: its calls, if any, find it so
            }
            if shortage.ongoing { shortageEnded() }
            let id = ConnectionID(nextConnectionID)
            nextConnectionID += 1
            let connection = Connection(id: id, socket: socket, credentials: credentials, peerPidfd: pidfd,
                                        maximumMessageBytes: model.configuration.maxMessageBytes, account: account)
            do {
                connection.source = try clients.add(socket.rawValue, events: IOEvents.edgeTriggered | IOEvents.readable) {
                    [unowned self, unowned connection] events in self.handleIO(connection, events: events)
                }
            } catch {
                log(.warning, "cannot watch a new connection: \(error)")
                continue
            }
            connections[id] = connection
            account.connections += 1
            accounts[credentials.uid] = account
            connection.updateEvents()
        }
    }

    /// The daemon is out of descriptors and cannot accept the connection waiting, so its
    /// listener would poll readable for ever (a busy loop, a log line per turn: 700,000 a
    /// second, measured). The reserve's descriptors are given back for one accept: the
    /// connection is told why and closed. Returns whether one was refused (more may wait);
    /// `false` with none waiting, or when even that failed (no reserve, or out of memory:
    /// the listener is left unwatched until a connection closes, 100 ms at most).
    func refuseWaitingConnection() -> Bool {
        var failure: Errno?
        let refused: Bool = reserve.withReleased {
            do throws(Errno) {
                guard let socket = try UnixSocket.accept(listener) else { return false }
                refuseForShortage(socket)
                return true
            } catch {
                failure = error
                return false
            }
        }
        if let failure { pauseAccepting("accept failed even with the reserve's descriptors (\(failure))") }
        return refused
    }

    /// Leaves the listener unwatched for `acceptPause` (or until a connection closes): an
    /// accept that keeps failing would otherwise be tried again at once, for ever, the
    /// listener still readable. Logged at most once a minute.
    func pauseAccepting(_ why: String) {
        guard acceptPausedUntil == nil else { return }
        acceptPausedUntil = loop.now + Self.acceptPause
        listenerSource.setIOEvents(0)
        guard loop.now - acceptPauseReportedAt >= Self.shortageReportSpacing else { return }
        acceptPauseReportedAt = loop.now
        log(.warning, "\(why): new connections wait in the listen queue, \(Self.acceptPause / 1_000_000)ms at most each time")
    }

    /// Answers a connection accepted while out of descriptors with `LimitExceeded` and
    /// closes it.
    /// Unit apps' held `cgroup.freeze` files are let go first (`Enforcer.yieldHeldFreezes`).
    func refuseForShortage(_ socket: FileDescriptor) {
        enforcer.yieldHeldFreezes()
        refuse(socket, .limitExceeded("the daemon's open files (LimitNOFILE=\(Host.descriptorLimit)); try again later"))
        shortage.refused += 1
        shortageBegan("new connections are refused with LimitExceeded until some are free; raise the limit, or lower MaxConnectionsPerUser=")
    }

    /// Answers a connection not taken with `error`, and closes it.
    func refuse(_ socket: FileDescriptor, _ error: BGTaskError) {
        _ = try? socket.write(VarlinkReply(error: error.varlink).json.varlinkFrame)
        socket.close()
    }

    /// A run of refusals begins (nothing if one is going on): logged, at most once a minute
    /// (a user able to fill the daemon's descriptors could otherwise make a line per
    /// connection it lets go and takes again).
    func shortageBegan(_ what: String) {
        guard !shortage.ongoing else { return }
        shortage.ongoing = true
        guard loop.now - shortage.reportedAt >= Self.shortageReportSpacing else { return }
        shortage.reportedAt = loop.now
        shortage.reported = true
        log(.warning, "Out of descriptors (LimitNOFILE=\(Host.descriptorLimit)): \(what)")
    }

    /// A connection was accepted again. If the run's beginning was logged, so is its end,
    /// with the connections refused since the last such line (in runs unlogged too).
    func shortageEnded() {
        shortage.ongoing = false
        guard shortage.reported else { return }
        shortage.reported = false
        log(.notice, "Accepting connections again: \(shortage.refused) refused for want of descriptors since the last report")
        shortage.refused = 0
    }

    /// Watches the listener again after `refuseWaitingConnection` left it: a connection
    /// closed, or (`force` false) the pause is over.
    func resumeAccepting(force: Bool = true) {
        guard let until = acceptPausedUntil, force || loop.now >= until else { return }
        acceptPausedUntil = nil
        listenerSource.setIOEvents(IOEvents.readable)
    }

    func handleIO(_ connection: Connection, events: UInt32, wholly: Bool = false) {
        touch(connection)
        if events & IOEvents.priority != 0 {
            // An out-of-band byte waits in the socket (`MSG_OOB`): peeks pass over it and
            // leave it there, so the socket would poll readable for ever with nothing to read.
            log(.notice, "Closing \(connection.id) (uid \(connection.credentials.uid)): out-of-band data")
            return close(connection)
        }
        if events & IOEvents.writable != 0 {
            // What waits was queued in an earlier pass, and an event of this pass may be behind
            // it: as at the pass's end (`commit`), its suspensions are made whole and its
            // changes written first (each a no-op when there are none).
            finishStops()
            writeState()
            guard connection.flush() else { return close(connection) }
            connection.continueListing()
        }
        let gone = IOEvents.hangup | IOEvents.error | IOEvents.peerHangup
        if connection.wantsInput, events & (IOEvents.readable | gone) != 0 {
            do {
                if let count = try connection.readInput(into: readBuffer) {
                    if count == 0 { return close(connection) }
                    connection.framer.append(UnsafeRawBufferPointer(rebasing: readBuffer[..<count]))
                    // The hang-up is reported once; its end of input comes after this.
                    if events & gone != 0 { connection.inputMayWait = true }
                }
            } catch {
                return close(connection)
            }
        } else if events & gone != 0, !connection.awaitsTurn {
            // Not reading (a stream, a listing, unread replies), and the peer is gone.
            return close(connection)
        } else if events & (IOEvents.readable | gone) != 0 {
            // Looked for again when it takes calls (a hang-up after calls awaiting their turn
            // included: they are answered first).
            connection.inputMayWait = true
        }
        processInput(connection, wholly: wholly)
    }

    /// Handles complete calls in order while the connection takes them, until the loop has
    /// run `turnLength` in this pass, or its user's calls have taken `turnLength` of it (after
    /// one call of the user's at least): then the rest wait for the connection's next turn
    /// (`giveTurns`), and other connections and timers go first. The turn is the user's,
    /// whatever its number of connections: one call each per pass from 64 connections of
    /// uid 65534, each flipping its unit app above 5,000 cgroups (a kernel freeze or thaw of
    /// them, ~1–5 ms), held root's `GetStatus` 98 ms at p50 (139 ms at worst), measured; 256
    /// connections are allowed. With `wholly`, no turn ends it (an app facing termination:
    /// what it sent counts, rule 7a). Returns whether it handled any.
    @discardableResult
    func processInput(_ connection: Connection, wholly: Bool = false) -> Bool {
        let account = connection.account
        if !wholly, connection.wantsInput, connection.framer.bufferedByteCount > 0,
           account.loopTime(in: passNumber) >= Self.turnLength {
            awaitTurn(connection)
            return false
        }
        var handled = false
        var started: Int64 = 0
        defer { if handled { account.charge(Clock.monotonicNanoseconds() - started, in: passNumber) } }
        while connection.wantsInput {
            let message: ArraySlice<UInt8>
            do {
                guard let next = try connection.framer.next() else { return handled }
                message = next
            } catch {
                log(.notice, "Closing \(connection.id) (uid \(connection.credentials.uid)): message over MaxMessageBytes=\(error.limit)")
                close(connection)
                return handled
            }
            let request: Request
            do {
                request = try Self.decode(message)
            } catch {
                // Not a Varlink call: the stream cannot be trusted past this point.
                log(.notice, "Closing \(connection.id) (uid \(connection.credentials.uid)): \(error)")
                close(connection)
                return handled
            }
            if !handled { started = Clock.monotonicNanoseconds() }
            handle(request, on: connection, at: now)
            handled = true
            // Only a connection with more input pays for a second clock read.
            if !wholly, connection.framer.bufferedByteCount > 0 {
                let clock = Clock.monotonicNanoseconds()
                if clock - loop.now >= Self.turnLength || account.loopTime(in: passNumber) + clock - started >= Self.turnLength {
                    awaitTurn(connection)
                    return handled
                }
            }
        }
        return handled
    }

    /// The connection's calls wait for its next turn (`giveTurns`, at the end of the loop's
    /// next iteration).
    private func awaitTurn(_ connection: Connection) {
        connection.awaitsTurn = true
        awaitingTurn.append(connection)
        loop.runSoon()
    }

    /// The next turn of every connection that used up its last (`processInput`), in order;
    /// those of a user whose calls take up its turn in this pass before theirs come stay first
    /// in line for the next, untouched (one user's 256 connections are not 256 turns).
    func giveTurns() {
        guard !awaitingTurn.isEmpty else { return }
        let waiting = awaitingTurn
        awaitingTurn = []
        var passedOver: [Connection] = []
        for connection in waiting where !connection.isClosed && connection.awaitsTurn {
            if connection.account.loopTime(in: passNumber) >= Self.turnLength {
                passedOver.append(connection)
                continue
            }
            connection.awaitsTurn = false
            touch(connection)  // its events are set again at the commit: input waiting is looked for
            connection.inputMayWait = true
            processInput(connection)
        }
        if !passedOver.isEmpty {
            awaitingTurn = passedOver + awaitingTurn
            loop.runSoon()
        }
    }

    /// A message as a call: a hot method's straight from its bytes when it can be
    /// (`FlatCall`, `HotCall`), else through `JSON` (which says what is wrong with it).
    static func decode(_ message: ArraySlice<UInt8>) throws -> Request {
        let hot = message.withUnsafeBufferPointer { HotCall(flat: $0) }
        if let hot { return .hot(hot) }
        return .general(try VarlinkCall(message: JSON.parse(message)))
    }

    func handle(_ request: Request, on connection: Connection, at now: Instant) {
        let answer: Answer = carryingOut { effects in
            do throws(VarlinkError) {
                return try dispatch(request, on: connection, at: now, effects: &effects)
            } catch {
                return .reply(VarlinkReply(error: error))
            }
        }
        callPidfds.removeAll(keepingCapacity: true)
        if connection.peerPidfd != nil, let caller = connection.caller, watches[caller.identity] != nil {
            connection.releasePeerPidfd()
        }
        switch answer {
        case let .reply(reply):
            if !request.oneway || reply.continues { send(reply, to: connection) }
        case let .hot(reply):
            if !request.oneway || reply.continues { send(reply, to: connection) }
        case let .listing(listing):
            guard !request.oneway else { return }
            connection.listing = listing
            connection.continueListing()
            touch(connection)
        }
    }

    /// Reads and handles what `apps` have already sent — on their connections, and their
    /// task owners' exits — before their deadlines are fired: under load the daemon may be
    /// late to read a task end that reached it in time.
    func readWaiting(from apps: [ProcessIdentity]) {
        for app in apps {
            for id in connectionsByApp[app] ?? [] {
                guard let connection = connections[id] else { continue }
                if connection.awaitsTurn {
                    // Its turn now, whole (left in `awaitingTurn`, passed over there): what is
                    // read first, then what waits in the socket.
                    connection.awaitsTurn = false
                    processInput(connection, wholly: true)
                }
                handleIO(connection, events: IOEvents.readable, wholly: true)
            }
            for owner in model.taskOwners(of: app) where watches[owner]?.pidfd.hasExited == true {
                processExited(owner)
            }
        }
    }

    func forgetConnection(_ id: ConnectionID, of app: ProcessIdentity) {
        connectionsByApp[app]?.removeAll { $0 == id }
        if connectionsByApp[app]?.isEmpty == true { connectionsByApp[app] = nil }
    }

    func close(_ connection: Connection) {
        guard !connection.isClosed else { return }
        // What was read is taken, as a read takes it: a socket closed with input unread
        // resets its peer (ECONNRESET) instead of ending its stream.
        _ = connection.takeInput(through: readBuffer)
        // A listener paused for want of descriptors is given this one at once.
        connection.close(now: acceptPausedUntil != nil)
        resumeAccepting()
        connections[connection.id] = nil
        if let app = connection.app { forgetConnection(connection.id, of: app) }
        connection.account.connections -= 1
        if connection.account.connections == 0 { accounts[connection.credentials.uid] = nil }
        var effects: [Effect] = []
        switch connection.stream {
        case let .subscription(app)?:
            subscribers[app]?.removeAll { $0 == connection.id }
            if subscribers[app]?.isEmpty == true { subscribers[app] = nil }
            model.unsubscribe(app, at: now, effects: &effects)
        case let .task(id)?:
            taskStreams[id] = nil
        case .monitor?:
            monitors.remove(connection.id, uid: connection.credentials.uid)
            connection.account.monitors -= 1
        case nil:
            break
        }
        model.connectionClosed(connection.id, at: now, effects: &effects)
        carryOut(effects)
    }

    /// Ends a connection's stream and lets its queued calls through.
    func endStream(of connection: Connection) {
        connection.stream = nil
        processInput(connection)
        touch(connection)
    }

    /// Queues a reply or event; it goes out when the pass commits.
    func send(_ reply: VarlinkReply, to connection: Connection) {
        if connection.send(reply), withinUserBound(connection) { touch(connection) } else { drop(connection) }
    }

    /// A hot reply is written through a pointer into the connection's output (`ByteBuffer`).
    func send(_ reply: HotReply, to connection: Connection) {
        if connection.send(writing: { reply.write(to: $0) }), withinUserBound(connection) { touch(connection) } else { drop(connection) }
    }

    /// Queues an event encoded once for many connections.
    func send(shared frame: [UInt8], to connection: Connection) {
        if connection.send(shared: frame), withinUserBound(connection) { touch(connection) } else { drop(connection) }
    }

    /// What all of one user's connections may have waiting, unread: past it, a connection of
    /// that user that is itself behind (a stream nobody reads) is dropped. Root is not bound.
    static let maximumOutputBytesPerUser = 32 << 20

    func withinUserBound(_ connection: Connection) -> Bool {
        connection.credentials.uid == 0 || connection.account.outputBytes <= Self.maximumOutputBytesPerUser
            || connection.pendingOutputBytes < Connection.outputLowWater
    }

    /// Notes a connection whose output or wanted events may have changed in this pass.
    func touch(_ connection: Connection) {
        guard !connection.isTouched, !connection.isClosed else { return }
        connection.isTouched = true
        touched.append(connection)
    }

    /// Group commit, at the end of every pass: what the pass changed goes to the state file,
    /// then the replies and events it queued go out — monitors' last: an app, its helpers and
    /// its managers are sent what happened (a warning on its task's stream) before anyone
    /// watching hears of it, so a monitor's event is never ahead of what it reports (16
    /// warnings fired together had the monitor told of all 16 when one app was). No reply
    /// leaves before the change it reports is on disk. Returns the connections that can take
    /// more of the calls they already sent (their replies had filled the output buffer).
    func commit() -> [Connection] {
        var resumable: [Connection] = []
        // Suspensions are whole before anything reporting them goes out, and the sockets of
        // connections closed are closed (or, many, handed to the loop's closer thread).
        finishStops()
        loop.handOverClosed()
        while !touched.isEmpty {  // closing a connection can queue events for others
            writeState()
            // Two arrays taking turns: a copy, then emptying `touched`, allocated anew each pass.
            swap(&touched, &committing)
            defer { committing.removeAllKeepingCapacity() }
            var monitorsTouched = false
            for connection in committing {
                if case .monitor? = connection.stream {
                    monitorsTouched = true
                } else {
                    commit(connection, resumable: &resumable)
                }
            }
            guard monitorsTouched else { continue }
            for connection in committing {
                if case .monitor? = connection.stream { commit(connection, resumable: &resumable) }
            }
        }
        return resumable
    }

    /// Sends what a connection has queued (`commit`).
    private func commit(_ connection: Connection, resumable: inout [Connection]) {
        connection.isTouched = false
        guard !connection.isClosed else { return }
        // The replies first, then the calls they answer taken from the socket, or left
        // there a while (`settleInput`): a client asleep for its reply is woken by it.
        guard connection.flush(), settleInput(connection) else {
            close(connection)
            return
        }
        connection.updateEvents()
        if connection.wantsInput, connection.framer.bufferedByteCount > 0 { resumable.append(connection) }
    }

    /// After a connection's replies went out: takes the calls they answered from the socket,
    /// or leaves them there until a few more were answered (`Connection.mayLeaveInput`), or
    /// until the connection was idle for `takeDelay`. A take wakes a client asleep in
    /// `read(2)` for nothing (`Connection.readInput`); right after the reply, a client on the
    /// daemon's CPU is asleep again by then, its next call sent: taking every ninth call's
    /// bytes with it spares it eight of those wake-ups. Returns false if the connection must
    /// be closed.
    func settleInput(_ connection: Connection) -> Bool {
        guard connection.peeked > 0 else { return true }
        guard connection.mayLeaveInput else { return connection.takeInput(through: readBuffer) }
        let now = loop.now
        if connection.leftAt != now {
            connection.leftAt = now
            inputLeft.append((connection, now))
            armTimer(at: now + Self.takeDelay)  // after this pass's `endPass`
        }
        return true
    }

    /// Takes the input of connections idle since `instant` or before (`settleInput`); returns
    /// when the next is due.
    func takeInputLeft(before instant: Int64) -> Int64? {
        var next: Int64?
        while inputLeftHead < inputLeft.count {
            let (connection, at) = inputLeft[inputLeftHead]
            if !connection.isClosed, connection.leftAt == at {  // else taken, or left again later
                guard at <= instant else {
                    next = at + Self.takeDelay
                    break
                }
                if !connection.takeInput(through: readBuffer) { close(connection) }
            }
            inputLeftHead += 1
        }
        if inputLeftHead == inputLeft.count || inputLeftHead > 64 && inputLeftHead * 2 > inputLeft.count {
            inputLeft.removeFirst(inputLeftHead)
            inputLeftHead = 0
        }
        return next
    }

    /// Closes a connection whose peer is gone or stopped reading, saying which.
    func drop(_ connection: Connection) {
        if connection.pendingOutputBytes > Connection.maximumPendingOutput {
            log(.notice, "Dropping \(connection.id) (uid \(connection.credentials.uid)): over \(Connection.maximumPendingOutput >> 20) MiB of unread replies")
        } else if !withinUserBound(connection) {
            log(.notice, "Dropping \(connection.id) (uid \(connection.credentials.uid)): its user has over \(Self.maximumOutputBytesPerUser >> 20) MiB of unread replies in all")
        }
        close(connection)
    }
}

/// What a call is answered with: a reply (a hot method's written directly), or a listing
/// sent in slices.
enum Answer {
    case reply(VarlinkReply)
    case hot(HotReply)
    case listing(ListingReply)
}
