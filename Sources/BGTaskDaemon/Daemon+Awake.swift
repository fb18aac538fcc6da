// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// `KeepAwake=`: while apps run in the background, logind's `idle` inhibitor (block mode) keeps
/// the machine from suspending for want of a person at it — as iOS keeps the device awake
/// for background tasks. A lid closed or a suspend asked for still suspends it (only `idle`
/// is inhibited, which any user may inhibit: bgtaskd lends nobody a lock they could not take
/// themselves). The decisions are `AwakeHold`'s; here they are carried out.
extension Daemon {
    /// In `endPass`: one comparison unless whether apps run in the background changed.
    func keepAwakeIfNeeded(at now: Instant) {
        let wanted = awakeWanted
        if wanted != awake.wanted { carryOut(awake.update(wanted: wanted, at: now)) }
    }

    /// `Wait.keepAwake`: the linger or the retry delay is over.
    func recheckAwake() {
        carryOut(awake.update(wanted: awakeWanted, at: now))
    }

    /// What `GetStatus` says of `KeepAwake=` (`keepAwake`, and `keepAwakeError` when
    /// refused): `held` (the inhibitor), `asking` (logind not answered yet), `refused`
    /// (apps run in the background; asked again a minute after the refusal), `off`
    /// (`KeepAwake=no`), `idle` (no app runs in the background).
    var keepAwakeStatus: (state: String, error: String?) {
        switch awake.holding {
        case .held: return ("held", nil)
        case .asking: return ("asking", nil)
        case .none:
            if inPlace({ $0.configuration.keepAwake == .no }) { return ("off", nil) }
            if awake.wanted, awake.refused { return ("refused", awakeRefusal) }
            return ("idle", nil)
        }
    }

    /// Whether apps run in the background, and `KeepAwake=yes`.
    private var awakeWanted: Bool {
        inPlace { $0.backgroundApps > 0 && $0.configuration.keepAwake == .yes }
    }

    private func carryOut(_ step: AwakeHold.Step) {
        switch step {
        case .nothing:
            break
        case .take:
            takeInhibitor()
        case .release:
            awakeLock?.close()
            awakeLock = nil
            log(.info, "The machine may idle-suspend again: no app runs in the background")
        case let .recheck(instant):
            model.schedule(.keepAwake, at: instant)
        }
    }

    private func takeInhibitor() {
        do {
            awakeRequest = try InhibitorRequest(
                what: "idle", who: "bgtaskd", why: "Apps run in the background (bgtaskctl apps)", mode: "block",
                loop: loop) { [unowned self] result in
                    // Done with the connection; dropped on the next pass, not in its own callback.
                    if let request = awakeRequest { retiredConnections.append(request) }
                    awakeRequest = nil
                    pass { now in inhibitorAnswered(result, at: now) }
                }
        } catch {
            inhibitorAnswered(.failure(error), at: now)
        }
    }

    private func inhibitorAnswered(_ result: Result<FileDescriptor, Errno>, at now: Instant) {
        switch result {
        case let .success(lock):
            awakeLock = lock
            awakeRefusal = nil
            log(.info, "The machine is kept from idle-suspending while apps run in the background (a logind inhibitor)")
            carryOut(awake.answered(taken: true, at: now))
        case let .failure(error):
            if awakeRefusal == nil {
                log(.notice, "The machine may idle-suspend while apps run in the background: \(error); asking again in a minute")
            }
            awakeRefusal = "\(error)"
            carryOut(awake.answered(taken: false, at: now))
        }
    }
}
