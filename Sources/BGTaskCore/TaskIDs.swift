// SPDX-License-Identifier: Apache-2.0
/// The active tasks of one owner or one connection, kept by `BackgroundModel`'s indexes.
/// One id is held inline: nearly every owner holds one task at a time, and a `Set` made for
/// each `BeginTask` and freed by its `EndTask` was an allocation, its hashing and its free per
/// pair (callgrind: ~1,200 instructions of each pair's ~36,000).
struct TaskIDs: Sequence {
    private enum Storage {
        case one(TaskID)
        case many(Set<TaskID>)
    }

    private var storage: Storage

    init(_ id: TaskID) { storage = .one(id) }

    mutating func insert(_ id: TaskID) {
        switch storage {
        case let .one(held):
            if held != id { storage = .many([held, id]) }
        case var .many(ids):
            storage = .one(0)  // lets go of the set's storage, so the insert does not copy it
            ids.insert(id)
            storage = .many(ids)
        }
    }

    /// Removes `id`; returns whether none is left.
    mutating func remove(_ id: TaskID) -> Bool {
        switch storage {
        case let .one(held):
            return held == id
        case var .many(ids):
            storage = .one(0)
            ids.remove(id)
            if ids.count == 1, let last = ids.first {
                storage = .one(last)
            } else {
                storage = .many(ids)
            }
            return ids.isEmpty
        }
    }

    var first: TaskID? {
        switch storage {
        case let .one(id): id
        case let .many(ids): ids.first
        }
    }

    func makeIterator() -> Array<TaskID>.Iterator {
        switch storage {
        case let .one(id): [id].makeIterator()
        case let .many(ids): Array(ids).makeIterator()
        }
    }
}

extension Dictionary where Value == TaskIDs {
    /// Files `id` under `key`, one hash lookup.
    mutating func insert(_ id: TaskID, under key: Key) {
        if let index = index(forKey: key) {
            values[index].insert(id)
        } else {
            self[key] = TaskIDs(id)
        }
    }

    /// Takes `id` from `key`'s ids, and `key` with its last.
    mutating func remove(_ id: TaskID, under key: Key) {
        guard let index = index(forKey: key) else { return }
        if values[index].remove(id) { remove(at: index) }
    }
}
