// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the state file read back (`StateFile.apply`, every kind of record), the
// model restored from it, an hour of the machine's sleep counted, run a day on, and the
// state written again.
// Built by scripts/fuzz together with Sources/BGTaskCore, Varlink, BGTaskProtocol,
// BGTaskSystem and the daemon's state-file and wire files (one module, so no import).
//
// The file is the daemon's own, but a daemon that traps on what it reads traps at every start
// (systemd restarts it into the same file): whatever a line holds, it is read or refused,
// restored, fired and written without a crash. Beyond that: what was read, written whole
// and read again, is what was read.
import Glibc

/// One state file object for every input (nothing is written to its file): its directory
/// is made once, in the working directory (scripts/fuzz: the repository; it removes it).
private let file: StateFile = {
    let path = ".build/fuzz/state-directory-\(getpid())"
    guard let directory = try? StateDirectory(path: path) else { fatalError("cannot make \(path)") }
    return StateFile(directory: directory)
}()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzState(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var loaded = StateFile.Loaded()
    for line in UnsafeBufferPointer(start: data, count: size).split(separator: UInt8(ascii: "\n")).prefix(64) {
        guard let json = try? JSON.parse(Array(line)) else { continue }
        _ = try? StateFile.apply(json, to: &loaded)
    }
    // Written whole and read again: the same state and history.
    let text = file.wholeText(loaded.state, history: loaded.history)
    var again = StateFile.Loaded()
    for line in text.split(separator: UInt8(ascii: "\n")).dropFirst() {
        do {
            try StateFile.apply(try JSON.parse(Array(line)), to: &again)
        } catch {
            preconditionFailure("a line written does not read back (\(error)): \(String(decoding: line, as: UTF8.self))")
        }
    }
    precondition(again.state.apps == loaded.state.apps && again.state.tasks == loaded.state.tasks
                 && again.state.terminating == loaded.state.terminating && again.state.quota == loaded.state.quota
                 && again.state.requests == loaded.state.requests && again.state.sleep == loaded.state.sleep,
                 "the state read back differs from the state written")
    precondition(again.history == loaded.history, "the history read back differs from the history written")
    // Restored at an instant the input may have chosen, its timers fired over a day, written.
    var model = BackgroundModel(configuration: Configuration(), seed: 1)
    var effects: [Effect] = []
    let now = Instant(nanoseconds: size > 8 ? Int64(data[0]) << 40 : 1 << 40)
    model.restore(loaded.state, at: now, effects: &effects)
    // The machine slept an hour while no daemon ran: every request and quota instant moves.
    model.machineSlept(total: (loaded.state.sleep ?? .zero) + .seconds(3600), at: now)
    model.advance(to: now + .seconds(86_400), limit: 100_000, effects: &effects)
    _ = model.listApps(at: now)
    _ = file.wholeText(model.savedState(), history: [])
    return 0
}
