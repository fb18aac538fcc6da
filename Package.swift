// swift-tools-version:6.0
// bgtaskd: the iOS background-execution model for Linux processes.
// Dependencies point down: the model and the Varlink library know nothing of the OS;
// only BGTaskSystem sees the C module.
import PackageDescription

// Release builds check exclusive access statically only: the dynamic checks were a tenth
// of the daemon's instructions per call (callgrind). Debug builds, which the tests and the
// sanitizers run, keep them, so a violation still fails the suite. Cross-module optimization:
// the model's small reads inline into the daemon instead of being handed a copy of the
// whole model struct each (688 bytes, several per call). Concrete types' metadata through
// accessors, not looked up by mangled name: a lookup runs the runtime's demangler the first
// time a path needs a type, and the first deadline burst's first slice made three of them
// (41 in the burst; uprobes on `swift_getTypeByMangledName`), now none (18 left, the
// standard library's own); that slice's computation 178–227 µs → 165–168 µs.
let fast: [SwiftSetting] = [.unsafeFlags(["-enforce-exclusivity=unchecked", "-cross-module-optimization",
                                          "-Xfrontend", "-disable-concrete-type-metadata-mangled-name-accessors"],
                                         .when(configuration: .release))]

let package = Package(
    name: "bgtaskd",
    products: [
        .executable(name: "bgtaskd", targets: ["bgtaskd"]),
        .executable(name: "bgtaskctl", targets: ["bgtaskctl"]),
        .library(name: "BGTaskClient", targets: ["BGTaskClient"]),
        .executable(name: "bgtask-example", targets: ["bgtask-example"]),
        .executable(name: "bgtask-session", targets: ["bgtask-session"]),
    ],
    targets: [
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // The model: apps, tasks, rules, deadlines. No I/O, no clock reads.
        .target(name: "BGTaskCore", swiftSettings: fast, linkerSettings: [.linkedLibrary("m")]),
        // Framing, messages, JSON, standard errors. Knows nothing of bgtaskd.
        .target(name: "Varlink", swiftSettings: fast, linkerSettings: [.linkedLibrary("m")]),
        // The wire protocol's names and numbers: interfaces, methods, events, error names, and
        // the rules' constants both client libraries go by. Depends on nothing but Varlink.
        .target(name: "BGTaskProtocol", dependencies: ["Varlink"], swiftSettings: fast),
        // Thin Swift over the OS: Errno, pidfds, /proc, sockets, sd-event, sd_notify.
        .target(name: "BGTaskSystem", dependencies: ["CSystemd"], swiftSettings: fast),
        // Glue: the Varlink endpoint turns calls into model events and runs the effects.
        .target(
            name: "BGTaskDaemon",
            dependencies: ["BGTaskCore", "BGTaskProtocol", "Varlink", "BGTaskSystem"],
            resources: [.embedInCode("io.bgtaskd.varlink")],
            swiftSettings: fast
        ),
        .executableTarget(name: "bgtaskd", dependencies: ["BGTaskDaemon"], swiftSettings: fast),
        // The UIKit-like client library and the blocking Varlink client the tools share.
        .target(name: "BGTaskClient", dependencies: ["BGTaskProtocol", "Varlink", "BGTaskSystem"]),
        .executableTarget(name: "bgtaskctl", dependencies: ["BGTaskClient", "BGTaskProtocol", "BGTaskCore"]),
        // The session agent's rules (windows and the lock in, decisions out) and the sway IPC
        // format: pure, tested without a compositor.
        .target(name: "BGTaskSession", dependencies: ["BGTaskCore", "Varlink"]),
        // wlr-foreign-toplevel-management over libwayland-client, with the glue wayland-scanner
        // makes at build time (scripts/wayland-glue; without it, no wlr support).
        .target(name: "CWayland", exclude: ["generated"], linkerSettings: [.linkedLibrary("wayland-client")]),
        // The session agent: follows the compositor and logind, calls SetAppState.
        .executableTarget(name: "bgtask-session", dependencies: ["BGTaskSession", "BGTaskClient", "BGTaskProtocol", "BGTaskSystem", "CWayland"]),
        // Tools (Tools/): not installed; the tests and `make bench` run them.
        // A scriptable app for end-to-end tests: line commands on stdin, JSON lines out.
        .executableTarget(name: "bgtask-probe", dependencies: ["BGTaskClient", "BGTaskProtocol"], path: "Tools/bgtask-probe"),
        // The same, through the UIKit-like library.
        .executableTarget(name: "bgtask-libprobe", dependencies: ["BGTaskClient", "BGTaskSystem"], path: "Tools/bgtask-libprobe"),
        // The example app of the README: the whole background cycle.
        .executableTarget(name: "bgtask-example", dependencies: ["BGTaskClient"]),
        // Spawning and waiting helpers shared by the system and end-to-end tests.
        .target(name: "TestSupport", dependencies: ["BGTaskSystem"], path: "Tests/TestSupport"),
        // The benchmark and its tiny C app (10,000 of them must fit in memory).
        .executableTarget(name: "bgtaskd-bench", dependencies: ["BGTaskClient", "BGTaskProtocol", "BGTaskSystem", "Varlink"],
                          path: "Tools/bgtaskd-bench"),
        // bgtask-bench-app (Tools/bgtask-bench-app) is built by `make release` with the C
        // compiler alone: as a product here it carried the Swift runtime (RELEASE_FLAGS links it
        // into every executable), 3.9 MB resident per app (README, "Performance III").
        // The peer: logind's Inhibit over sd-bus, for the same table (run in systemd-nspawn).
        .executableTarget(name: "bgtask-bench-logind", path: "Tools/bgtask-bench-logind", linkerSettings: [.linkedLibrary("systemd")]),
        .testTarget(name: "BGTaskCoreTests", dependencies: ["BGTaskCore"]),
        .testTarget(name: "VarlinkTests", dependencies: ["Varlink"]),
        .testTarget(name: "BGTaskSessionTests", dependencies: ["BGTaskSession", "BGTaskCore", "Varlink"]),
        .testTarget(name: "BGTaskClientTests", dependencies: ["BGTaskClient", "BGTaskProtocol", "BGTaskSystem", "Varlink", "TestSupport"]),
        .testTarget(name: "BGTaskSystemTests", dependencies: ["BGTaskSystem", "TestSupport"]),
        .testTarget(name: "BGTaskDaemonTests", dependencies: ["BGTaskDaemon", "BGTaskCore", "BGTaskSystem", "TestSupport"]),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["BGTaskCore", "BGTaskSystem", "BGTaskClient", "Varlink", "TestSupport"]
        ),
    ]
)
