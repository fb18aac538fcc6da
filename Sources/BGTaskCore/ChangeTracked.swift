// SPDX-License-Identifier: Apache-2.0
/// A dictionary that remembers which keys changed, so the daemon can save only those.
///
/// Every write goes through the subscript (`_modify` mutates in place: appending to a
/// record's array does not copy it), which notes the key; `changedKeys` are those, until
/// `clearChanges()`.
struct ChangeTracked<Key: Hashable, Value> {
    private(set) var dictionary: [Key: Value] = [:]
    private var changed: Set<Key> = []

    subscript(key: Key) -> Value? {
        get { dictionary[key] }
        // Assigning a whole value (`apps[id] = record`): the dictionary's own setter; `_modify`
        // moved the old value out and back before it was replaced (callgrind).
        set {
            changed.insert(key)
            dictionary[key] = newValue
        }
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

    /// Changes `key`'s value where it lies (noted as changed unless `saved` is false); `nil`
    /// without a value. `subscript`'s `_modify` moves an `Optional` of the whole value out
    /// and back in (~700 instructions for an app's record: callgrind), once per field set.
    @discardableResult
    mutating func update<T>(_ key: Key, saved: Bool = true, _ change: (inout Value) -> T) -> T? {
        guard let index = dictionary.index(forKey: key) else { return nil }
        if saved { changed.insert(key) }
        return change(&dictionary.values[index])
    }

    /// Reads `key`'s value where it lies, for a caller that needs a field or two: the getter
    /// hands out a copy, every string and array in it retained then released (~400
    /// instructions for an app's record, several per call: callgrind). `read` must not write.
    mutating func peek<T>(_ key: Key, _ read: (inout Value) -> T) -> T? { update(key, saved: false, read) }

    /// Whether `key` has a value, without the getter's copy of it.
    func contains(_ key: Key) -> Bool { dictionary.index(forKey: key) != nil }

    var count: Int { dictionary.count }
    var keys: Dictionary<Key, Value>.Keys { dictionary.keys }
    var values: Dictionary<Key, Value>.Values { dictionary.values }

    /// Whether a key was written since the last `clearChanges()`.
    var hasChanges: Bool { !changed.isEmpty }

    /// The keys written since the last `clearChanges()`.
    var changedKeys: Set<Key> { changed }

    /// Starts afresh, keeping the set's storage: taking the set and starting a new one
    /// allocated one per pass (callgrind).
    mutating func clearChanges() { changed.removeAll(keepingCapacity: true) }

    /// Notes `key` as changed without writing it.
    mutating func touch(_ key: Key) { changed.insert(key) }
}
