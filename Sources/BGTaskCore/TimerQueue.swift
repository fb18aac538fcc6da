// SPDX-License-Identifier: Apache-2.0
/// A min-heap of timers. Entries are not removed when cancelled: each is checked against the
/// model's state when it fires, so cancelling is free. Between calls the model drops the
/// first ones while they are stale (`removeFirst`: the daemon's timer is armed for one that
/// acts, not for a wake-up that does nothing), and all stale ones at once when the heap has
/// doubled since the last time (`dropStale`), so what it holds is bounded by what is live,
/// not by how fast entries are made stale: an app's owner flipping it between foreground
/// and background leaves two entries a flip (its warning and its deadline, up to
/// `BackgroundTimeSec` ahead), and uid 65534 doing so 160,000 times a second grew the daemon
/// by 180 MB in 20 s, never given back.
struct TimerQueue {
    enum Kind: Equatable {
        case grant(TaskID)
        case transitionTimeout(ProcessIdentity, epoch: UInt64)
        case warning(ProcessIdentity, epoch: UInt64)
        case deadline(ProcessIdentity, epoch: UInt64)
        case kill(ProcessIdentity)
        /// A wait of the daemon's (`Wait`), current while its serial is the one armed.
        case wait(Wait, serial: UInt64)
        /// The scheduled requests' next pass, current while its serial is the model's.
        case requests(serial: UInt64)
    }

    struct Entry {
        var instant: Instant
        /// Insertion order breaks ties, so timers due together fire in the order armed.
        var sequence: UInt64
        var kind: Kind

        func precedes(_ other: Entry) -> Bool {
            (instant, sequence) < (other.instant, other.sequence)
        }
    }

    private var heap: [Entry] = []
    private var sequence: UInt64 = 0
    /// The count past which `dropStale` looks: twice what was left by the last look.
    private var looksPast = TimerQueue.fewestLookedAt

    /// Below this many entries stale ones are left to fire (~200 KiB at most).
    static let fewestLookedAt = 4096

    var count: Int { heap.count }
    var first: Entry? { heap.first }
    /// The heap's storage, for the tests of its bound.
    var capacity: Int { heap.capacity }

    mutating func insert(_ kind: Kind, at instant: Instant) {
        sequence += 1
        heap.append(Entry(instant: instant, sequence: sequence, kind: kind))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].precedes(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Every entry due at or before `now`, in no order, without removing any (the heap's
    /// due part is a subtree at its top: this costs what is due, not the whole heap).
    func due(at now: Instant) -> [Entry] {
        // Nothing due (every call's pass asks, rule 7a): no walk, no allocation.
        guard let top = heap.first, top.instant <= now else { return [] }
        var result: [Entry] = []
        var stack = [0]
        while let index = stack.popLast() {
            guard heap[index].instant <= now else { continue }
            result.append(heap[index])
            let left = 2 * index + 1  // children pushed one by one: an array literal here cost an allocation per entry
            if left < heap.count { stack.append(left) }
            if left + 1 < heap.count { stack.append(left + 1) }
        }
        return result
    }

    /// Removes and returns the earliest entry due at or before `now`.
    mutating func popDue(at now: Instant) -> Entry? {
        guard let top = heap.first, top.instant <= now else { return nil }
        removeFirst()
        return top
    }

    /// Removes the earliest entry (there is one).
    mutating func removeFirst() {
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            siftDown(0)
        }
    }

    /// Whether the heap has doubled since the last `dropStale` (and holds more than
    /// `fewestLookedAt`).
    var hasPiledUp: Bool { heap.count > looksPast }

    /// Keeps only the entries `isCurrent` says would still do something when they fire, in
    /// storage of their size (the old is freed), and orders them again. Each entry is looked
    /// at by few looks: one costs what the heap holds, at least half of it dropped or grown
    /// since the last.
    mutating func dropStale(keeping isCurrent: (Entry) -> Bool) {
        heap = heap.filter(isCurrent)
        for index in stride(from: heap.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
        looksPast = max(Self.fewestLookedAt, 2 * heap.count)
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].precedes(heap[smallest]) { smallest = left }
            if right < heap.count, heap[right].precedes(heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}

/// SplitMix64: a small, seedable generator, so grant latencies are reproducible.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
