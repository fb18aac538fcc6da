// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// The service manager's notification socket (`$NOTIFY_SOCKET`); does nothing without one.
public enum ServiceNotify {
    /// Sends `state`, e.g. `READY=1\nSTATUS=...`. Returns whether a manager was told. `sd_notify(3)`
    @discardableResult
    public static func send(_ state: String) -> Bool { sd_notify(0, state) > 0 }
}

/// Sockets passed by systemd socket activation.
public enum SocketActivation {
    /// The passed descriptors with their names (`FileDescriptorName=`), in order; empty when
    /// not socket-activated. Clears `LISTEN_*` so children don't inherit them.
    /// `sd_listen_fds_with_names(3)`
    public static func listeningSockets() -> [(fd: Int32, name: String)] {
        var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        let count = sd_listen_fds_with_names(1, &names)
        guard count > 0 else { return [] }
        defer {
            for index in 0..<Int(count) { free(names?[index]) }
            free(names)
        }
        return (0..<Int(count)).map { index in
            let name = names?[index].map { String(cString: $0) } ?? "unknown"
            return (SD_LISTEN_FDS_START + Int32(index), name)
        }
    }
}
