// SPDX-License-Identifier: Apache-2.0

extension Array {
    /// Empties the array and keeps its storage, as `removeAll(keepingCapacity: true)` does,
    /// without that call's generic `replaceSubrange` when there is at most one element to
    /// remove: 60–150 instructions each time, however few the elements, where `removeLast()`
    /// takes about 15 (callgrind). The event loop's and the daemon's per-pass lists (ready
    /// members, effects, output chunks, connections touched) hold none or one almost always,
    /// and are emptied every pass.
    @inlinable @inline(__always)
    public mutating func removeAllKeepingCapacity() {
        if count > 1 {
            removeAll(keepingCapacity: true)
        } else if count == 1 {
            removeLast()
        }
    }
}
