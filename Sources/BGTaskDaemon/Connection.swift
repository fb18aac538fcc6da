import BGTaskCore
import BGTaskSystem
import Glibc
import Varlink

/// One client connection: its socket, what the kernel says about its peer, its input
/// framing and output buffer, and the stream it is in, if any.
///
/// Calls are answered in order. While a call streams (`more`), later calls wait in the
/// framer, as with sd-varlink: the stream's replies never interleave with other replies.
final class Connection {
    /// What a streaming call is following.
    enum Stream: Equatable {
        case subscription(ProcessIdentity)
        case task(TaskID)
        case monitor
    }

    let id: ConnectionID
    let socket: FileDescriptor
    let credentials: PeerCredentials
    /// The peer's pidfd (`SO_PEERPIDFD`), taken at accept.
    let peerPidfd: Pidfd?
    var source: EventSource?
    var framer: VarlinkFramer
    var stream: Stream?
    /// The caller as resolved at its first `io.bgtaskd.App` call.
    var caller: ProcessDescription?
    private var output: [UInt8] = []
    private var outputStart = 0
    private(set) var isClosed = false
    /// Bytes of replies the peer has not read yet; past this the connection is dropped.
    static let maximumPendingOutput = 8 << 20

    init(id: ConnectionID, socket: FileDescriptor, credentials: PeerCredentials, peerPidfd: Pidfd?,
         maximumMessageBytes: Int) {
        self.id = id
        self.socket = socket
        self.credentials = credentials
        self.peerPidfd = peerPidfd
        self.framer = VarlinkFramer(maximumMessageBytes: maximumMessageBytes)
    }

    var pendingOutputBytes: Int { output.count - outputStart }

    /// Queues a reply and writes what the socket takes now. Returns false if the peer is
    /// gone or too far behind, in which case the caller must close the connection.
    func send(_ reply: VarlinkReply) -> Bool {
        guard !isClosed else { return false }
        // The bound is on the backlog the peer left unread, so one large reply (ListTasks
        // with 100,000 tasks) still goes through.
        if pendingOutputBytes > Self.maximumPendingOutput { return false }
        reply.json.write(to: &output)
        output.append(0)
        return flush()
    }

    /// Writes buffered output; arms `EPOLLOUT` while some remains.
    func flush() -> Bool {
        while outputStart < output.count {
            do {
                let written = try socket.write(output[outputStart...])
                outputStart += written
            } catch where error.code == EAGAIN {
                break
            } catch {
                return false
            }
        }
        if outputStart == output.count {
            output.removeAll(keepingCapacity: output.count < 65536)
            outputStart = 0
            source?.setIOEvents(IOEvents.readable)
            return true
        }
        source?.setIOEvents(IOEvents.readable | IOEvents.writable)
        return true
    }

    func close() {
        isClosed = true
        source = nil
        socket.close()
    }
}
