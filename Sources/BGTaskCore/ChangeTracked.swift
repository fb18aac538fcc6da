// SPDX-License-Identifier: Apache-2.0
/// A dictionary that remembers which keys changed, so the daemon can save only those.
///
/// Every write goes through the subscript (`_modify` mutates in place: appending to a
/// record's array does not copy it), which notes the key; `changedKeys` are those, until
/// `clearChanges()`. Keys are hashed as one word (`WordKey`): the model's two tables are
/// looked up several times per call.
struct ChangeTracked<Key: HashWord, Value> {
    private var dictionary: [WordKey<Key>: Value] = [:]
    /// The keys written since the last `clearChanges()`, each once, in the order first
    /// written: `changed[..<changedCount]` (the entries past it are stale, kept so that
    /// starting afresh is one store: `removeAll(keepingCapacity:)` went through the array's
    /// generic `replaceSubrange`). A call writes a key or two: they are found by a look along
    /// this list, and only past `scannedChanges` keys (a burst's pass) by `changedSet`
    /// beside it. A set alone was hashed, inserted into and cleared on every call (~300
    /// instructions of the pinned Begin+End's, callgrind).
    private var changed: [Key] = []
    private(set) var changedCount = 0
    /// Made with room at once: the first growth of an empty set made its storage's type (by
    /// name, through the Swift runtime's demangler, before release builds reached metadata
    /// through accessors: Package.swift), and the first pass that wrote more than
    /// `scannedChanges` tasks was the first deadline burst's first slice.
    private var changedSet = Set<WordKey<Key>>(minimumCapacity: 2 * scannedChanges)

    /// The most keys looked for along `changed` before `changedSet` is kept.
    static var scannedChanges: Int { 8 }

    /// Notes `key` as written, once.
    private mutating func note(_ key: Key) {
        if changedCount < Self.scannedChanges {
            for index in 0..<changedCount where changed[index] == key { return }
        } else {
            if changedSet.isEmpty {
                for listed in changed[..<changedCount] { changedSet.insert(WordKey(listed)) }
            }
            guard changedSet.insert(WordKey(key)).inserted else { return }
        }
        if changedCount < changed.count {
            changed[changedCount] = key
        } else {
            changed.append(key)
        }
        changedCount += 1
    }

    subscript(key: Key) -> Value? {
        get { dictionary[WordKey(key)] }
        // Assigning a whole value (`apps[id] = record`): the dictionary's own setter; `_modify`
        // moved the old value out and back before it was replaced (callgrind).
        set {
            note(key)
            dictionary[WordKey(key)] = newValue
        }
        _modify {
            note(key)
            yield &dictionary[WordKey(key)]
        }
    }

    /// Writes what is not saved (an app's task list, rebuilt from the tasks on restore; its
    /// subscriber count, which a restart resets) without noting a change.
    subscript(unsaved key: Key) -> Value? {
        get { dictionary[WordKey(key)] }
        _modify {
            yield &dictionary[WordKey(key)]
        }
    }

    /// Changes `key`'s value where it lies (noted as changed unless `saved` is false); `nil`
    /// without a value. `subscript`'s `_modify` moves an `Optional` of the whole value out
    /// and back in (~700 instructions for an app's record: callgrind), once per field set.
    @discardableResult
    mutating func update<T>(_ key: Key, saved: Bool = true, _ change: (inout Value) -> T) -> T? {
        guard let index = dictionary.index(forKey: WordKey(key)) else { return nil }
        if saved { note(key) }
        return change(&dictionary.values[index])
    }

    /// Reads `key`'s value where it lies, for a caller that needs a field or two: the getter
    /// hands out a copy, every string and array in it retained then released (~400
    /// instructions for an app's record, several per call: callgrind). `read` must not write.
    mutating func peek<T>(_ key: Key, _ read: (inout Value) -> T) -> T? { update(key, saved: false, read) }

    /// Whether `key` has a value, without the getter's copy of it.
    func contains(_ key: Key) -> Bool { dictionary.index(forKey: WordKey(key)) != nil }

    var count: Int { dictionary.count }
    var keys: LazyMapSequence<Dictionary<WordKey<Key>, Value>.Keys, Key> { dictionary.keys.lazy.map(\.key) }
    var values: Dictionary<WordKey<Key>, Value>.Values { dictionary.values }

    /// The values as they are now, to read while the table itself is written (a copy of the
    /// table's reference, not of its entries).
    var snapshot: Snapshot { Snapshot(dictionary: dictionary) }

    struct Snapshot {
        fileprivate let dictionary: [WordKey<Key>: Value]
        subscript(key: Key) -> Value? { dictionary[WordKey(key)] }
    }

    /// Whether a key was written since the last `clearChanges()`.
    var hasChanges: Bool { changedCount > 0 }

    /// The keys written since the last `clearChanges()`, in the order first written.
    var changedKeys: ArraySlice<Key> { changed[..<changedCount] }

    /// Starts afresh, keeping the storage.
    mutating func clearChanges() {
        changedCount = 0
        if !changedSet.isEmpty { changedSet.removeAll(keepingCapacity: true) }
    }

    /// Notes `key` as changed without writing it.
    mutating func touch(_ key: Key) { note(key) }
}

/// A key hashed as one word of its own: `WordKey` mixes it with the table's seed
/// (`seededHash`) instead of running a SipHash over a `Hasher` (~250 instructions per
/// lookup of an `Int` key, four or five per call: callgrind). Equal keys give equal words.
protocol HashWord: Hashable {
    var hashWord: UInt64 { get }
}

extension Int: HashWord {
    var hashWord: UInt64 { UInt64(bitPattern: Int64(self)) }
}

extension UInt32: HashWord {
    var hashWord: UInt64 { UInt64(self) }
}

/// A table's key, hashed by its `hashWord`. Task ids are the daemon's own, counted up, and
/// identities come from the kernel: with the random key `seededHash` mixes in, a local user
/// cannot line keys up in one bucket.
struct WordKey<Key: HashWord>: Hashable {
    let key: Key
    init(_ key: Key) { self.key = key }
    static func == (lhs: Self, rhs: Self) -> Bool { lhs.key == rhs.key }
    func hash(into hasher: inout Hasher) { hasher.combine(key.hashWord) }
    func _rawHashValue(seed: Int) -> Int { seededHash(key.hashWord, seed: seed) }
}
