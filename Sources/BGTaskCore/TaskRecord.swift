// SPDX-License-Identifier: Apache-2.0
extension BackgroundModel {
    /// An active task, as the model keeps it (an ended task is forgotten).
    struct TaskRecord {
        let id: TaskID
        let app: ProcessIdentity
        /// The app's uid: events about the task go to it (and to managers) only, even once
        /// the app is gone.
        let uid: UInt32
        let owner: ProcessIdentity
        let connection: ConnectionID?
        let name: String
        let expirationHandler: Bool
        let created: Instant
        var state: TaskState = .pending
        var grantAt: Instant
        /// Its age warning went out (so it is no longer in `ageQueue`).
        var ageWarned = false
    }
}
