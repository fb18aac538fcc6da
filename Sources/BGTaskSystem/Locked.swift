// SPDX-License-Identifier: Apache-2.0
import Glibc

/// A value shared between threads, reached only under its lock. `pthread_mutex_lock(3)`
public final class Locked<Value>: @unchecked Sendable {
    private var value: Value
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    public init(_ value: Value) {
        self.value = value
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
