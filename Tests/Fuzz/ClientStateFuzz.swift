// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the Swift client's rules (ClientState, DaemonEvent) against whatever a
// daemon, or an impostor on its socket, sends: the same input and the same app as
// libbgtask_fuzz.c (three tasks whose handlers end them), the messages split at NUL bytes,
// one millisecond apart. Built by scripts/fuzz with Sources/Varlink, Sources/BGTaskProtocol
// and the client's rules in one module (their imports of each other dropped).
//
// Beyond "no crash" (a time from the daemon once trapped in Int64(x * 1e9)): each handler
// runs at most once; the time left is unlimited or within [0, a day]; the next deadline is
// never more than a day and a reconnection away; the calls the rules make are bounded.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzClientState(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var state = ClientState<Int>()
    var handled = [0, 0, 0, 0]
    var now: Int64 = 0
    _ = state.receive(.subscribed(state: "foreground", remaining: nil, held: []), at: now)
    for id in 1...3 { _ = state.begun(id, name: "", handler: id) }

    func perform(_ effects: [ClientState<Int>.Effect]) {
        precondition(effects.count <= 3 * 2 + ClientRules.maximumPendingEnds + 4, "\(effects.count) effects at once")
        for effect in effects {
            switch effect {
            case let .runHandler(id, _):
                handled[id] += 1
                precondition(handled[id] == 1, "handler of task \(id) ran twice")
                if state.end(id) == .send { state.endUndelivered(id) }  // not connected: queued
            case .enterBackground: state.backgroundDelegateReturned()
            case .enterForeground: state.foregroundDelegateReturned()
            case .wake: perform(state.wakeCompleted(at: now))
            case .send, .reconnect: break
            case let .launch(_, _, taskID):  // as the scheduler does, with a handler of its own
                perform(state.begun(taskID, name: "", handler: nil))
            }
        }
    }

    let bytes = UnsafeBufferPointer(start: data, count: size)
    var start = 0
    for index in 0...size where index == size || bytes[index] == 0 {
        now = Int64(index) * 1_000_000
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        start = index + 1
        guard let message = try? JSON.parse(text) else {
            _ = state.lost(at: now)  // a broken stream: start again
            perform(state.tick(at: now))
            continue
        }
        if message["error"] != nil {
            _ = state.lost(at: now)
        } else if let parameters = message["parameters"]?.objectValue, let event = DaemonEvent(parameters) {
            perform(state.receive(event, at: now))
        }
        perform(state.tick(at: now))
        let left = state.backgroundTimeRemaining(at: now)
        precondition(left == .greatestFiniteMagnitude || (left >= 0 && left <= ClientRules.maximumSeconds), "\(left) s left")
        if let next = state.nextDeadline {
            precondition(next <= now + Int64(ClientRules.maximumSeconds) * 1_000_000_000 + ClientRules.restartGrace,
                         "deadline \(next) at \(now)")
        }
    }
    // Whatever came, the library ends its day: every deadline passes without a crash.
    perform(state.tick(at: now + Int64(ClientRules.maximumSeconds) * 2_000_000_000))
    return 0
}
