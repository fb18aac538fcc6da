// SPDX-License-Identifier: Apache-2.0
/// A dictionary that remembers which keys changed, so the daemon can save only those.
///
/// Every write goes through the subscript (`_modify` mutates in place: appending to a
/// record's array does not copy it), which notes the key; `takeChanges()` hands the keys
/// over and starts afresh.
struct ChangeTracked<Key: Hashable, Value> {
    private(set) var dictionary: [Key: Value] = [:]
    private var changed: Set<Key> = []

    subscript(key: Key) -> Value? {
        get { dictionary[key] }
        _modify {
            changed.insert(key)
            yield &dictionary[key]
        }
    }

    /// Writes what is not saved (an app's task list, rebuilt from the tasks on restore; its
    /// subscriber count, which a restart resets) without noting a change.
    subscript(unsaved key: Key) -> Value? {
        get { dictionary[key] }
        _modify { yield &dictionary[key] }
    }

    var count: Int { dictionary.count }
    var keys: Dictionary<Key, Value>.Keys { dictionary.keys }
    var values: Dictionary<Key, Value>.Values { dictionary.values }

    /// Whether a key was written since the last `takeChanges()`.
    var hasChanges: Bool { !changed.isEmpty }

    /// The keys written since the last call.
    mutating func takeChanges() -> Set<Key> {
        guard !changed.isEmpty else { return [] }  // most passes: no allocation
        defer { changed = [] }
        return changed
    }

    /// Notes `key` as changed without writing it.
    mutating func touch(_ key: Key) { changed.insert(key) }
}
