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
/// The file is mapped in a window of address space larger than it (`window`): growing the
/// file is one `posix_fallocate` of what is added, with no new mapping, so the pages already
/// in the mapping stay in (a new mapping would take their faults again). Nothing is stored
/// past the room reserved (`capacity`), where the file ends.
///
/// A page of the mapping costs a page fault the first time it is written (2–10 µs on these
/// machines, zeroing included): `prepare(ahead:atMost:)` takes those faults ahead of the
/// appends, a slice at a time, at moments the owner chooses (the daemon's: once calls have
/// paused).
public final class MappedLog {
    private let file: FileDescriptor
    private var base: UnsafeMutableRawPointer?
    /// Bytes appended (the file's text ends here).
    public private(set) var length: Int
    /// Bytes reserved: the file's size.
    private var capacity = 0
    /// Bytes of address space mapped, at least `capacity` (past the file's end a store would
    /// be a `SIGBUS`: none is made there).
    private var window = 0
    /// Bytes from the start of the mapping whose pages are in it already: appends below
    /// this cost no page fault.
    private var populated = 0
    /// The least reserved at once; growth is by a quarter of the log, up to `maximumGrowth`.
    static let minimumGrowth = 64 << 10
    static let maximumGrowth = 8 << 20
    /// The least window mapped; a larger one is twice what is reserved.
    static let minimumWindow = 64 << 20

    /// Takes `file` (open for reading and writing), whose first `length` bytes are the log.
    public init(file: FileDescriptor, length: Int) throws(Errno) {
        self.file = file
        self.length = length
        try reserve(0)
    }

    deinit {
        if let base { munmap(base, window) }
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

    /// Makes room for `ahead` more bytes past the text, and takes the page faults of it now,
    /// reserving and populating at most `atMost` bytes more in this call (so that a caller
    /// can spread megabytes over several moments): `MADV_POPULATE_WRITE` (Linux 5.14; else a
    /// zero written to each page, which holds a zero already). The text is not changed.
    /// `ENOSPC`: no room for it (the log is as it was, and appends go on into whatever room
    /// there was).
    public func prepare(ahead: Int, atMost: Int = .max) throws(Errno) {
        let page = Self.pageSize
        let goal = (length + ahead + page - 1) / page * page
        let start = max(populated, length / page * page)
        let end = goal - start > atMost ? start + max(page, atMost / page * page) : goal
        guard end > start else { return }
        if end > capacity { try extend(to: end) }
        guard let base else { return }
        if madvise(base + start, end - start, MADV_POPULATE_WRITE) != 0 {
            for offset in stride(from: start, to: end, by: page) where offset >= length {
                (base + offset).storeBytes(of: 0, as: UInt8.self)
            }
        }
        populated = end
    }

    private static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// Makes room for `needed` more bytes past `length`, and a growth's worth beyond.
    private func reserve(_ needed: Int) throws(Errno) {
        let page = Self.pageSize
        let growth = min(Self.maximumGrowth, max(Self.minimumGrowth, length / 4))
        let wanted = (length + needed + growth + page - 1) / page * page
        guard wanted > capacity else { return }
        try extend(to: wanted)
    }

    /// Reserves the file up to `wanted` bytes (a multiple of the page size): what it adds,
    /// past what is reserved already. A new, larger window only when `wanted` is past the
    /// one mapped (its pages are then out of the mapping).
    private func extend(to wanted: Int) throws(Errno) {
        let result = posix_fallocate(file.rawValue, off_t(capacity), off_t(wanted - capacity))
        guard result == 0 else { throw Errno(result, "posix_fallocate(\(wanted - capacity) bytes at \(capacity))") }
        if wanted > window {
            let size = max(Self.minimumWindow, 2 * wanted)
            guard let mapped = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, file.rawValue, 0),
                  mapped != MAP_FAILED else { throw Errno.current("mmap(\(size) bytes)") }
            if let base { munmap(base, window) }
            base = mapped
            window = size
            populated = 0  // a new mapping: no page of it is in yet
        }
        capacity = wanted
    }
}
