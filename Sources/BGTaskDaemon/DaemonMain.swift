// SPDX-License-Identifier: Apache-2.0
import BGTaskCore
import BGTaskSystem

/// `bgtaskd`'s entry point: parse → load config → bind (or take systemd's socket) → serve.
public enum DaemonMain {
    public static func run(arguments: [String]) -> Int32 {
        let options: DaemonOptions
        do {
            options = try DaemonOptions.parse(arguments)
        } catch {
            let isHelp = error.description == DaemonOptions.usage
            printError(error.description)
            return isHelp ? 0 : 2
        }
        if options.showVersion {
            print("bgtaskd \(InterfaceDescription.version)")
            return 0
        }
        let (configuration, read): (Configuration, [String])
        let policies: PolicySet
        do {
            (configuration, read) = try options.loadConfiguration()
            policies = try options.loadPolicies(over: configuration)
        } catch {
            printError("bgtaskd: configuration error: \(error)")
            return 1
        }
        if options.checkConfig {
            // Which files made it, in the order read (a comment: the output stays a valid file).
            print("# " + (read.isEmpty ? "no configuration file: the built-in defaults" : read.joined(separator: ", ")))
            print(configuration.rendered(), terminator: "")
            for policy in policies.policies {
                print("\n# \(policy.file)\n" + Daemon.describe(policy), terminator: "")
            }
            return 0
        }
        Host.raiseDescriptorLimit()
        do {
            let (listener, path) = try openListener(options)
            // An activated socket's directory, where its unit says no `RuntimeDirectory=`.
            let state = try StateDirectory(path: stateDirectory(socketPath: path ?? UnixSocket.boundPath(listener)))
            let daemon = try Daemon(options: options, configuration: configuration, policies: policies, listener: listener,
                                    socketPath: path, stateDirectory: state)
            return try daemon.run()
        } catch {
            printError("bgtaskd: \(error)")
            return 1
        }
    }

    /// systemd's socket (the one named `varlink`, else the first) or one bound at the path,
    /// in a directory nobody else can write (else a symlink or another socket could be
    /// swapped in under the daemon).
    static func openListener(_ options: DaemonOptions) throws(Errno) -> (FileDescriptor, String?) {
        let passed = SocketActivation.listeningSockets()
        if options.socketPath == nil, let socket = passed.first(where: { $0.name == "varlink" }) ?? passed.first {
            return (FileDescriptor(socket.fd), nil)
        }
        let path = options.socketPath ?? DaemonOptions.systemSocketPath
        let directory = parent(of: path)
        try FileSystem.makeDirectories(directory)
        try FileSystem.requireOwnDirectory(directory)
        for name in UnixSocket.removeStaleStagingNames(in: directory) {
            Journal.log(priority: LogEntry.Priority.notice.rawValue,
                        message: "Removed \(directory)/\(name), a socket left by a bgtaskd killed while it was starting".cEscaped)
        }
        if FileSystem.exists(path) {
            if UnixSocket.isAnswering(path: path) {
                throw Errno.addressInUse("another bgtaskd is answering at \(path)")
            }
            FileSystem.remove(path)  // stale: nobody accepts there
        }
        return (try UnixSocket.listen(path: path), path)
    }

    /// `state/` in `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`; the first if several),
    /// else in the socket's directory (an activated one's too: the path it is bound at), so
    /// two daemons on two sockets never share state (DESIGN.md §5). A directory of its own,
    /// mode 0700: the socket's directory must let everyone in, the state must not. (An
    /// activated per-user daemon's unit without `RuntimeDirectory=` tried the system
    /// daemon's `/run/bgtaskd/state`, and failed to start: "Permission denied".)
    static func stateDirectory(socketPath: String?) -> String {
        if let runtime = Host.environment("RUNTIME_DIRECTORY"), let first = runtime.split(separator: ":").first {
            return String(first) + "/state"
        }
        return parent(of: socketPath ?? DaemonOptions.systemSocketPath) + "/state"
    }

    static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    static func printError(_ text: String) { Host.printError(text) }
}
