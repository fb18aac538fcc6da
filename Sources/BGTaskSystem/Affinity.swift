// SPDX-License-Identifier: Apache-2.0
import CSystemd
import Glibc

/// Pins `pid` (0: the calling thread) to `cpus`. `sched_setaffinity(2)`
public func setCPUAffinity(pid: Int32, cpus: [Int]) throws(Errno) {
    let mask = cpus.reduce(UInt64(0)) { $0 | (1 << UInt64($1)) }
    try systemCall("sched_setaffinity(\(pid))") { bgtask_set_affinity(pid, mask) }
}

/// The CPUs this machine has online.
public var onlineCPUs: [Int] { Array(0..<Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }

extension UnixSocket {
    /// A datagram socket bound at `path` (e.g. to receive `sd_notify` messages).
    public static func bindDatagram(path: String) throws(Errno) -> FileDescriptor {
        let fd = FileDescriptor(try systemCall("socket") {
            socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        })
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count <= maximumPathLength else { throw Errno(ENAMETOOLONG, path) }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes + [0]) }
        let raw = fd.rawValue
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(raw, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if result < 0 { throw Errno.current("bind(\(path))") }
        return fd
    }
}
