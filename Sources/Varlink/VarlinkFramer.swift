// SPDX-License-Identifier: Apache-2.0
import Glibc  // memchr and memmove only: the library is Linux's, like the rest of bgtaskd
/// Splits a byte stream into Varlink messages: each message is one JSON text followed by a
/// NUL byte. Bytes may arrive split anywhere.
public struct VarlinkFramer: Sendable {
    /// Refused when a message (without its NUL) would be longer.
    public let maximumMessageBytes: Int
    /// Received bytes up to `end`; past it, room already made (the array's count only grows:
    /// emptying an array, or taking bytes off its front, was ~100 instructions per call,
    /// callgrind).
    private var buffer: [UInt8] = []
    private var end = 0
    /// Where the next message starts in `buffer`.
    private var start = 0
    /// How far `buffer` has been searched for a NUL.
    private var scanned = 0

    /// A message grew past `maximumMessageBytes` without its NUL.
    public struct MessageTooLarge: Error, Equatable, Sendable {
        public var limit: Int
        public init(limit: Int) { self.limit = limit }
    }

    public init(maximumMessageBytes: Int) {
        self.maximumMessageBytes = maximumMessageBytes
    }

    /// Bytes received but not yet returned as a message.
    public var bufferedByteCount: Int { end - start }

    /// Adds received bytes.
    public mutating func append<Bytes: Sequence<UInt8>>(_ bytes: Bytes) {
        // An array or a slice of one (what a client's read returns) is copied from where it lies.
        if bytes.withContiguousStorageIfAvailable({ append(UnsafeRawBufferPointer($0)) }) != nil { return }
        Array(bytes).withUnsafeBytes { append($0) }
    }

    /// Adds received bytes, as a reader with a buffer of its own has them (concrete: the
    /// generic append of a fresh array per read cost ~1,700 instructions per call, callgrind).
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compact()
        guard let source = bytes.baseAddress, bytes.count > 0 else { return }
        if buffer.count < end + bytes.count {
            // Room by doubling, so appends stay amortized O(1).
            buffer.append(contentsOf: repeatElement(0, count: max(end + bytes.count, 2 * buffer.count) - buffer.count))
        }
        let at = end
        buffer.withUnsafeMutableBytes { $0.baseAddress!.advanced(by: at).copyMemory(from: source, byteCount: bytes.count) }
        end += bytes.count
    }

    private mutating func compact() {
        if start > 0, start == end {
            // Everything was taken (the usual case: one call, its reply, the next call).
            start = 0
            end = 0
            scanned = 0
        } else if start > 0, start >= end / 2 {
            // Compact once the consumed prefix is at least half, so appends stay amortized O(1).
            let (from, count) = (start, end - start)
            buffer.withUnsafeMutableBytes { _ = memmove($0.baseAddress!, $0.baseAddress! + from, count) }
            scanned -= start
            end -= start
            start = 0
        }
    }

    /// The next complete message (without its NUL), or `nil` if none is complete yet.
    public mutating func next() throws(MessageTooLarge) -> ArraySlice<UInt8>? {
        // memchr, not `firstIndex(of:)`: a byte at a time was ~5 instructions per byte.
        let (from, to) = (scanned, end)
        let found = buffer.withUnsafeBytes { bytes -> Int? in
            guard from < to, let base = bytes.baseAddress, let hit = memchr(base + from, 0, to - from) else { return nil }
            return base.distance(to: UnsafeRawPointer(hit))
        }
        if let nul = found {
            let message = buffer[start..<nul]
            guard message.count <= maximumMessageBytes else { throw MessageTooLarge(limit: maximumMessageBytes) }
            start = nul + 1
            scanned = start
            return message
        }
        scanned = end
        guard end - start <= maximumMessageBytes else { throw MessageTooLarge(limit: maximumMessageBytes) }
        return nil
    }
}
