// SPDX-License-Identifier: Apache-2.0
import Glibc

/// A file appended to through a shared memory mapping: an append is a copy into the page
/// cache, with no system call, and what was copied survives the process being killed at
/// any instant after (not a power cut: for a file under /run, a tmpfs, there is nothing
/// beyond the page cache anyway).
///
/// Room is reserved ahead with `posix_fallocate`, so a full file system is an error from
/// `append`, never a `SIGBUS` on a store into a page the file system could not provide. The
/// file is longer than what was appended: the rest is zeros, and a reader stops at the
/// first NUL (`StateDirectory.readLines`).
public final class MappedLog {
    private let file: FileDescriptor
    private var base: UnsafeMutableRawPointer?
    /// Bytes appended (the file's text ends here).
    public private(set) var length: Int
    /// Bytes reserved and mapped.
    private var capacity = 0
    /// The least reserved at once; growth is by a quarter of the log, up to `maximumGrowth`.
    static let minimumGrowth = 64 << 10
    static let maximumGrowth = 8 << 20

    /// Takes `file` (open for reading and writing), whose first `length` bytes are the log.
    public init(file: FileDescriptor, length: Int) throws(Errno) {
        self.file = file
        self.length = length
        try reserve(0)
    }

    deinit {
        if let base { munmap(base, capacity) }
    }

    /// Appends `bytes` whole, or nothing (no room: `ENOSPC`, and the log is as it was).
    public func append(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        guard !bytes.isEmpty else { return }
        if length + bytes.count > capacity { try reserve(bytes.count) }
        (base! + length).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        length += bytes.count
    }

    /// Makes room for `needed` more bytes past `length`, and maps all of it.
    private func reserve(_ needed: Int) throws(Errno) {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let growth = min(Self.maximumGrowth, max(Self.minimumGrowth, length / 4))
        let wanted = (length + needed + growth + page - 1) / page * page
        guard wanted > capacity else { return }
        let result = posix_fallocate(file.rawValue, 0, off_t(wanted))
        guard result == 0 else { throw Errno(result, "posix_fallocate(\(wanted) bytes)") }
        guard let mapped = mmap(nil, wanted, PROT_READ | PROT_WRITE, MAP_SHARED, file.rawValue, 0),
              mapped != MAP_FAILED else { throw Errno.current("mmap(\(wanted) bytes)") }
        if let base { munmap(base, capacity) }
        base = mapped
        capacity = wanted
    }
}
