// SPDX-License-Identifier: Apache-2.0
import BGTaskClient
import BGTaskCore
import BGTaskSession
import BGTaskSystem
import Glibc

let usage = """
    Usage: bgtask-session [--socket PATH] [--compositor auto|sway|wlr|none] [--config FILE] [--set KEY=VALUE]...

    Moves your apps to the background when they leave the screen and back when you look at
    them again, as iOS does: follows the compositor (sway/i3 IPC) and the logind session's
    screen lock, and calls bgtaskd's SetAppState for your own apps.

      --socket PATH        bgtaskd's socket (default: $BGTASKD_SOCKET, else the per-user socket
                           $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd if a daemon of yours answers there, else
                           /run/bgtaskd/io.bgtaskd)
      --compositor NAME    where windows come from: auto (default: $SWAYSOCK or $I3SOCK), sway, wlr, none
      --config FILE        settings (default: $XDG_CONFIG_HOME/bgtaskd/session.conf, if it exists)
      --set KEY=VALUE      one setting: FocusMode=visible|focused, BackgroundDelaySec=5s, Compositor=auto
      --check-config       print the settings and exit
      -h, --help           this text
      --version            the version

    Example:
      bgtask-session --set FocusMode=focused --set BackgroundDelaySec=2s

    """

func fail(_ message: String, status: Int32 = 2) -> Never {
    Host.printError("bgtask-session: \(message)")
    exit(status)
}

var socket: String?
var configPath: String?
var sets: [(String, String)] = []
var compositor: String?
var checkOnly = false
var arguments = Array(CommandLine.arguments.dropFirst())[...]
while let argument = arguments.popFirst() {
    func value(_ option: String) -> String {
        guard let next = arguments.popFirst() else { fail("\(option) needs a value\n\n\(usage)") }
        return next
    }
    switch argument {
    case "-h", "--help": print(usage, terminator: ""); exit(0)
    case "--version": print("bgtask-session 0.1.0"); exit(0)
    case "--socket": socket = value(argument)
    case "--compositor": compositor = value(argument)
    case "--config": configPath = value(argument)
    case "--check-config": checkOnly = true
    case "--set":
        let pair = value(argument)
        guard let equals = pair.firstIndex(of: "=") else { fail("--set takes KEY=VALUE, not '\(pair)'") }
        sets.append((String(pair[..<equals]), String(pair[pair.index(after: equals)...])))
    default: fail("unknown option '\(argument)'\n\n\(usage)")
    }
}

var settings = SessionSettings()
let home = Host.environment("HOME") ?? "/"
let defaultConfig = (Host.environment("XDG_CONFIG_HOME") ?? home + "/.config") + "/bgtaskd/session.conf"
let path = configPath ?? defaultConfig
if let text = try? String(contentsOfFile: path, encoding: .utf8) {
    do { settings = try SessionSettings.parse(text, source: path) } catch { fail("\(error)", status: 1) }
} else if configPath != nil {
    fail("cannot read \(path)", status: 1)
}
for (key, value) in sets {
    do { try settings.set(key, value) } catch { fail("--set \(key)=\(value): \(error.message)") }
}
if let compositor {
    guard let chosen = SessionSettings.Compositor(rawValue: compositor) else { fail("--compositor must be auto, sway, wlr or none") }
    settings.compositor = chosen
}
if checkOnly {
    print("FocusMode=\(settings.focusMode.rawValue)")
    print("BackgroundDelaySec=\(ConfigurationValue.formatTimeSpan(settings.backgroundDelay))")
    print("Compositor=\(settings.compositor.rawValue)")
    exit(0)
}

Journal.identifier = "bgtask-session"
Signal.ignoreBrokenPipe()
let swaySocket = Host.environment("SWAYSOCK") ?? Host.environment("I3SOCK")
let source: Agent.Source
switch settings.compositor {
case .auto:
    if let swaySocket { source = .sway(swaySocket) }
    else if Host.environment("WAYLAND_DISPLAY") != nil { source = .wlr }
    else {
        source = .none
        log(5, "no compositor found ($SWAYSOCK, $I3SOCK and $WAYLAND_DISPLAY unset): following the screen lock only")
    }
case .sway:
    guard let swaySocket else { fail("--compositor sway: neither $SWAYSOCK nor $I3SOCK is set", status: 1) }
    source = .sway(swaySocket)
case .wlr:
    source = .wlr
case .none:
    source = .none
}
let daemonSocket = DaemonSocket.path(explicit: socket)
do {
    let agent = try Agent(settings: settings, socketPath: daemonSocket, source: source)
    exit(try agent.run())
} catch {
    fail("\(error)", status: 1)
}
