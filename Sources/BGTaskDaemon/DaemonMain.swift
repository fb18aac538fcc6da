import BGTaskCore
import BGTaskSystem
import Glibc

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
        let configuration: Configuration
        do {
            configuration = try options.loadConfiguration()
        } catch {
            printError("bgtaskd: configuration error: \(error)")
            return 1
        }
        if options.checkConfig {
            print(configuration.rendered(), terminator: "")
            return 0
        }
        raiseDescriptorLimit()
        do {
            let (listener, path) = try openListener(options)
            let daemon = try Daemon(options: options, configuration: configuration, listener: listener, socketPath: path,
                                    stateDirectory: stateDirectory(socketPath: path))
            return try daemon.run()
        } catch {
            printError("bgtaskd: \(error)")
            return 1
        }
    }

    /// systemd's socket (the one named `varlink`, else the first) or one bound at the path.
    static func openListener(_ options: DaemonOptions) throws(Errno) -> (FileDescriptor, String?) {
        let passed = SocketActivation.listeningSockets()
        if options.socketPath == nil, let socket = passed.first(where: { $0.name == "varlink" }) ?? passed.first {
            return (FileDescriptor(socket.fd), nil)
        }
        let path = options.socketPath ?? DaemonOptions.systemSocketPath
        if let slash = path.lastIndex(of: "/"), slash != path.startIndex {
            try makeDirectories(String(path[..<slash]))
        }
        if access(path, F_OK) == 0 {
            if UnixSocket.isAnswering(path: path) {
                throw Errno(EADDRINUSE, "another bgtaskd is answering at \(path)")
            }
            unlink(path)  // stale: nobody accepts there
        }
        return (try UnixSocket.listen(path: path), path)
    }

    /// `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`; the first if several), else the
    /// socket's directory, so two daemons on two sockets never share state (DESIGN.md §5).
    static func stateDirectory(socketPath: String?) -> String {
        if let runtime = getenv("RUNTIME_DIRECTORY").map({ String(cString: $0) }),
           let first = runtime.split(separator: ":").first {
            return String(first)
        }
        let path = socketPath ?? DaemonOptions.systemSocketPath
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// One pidfd per app and task owner, one descriptor per connection: the default soft
    /// limit of 1024 is far below MaxApps, so take the hard limit.
    static func raiseDescriptorLimit() {
        var limit = rlimit()
        guard getrlimit(RLIMIT_NOFILE_VALUE, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(RLIMIT_NOFILE_VALUE, &limit)
    }

    static func makeDirectories(_ path: String) throws(Errno) {
        var prefix = ""
        for component in path.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, 0o755) != 0, errno != EEXIST { throw Errno.current("mkdir(\(prefix))") }
        }
    }

    static func printError(_ text: String) {
        let bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }
}

/// `RLIMIT_NOFILE`, typed as `setrlimit` wants it on glibc.
let RLIMIT_NOFILE_VALUE = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
