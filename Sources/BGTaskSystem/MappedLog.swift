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
///
/// A page of the mapping costs a page fault the first time it is written (2–10 µs on these
/// machines, zeroing included): `prepare(ahead:)` takes those faults in one go, ahead of the
/// appends, at a moment the owner chooses (the daemon's: once calls have paused).
public final class MappedLog {
    private let file: FileDescriptor
    private var base: UnsafeMutableRawPointer?
    /// Bytes appended (the file's text ends here).
    public private(set) var length: Int
    /// Bytes reserved and mapped.
    private var capacity = 0
    /// Bytes from the start of the mapping whose pages are in it already: appends below
    /// this cost no page fault.
    private var populated = 0
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

    /// Bytes past the text that appends can fill without a page fault.
    public var prepared: Int { max(0, populated - length) }

    /// Makes room for `ahead` more bytes past the text, and takes the page faults of all of it
    /// now (`MADV_POPULATE_WRITE`, Linux 5.14; else by writing a zero to each page, which
    /// holds a zero already). The text is not changed. `ENOSPC`: no room for it (the log is
    /// as it was, and appends go on into whatever room there was).
    public func prepare(ahead: Int) throws(Errno) {
        if length + ahead > capacity { try reserve(ahead) }
        let page = Self.pageSize
        let start = max(populated, length / page * page)
        let end = min(capacity, (length + ahead + page - 1) / page * page)
        guard end > start, let base else { return }
        if madvise(base + start, end - start, MADV_POPULATE_WRITE) != 0 {
            for offset in stride(from: start, to: end, by: page) where offset >= length {
                (base + offset).storeBytes(of: 0, as: UInt8.self)
            }
        }
        populated = end
    }

    private static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// Makes room for `needed` more bytes past `length`, and maps all of it.
    private func reserve(_ needed: Int) throws(Errno) {
        let page = Self.pageSize
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
        populated = 0  // a new mapping: no page of it is in yet
    }
}
