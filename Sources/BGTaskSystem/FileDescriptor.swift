// SPDX-License-Identifier: Apache-2.0
import Glibc

/// An owned file descriptor, closed when the last reference goes away.
public final class FileDescriptor: @unchecked Sendable {
    /// The descriptor number; -1 once closed.
    public private(set) var rawValue: Int32

    /// Takes ownership of `rawValue`.
    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    deinit { close() }

    /// Closes the descriptor now (idempotent).
    public func close() {
        if rawValue >= 0 { _ = Glibc.close(rawValue) }
        rawValue = -1
    }

    /// Gives the descriptor up without closing it: the number returned is the caller's to
    /// close, and this object is closed (-1).
    public func disown() -> Int32 {
        defer { rawValue = -1 }
        return rawValue
    }

    /// Reads up to `count` bytes; an empty result means end of file. Throws `EAGAIN` as an
    /// `Errno` on a non-blocking descriptor with nothing to read.
    public func read(upTo count: Int) throws(Errno) -> [UInt8] {
        let fd = rawValue
        let bytes = try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized throws(Errno) in
            let n = try systemCall("read") { Glibc.read(fd, buffer.baseAddress, count) }
            initialized = n
        }
        return bytes
    }

    /// Reads up to `count` bytes from a non-blocking descriptor: `nil` when nothing is
    /// waiting (`EAGAIN`), empty at end of file.
    public func readAvailable(upTo count: Int) throws(Errno) -> [UInt8]? {
        do {
            return try read(upTo: count)
        } catch {
            if error.code == EAGAIN { return nil }
            throw error
        }
    }

    /// Reads into `buffer` from a non-blocking descriptor: how many bytes, `nil` when
    /// nothing is waiting (`EAGAIN`), 0 at end of file. For a reader with a buffer of its own.
    public func readAvailable(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int? {
        let fd = rawValue
        return try unlessWouldBlock("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// Reads up to `count` bytes a socket has waiting, without blocking even if the socket
    /// blocks (`MSG_DONTWAIT`): `nil` when nothing is waiting, empty at end of stream. One
    /// system call where a zero-timeout `poll` and a `read` are two. `recv(2)`
    public func receiveAvailable(upTo count: Int) throws(Errno) -> [UInt8]? {
        let fd = rawValue
        var received: Int?
        let bytes = try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized throws(Errno) in
            received = try unlessWouldBlock("recv") { recv(fd, buffer.baseAddress, count, Int32(MSG_DONTWAIT)) }
            initialized = received ?? 0
        }
        return received == nil ? nil : bytes
    }

    /// Copies into `buffer` what a non-blocking socket has waiting, leaving it there
    /// (`MSG_PEEK`; from the peek offset on, `UnixSocket.enablePeekOffset`): as
    /// `readAvailable(into:)`. `recv(2)`
    public func peekAvailable(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int? {
        let fd = rawValue
        return try unlessWouldBlock("recv(MSG_PEEK)") { recv(fd, buffer.baseAddress, buffer.count, Int32(MSG_PEEK | MSG_DONTWAIT)) }
    }

    /// `call`'s result, `nil` for `EAGAIN` (nothing to do now on a non-blocking descriptor).
    private func unlessWouldBlock(_ operation: String, _ call: () -> Int) throws(Errno) -> Int? {
        do {
            return try systemCall(operation, call)
        } catch {
            if error.code == EAGAIN { return nil }
            throw error
        }
    }

    /// Takes `count` bytes already peeked off a socket's input, through `scratch`. `recv(2)`
    public func consume(_ count: Int, through scratch: UnsafeMutableRawBufferPointer) throws(Errno) {
        let fd = rawValue
        var left = count
        while left > 0 {
            let taken = try systemCall("recv") { recv(fd, scratch.baseAddress, min(left, scratch.count), Int32(MSG_DONTWAIT)) }
            guard taken > 0 else { throw Errno(EIO, "recv") }
            left -= taken
        }
    }

    /// Writes as much of `bytes` as the descriptor takes now; returns how much.
    public func write<Bytes: Collection<UInt8>>(_ bytes: Bytes) throws(Errno) -> Int {
        let written: (count: Int, errno: Int32)? = bytes.withContiguousStorageIfAvailable { send($0) }
        guard let written else { return try write(Array(bytes)) }
        if written.count < 0 { throw Errno(written.errno, "write") }
        return written.count
    }

    /// Writes as much of `bytes` as a descriptor that is not a socket (a kernfs file, a pipe)
    /// takes now; returns how much. `write(2)` alone: `write` tries `send` first, which such a
    /// descriptor fails (`ENOTSOCK`), a system call for nothing at every cgroup freeze and
    /// thaw (strace).
    public func writeFile(_ bytes: [UInt8]) throws(Errno) -> Int {
        while true {
            let n = bytes.withUnsafeBufferPointer { Glibc.write(rawValue, $0.baseAddress, $0.count) }
            if n >= 0 { return n }
            if errno != EINTR { throw Errno(errno, "write") }
        }
    }

    /// Writes what a non-blocking descriptor takes now: `nil` when it takes nothing (`EAGAIN`).
    public func writeAvailable(_ bytes: ArraySlice<UInt8>) throws(Errno) -> Int? {
        // Concrete, for the daemon's replies: the generic one, unspecialized across modules,
        // reached the bytes through a protocol witness on every write (perf).
        try bytes.withUnsafeBufferPointer { buffer throws(Errno) in try writeAvailable(UnsafeRawBufferPointer(buffer)) }
    }

    /// The same, from memory the caller holds (the daemon's `ByteBuffer` of replies).
    public func writeAvailable(_ bytes: UnsafeRawBufferPointer) throws(Errno) -> Int? {
        let written = send(UnsafeBufferPointer(start: bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), count: bytes.count))
        if written.count >= 0 { return written.count }
        if written.errno == EAGAIN { return nil }
        throw Errno(written.errno, "write")
    }

    /// `send(2)` without `SIGPIPE`, retried on `EINTR`; `write(2)` on what is not a socket.
    /// A negative count comes with its errno.
    private func send(_ buffer: UnsafeBufferPointer<UInt8>) -> (count: Int, errno: Int32) {
        while true {
            let n = Glibc.send(rawValue, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL))
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == ENOTSOCK {
                let written = Glibc.write(rawValue, buffer.baseAddress, buffer.count)
                return (written, errno)
            }
            return (n, errno)
        }
    }

    /// Writes what a non-blocking descriptor takes now: `nil` when it takes nothing (`EAGAIN`).
    public func writeAvailable<Bytes: Collection<UInt8>>(_ bytes: Bytes) throws(Errno) -> Int? {
        do {
            return try write(bytes)
        } catch {
            if error.code == EAGAIN { return nil }
            throw error
        }
    }

    /// Writes all of `bytes`, blocking as needed.
    public func writeAll<Bytes: Collection<UInt8>>(_ bytes: Bytes) throws(Errno) {
        var rest = Array(bytes)[...]
        while !rest.isEmpty {
            let n = try write(rest)
            rest = rest.dropFirst(n)
        }
    }

    /// Reads up to `count` bytes from the start of the file (kernfs files such as
    /// `cgroup.events` must be re-read from the start to acknowledge a change). `pread(2)`
    public func readFromStart(upTo count: Int) throws(Errno) -> [UInt8] {
        let fd = rawValue
        return try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized throws(Errno) in
            initialized = try systemCall("pread") { pread(fd, buffer.baseAddress, count, 0) }
        }
    }

    /// Sets or clears `O_NONBLOCK`.
    public func setNonBlocking(_ on: Bool = true) throws(Errno) {
        let fd = rawValue
        let flags = try systemCall("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        try systemCall("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) }
    }

    /// Waits until the descriptor is readable (or `timeoutMilliseconds` pass; -1 waits forever).
    /// Returns whether it became readable.
    public func waitReadable(timeoutMilliseconds: Int32) throws(Errno) -> Bool {
        try wait(for: Int16(POLLIN), timeoutMilliseconds: timeoutMilliseconds)
    }

    /// Waits until the descriptor is writable (or an error or hang-up is pending), or
    /// `timeoutMilliseconds` pass. Returns whether it did.
    public func waitWritable(timeoutMilliseconds: Int32) throws(Errno) -> Bool {
        try wait(for: Int16(POLLOUT), timeoutMilliseconds: timeoutMilliseconds)
    }

    /// `poll(2)` on this one descriptor.
    private func wait(for events: Int16, timeoutMilliseconds: Int32) throws(Errno) -> Bool {
        var entry = pollfd(fd: rawValue, events: events, revents: 0)
        let n = try systemCall("poll") { poll(&entry, 1, timeoutMilliseconds) }
        return n > 0
    }
}

/// The name of a `readdir(3)` entry, read from the entry up to its NUL. A record is only as
/// long as its name (`d_reclen`): copying `d_name` whole (256 bytes) read past the last
/// record of the directory's buffer (AddressSanitizer: heap-buffer-overflow).
public func entryName(_ entry: UnsafeMutablePointer<dirent>) -> String {
    let name = UnsafeRawPointer(entry) + MemoryLayout<dirent>.offset(of: \dirent.d_name)!
    return String(cString: name.assumingMemoryBound(to: CChar.self))
}

/// Reads a whole (small) file such as `/proc/PID/stat`.
///
/// `shortReadEnds`: a read that returns less than asked is the last. True of the kernel's
/// `seq_file`s (`/proc/PID/stat`, `status`, `children`, `cgroup.procs`), whose read fills
/// the buffer unless the text has ended: it saves the read that would return 0.
public func readFile(_ path: String, limit: Int = 1 << 20, shortReadEnds: Bool = false) throws(Errno) -> [UInt8] {
    let fd = try systemCall("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
    let file = FileDescriptor(fd)
    var out: [UInt8] = []
    while out.count < limit {
        let chunk = try file.read(upTo: 4096)
        if chunk.isEmpty { break }
        out += chunk
        if shortReadEnds, chunk.count < 4096 { break }
    }
    return out
}
