/* SPDX-License-Identifier: Apache-2.0 */
#ifndef BGTASKD_CSYSTEMD_SHIM_H
#define BGTASKD_CSYSTEMD_SHIM_H

#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <systemd/sd-journal.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/random.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <spawn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux 6.5+; Debian 12's headers predate it. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* Declared by glibc only under _GNU_SOURCE, which the Swift Glibc module does not set. */
int accept4(int fd, struct sockaddr *__restrict addr, socklen_t *__restrict len, int flags);
int pipe2(int pipefd[2], int flags);
int unshare(int flags);

/* The calling thread takes a private copy of the process's file-system context (umask,
   root, working directory: CLONE_FS, 0x200), so that a umask it sets is its own. 0 or -errno. */
static inline int bgtask_unshare_fs(void) {
    return unshare(0x00000200) < 0 ? -errno : 0;
}

/* Renames FROM to TO unless TO exists (renameat2 with RENAME_NOREPLACE, 1: then EEXIST).
   0 or -errno. */
static inline int bgtask_rename_noreplace(const char *from, const char *to) {
    return syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 1) < 0 ? -errno : 0;
}

struct bgtask_ucred {
    int pid;
    unsigned uid;
    unsigned gid;
};

/* SO_PEERCRED into a struct laid out like the kernel's struct ucred. */
static inline int bgtask_peer_credentials(int fd, struct bgtask_ucred *out) {
    socklen_t length = sizeof(*out);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &length);
}

/* sched_setaffinity needs _GNU_SOURCE's cpu_set_t; the raw system call takes a mask. */
#include <sys/syscall.h>
#include <unistd.h>
static inline int bgtask_set_affinity(int pid, unsigned long long mask) {
    return (int)syscall(SYS_sched_setaffinity, pid, sizeof(mask), &mask);
}

/* Swift cannot import these function-like macros. */
static inline int bgtask_wifexited(int status) { return WIFEXITED(status); }
static inline int bgtask_wexitstatus(int status) { return WEXITSTATUS(status); }
static inline int bgtask_wifsignaled(int status) { return WIFSIGNALED(status); }
static inline int bgtask_wtermsig(int status) { return WTERMSIG(status); }

/* The kernel's process-events connector: forks and exits as they happen (CAP_NET_ADMIN).
 * Opens a non-blocking, close-on-exec NETLINK_CONNECTOR socket subscribed to CN_IDX_PROC and
 * asks the kernel to start sending; returns the descriptor or -errno. */
#include <linux/netlink.h>
#include <linux/connector.h>
#include <linux/cn_proc.h>
#include <errno.h>
#include <string.h>
#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
/* Asks the kernel to send the events (PROC_CN_MCAST_LISTEN) or to stop (IGNORE): while no
 * socket listens, the kernel makes no event at all. */
static inline int bgtask_proc_events_op(int fd, enum proc_cn_mcast_op op) {
    struct {
        struct nlmsghdr header;
        struct cn_msg message __attribute__((packed));
        enum proc_cn_mcast_op op;
    } __attribute__((packed, aligned(NLMSG_ALIGNTO))) request;
    memset(&request, 0, sizeof(request));
    request.header.nlmsg_len = sizeof(request);
    request.header.nlmsg_type = NLMSG_DONE;
    request.header.nlmsg_pid = 0;
    request.message.id.idx = CN_IDX_PROC;
    request.message.id.val = CN_VAL_PROC;
    request.message.len = sizeof(enum proc_cn_mcast_op);
    request.op = op;
    return send(fd, &request, sizeof(request), 0) < 0 ? -errno : 0;
}
#include <linux/filter.h>
#include <arpa/inet.h>
#include <stddef.h>
/* Offsets in a datagram of the connector: its netlink header, the cn_msg, the proc_event. */
#define BGTASK_PROC_EVENT(field) (NLMSG_HDRLEN + sizeof(struct cn_msg) + offsetof(struct proc_event, field))
/* A socket filter that lets through only what bgtask_proc_event reads: a process's fork
 * (child_pid = child_tgid) and a process's exit (process_pid = process_tgid). Execs, renames,
 * id changes and every thread's creation and exit are dropped in the kernel, before they
 * wake the reader. Loads are big-endian in classic BPF: constants go through htonl, and
 * fields are compared with each other. Returns 0 or -errno. */
static inline int bgtask_proc_events_filter(int fd) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, BGTASK_PROC_EVENT(what)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(PROC_EVENT_FORK), 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, BGTASK_PROC_EVENT(event_data.fork.child_tgid)),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, BGTASK_PROC_EVENT(event_data.fork.child_pid)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, 5, 6),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(PROC_EVENT_EXIT), 0, 5),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, BGTASK_PROC_EVENT(event_data.exit.process_tgid)),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, BGTASK_PROC_EVENT(event_data.exit.process_pid)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0xffffffff),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog program = { .len = sizeof(code) / sizeof(code[0]), .filter = code };
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof(program)) < 0 ? -errno : 0;
}
static inline int bgtask_proc_events_open(int receive_buffer_bytes) {
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_CONNECTOR);
    if (fd < 0) return -errno;
    /* Best effort: without it every event is read, and those left out above are skipped. */
    (void)bgtask_proc_events_filter(fd);
    /* As root, beyond rmem_max: a burst of forks must not overflow it. Best effort. */
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
    struct sockaddr_nl address = { .nl_family = AF_NETLINK, .nl_groups = CN_IDX_PROC, .nl_pid = 0 };
    if (bind(fd, (struct sockaddr *)&address, sizeof(address)) < 0) { int e = errno; close(fd); return -e; }
    int r = bgtask_proc_events_op(fd, PROC_CN_MCAST_LISTEN);
    if (r < 0) { close(fd); return r; }
    return fd;
}
/* Stops (listen = 0) or starts again (1) the events of a socket from bgtask_proc_events_open.
 * Stopping leaves the multicast group (on every kernel the socket then receives nothing; the
 * LISTEN/IGNORE count alone does not stop the group's delivery before Linux 6.6) after telling
 * the kernel to stop; starting joins the group before telling it to start, so no event made
 * after this returns is missed. Returns 0 or -errno. */
static inline int bgtask_proc_events_listen(int fd, int listen) {
    int group = CN_IDX_PROC;
    if (listen) {
        if (setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) < 0) return -errno;
        return bgtask_proc_events_op(fd, PROC_CN_MCAST_LISTEN);
    }
    int r = bgtask_proc_events_op(fd, PROC_CN_MCAST_IGNORE);
    if (r < 0) return r;
    return setsockopt(fd, SOL_NETLINK, NETLINK_DROP_MEMBERSHIP, &group, sizeof(group)) < 0 ? -errno : 0;
}

#include <linux/rtnetlink.h>
#include <sys/inotify.h>

/* A netlink socket bound to multicast `groups` of `protocol`, non-blocking: kernel uevents
 * (NETLINK_KOBJECT_UEVENT, group 1) or route changes (NETLINK_ROUTE, RTMGRP_*_ROUTE). Any
 * user may listen to both. */
static inline int bgtask_netlink_listen(int protocol, unsigned groups) {
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
    if (fd < 0) return -errno;
    struct sockaddr_nl address = { .nl_family = AF_NETLINK, .nl_groups = groups, .nl_pid = 0 };
    if (bind(fd, (struct sockaddr *)&address, sizeof(address)) < 0) { int e = errno; close(fd); return -e; }
    return fd;
}

static inline unsigned bgtask_route_groups(void) { return RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE; }

/* One event of a received datagram: 1 = fork (parent, child), 2 = exit (pid, 0), 0 = other.
 * Threads are left out: a fork counts only when the child is a new process (tgid = pid). */
static inline int bgtask_proc_event(const unsigned char *datagram, long length, int *first, int *second) {
    const struct nlmsghdr *header = (const struct nlmsghdr *)datagram;
    if (length < (long)(NLMSG_HDRLEN + sizeof(struct cn_msg) + sizeof(struct proc_event))) return 0;
    if (!NLMSG_OK(header, (unsigned long)length) || header->nlmsg_type != NLMSG_DONE) return 0;
    const struct cn_msg *message = (const struct cn_msg *)NLMSG_DATA(header);
    if (message->id.idx != CN_IDX_PROC || message->id.val != CN_VAL_PROC) return 0;
    struct proc_event event;
    memcpy(&event, message->data, sizeof(event));
    if (event.what == PROC_EVENT_FORK && event.event_data.fork.child_pid == event.event_data.fork.child_tgid) {
        *first = event.event_data.fork.parent_tgid;
        *second = event.event_data.fork.child_tgid;
        return 1;
    }
    if (event.what == PROC_EVENT_EXIT && event.event_data.exit.process_pid == event.event_data.exit.process_tgid) {
        *first = event.event_data.exit.process_tgid;
        *second = 0;
        return 2;
    }
    return 0;
}

/* Asks the systemd manager at the other end of `bus` to start a transient scope `name`
 * holding `pids` (StartTransientUnit, mode "fail"), in `slice` if not NULL. The reply goes
 * to `callback` on the bus's event loop; nothing here waits. Returns 0 or -errno. */
#include <systemd/sd-bus.h>
static inline int bgtask_start_transient_scope(sd_bus *bus, const char *name, const char *slice,
                                               const char *description, const unsigned *pids, size_t count,
                                               sd_bus_message_handler_t callback, void *userdata) {
    sd_bus_message *m = NULL;
    int r = sd_bus_message_new_method_call(bus, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "StartTransientUnit");
    if (r < 0) return r;
    r = sd_bus_message_append(m, "ss", name, "fail");
    if (r >= 0) r = sd_bus_message_open_container(m, 'a', "(sv)");
    if (r >= 0) r = sd_bus_message_append(m, "(sv)", "Description", "s", description);
    if (r >= 0 && slice) r = sd_bus_message_append(m, "(sv)", "Slice", "s", slice);
    if (r >= 0) r = sd_bus_message_append(m, "(sv)", "CollectMode", "s", "inactive-or-failed");
    if (r >= 0) r = sd_bus_message_open_container(m, 'r', "sv");
    if (r >= 0) r = sd_bus_message_append(m, "s", "PIDs");
    if (r >= 0) r = sd_bus_message_open_container(m, 'v', "au");
    if (r >= 0) r = sd_bus_message_append_array(m, 'u', pids, count * sizeof(unsigned));
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_message_close_container(m);
    if (r >= 0) r = sd_bus_message_append(m, "a(sa(sv))", 0);
    if (r >= 0) r = sd_bus_call_async(bus, NULL, m, callback, userdata, 5 * 1000 * 1000);
    sd_bus_message_unref(m);
    return r;
}

/* Connects to a systemd manager's private socket at the absolute `path` without following a
 * symbolic link anywhere on the way (every component opened O_NOFOLLOW: the user owns
 * /run/user/UID and could point it anywhere), and reads who listens (SO_PEERCRED), so that the
 * caller can check it before a word is sent. Returns the connected socket or -errno. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#ifndef O_PATH
#define O_PATH 010000000 /* Linux's; fcntl.h defines it only with _GNU_SOURCE */
#endif
static inline int bgtask_manager_connect(const char *path, struct bgtask_ucred *peer) {
    if (path[0] != '/' || strlen(path) >= 4096) return -EINVAL;
    char copy[4096];
    strcpy(copy, path);
    int dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return -errno;
    char *component = copy + 1, *slash;
    while ((slash = strchr(component, '/'))) {
        *slash = 0;
        int next = openat(dir, component, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(dir);
        if (next < 0) return -e;
        dir = next;
        component = slash + 1;
    }
    int node = openat(dir, component, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    int e = errno;
    close(dir);
    if (node < 0) return -e;
    struct stat st;
    if (fstat(node, &st) < 0 || !S_ISSOCK(st.st_mode)) { close(node); return -ENOTSOCK; }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { e = errno; close(node); return -e; }
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof(address.sun_path), "/proc/self/fd/%d", node);
    int r = connect(fd, (struct sockaddr *)&address, sizeof(address));
    e = errno;
    close(node);
    if (r < 0) { close(fd); return -e; }
    socklen_t length = sizeof(*peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, peer, &length) < 0) { e = errno; close(fd); return -e; }
    return fd;
}

/* A manager's reply is all bgtaskd waits for: a method call from the other end (the real
 * manager makes none) ends the connection, so a peer flooding it with Peer.Ping cannot make
 * sd-bus queue replies without bound. Signals (the manager sends JobNew and JobRemoved to
 * every private connection) are read and dropped; nothing queues them. */
static int bgtask_manager_filter(sd_bus_message *m, void *userdata, sd_bus_error *error) {
    (void)userdata;
    (void)error;
    uint8_t type = 0;
    if (sd_bus_message_get_type(m, &type) >= 0 && type == SD_BUS_MESSAGE_METHOD_CALL) {
        sd_bus_close(sd_bus_message_get_bus(m));
        return 1;
    }
    return 0;
}

/* A direct (peer-to-peer) connection on the connected socket `fd` (bgtask_manager_connect),
 * attached to `event`. Takes `fd` (closed on failure too). */
static inline int bgtask_manager_bus_open(int fd, sd_event *event, sd_bus **out) {
    sd_bus *bus = NULL;
    int r = sd_bus_new(&bus);
    if (r < 0) { close(fd); return r; }
    r = sd_bus_set_fd(bus, fd, fd);
    if (r < 0) { close(fd); sd_bus_unref(bus); return r; }
    if (r >= 0) r = sd_bus_set_bus_client(bus, 0);
    if (r >= 0) r = sd_bus_add_filter(bus, NULL, bgtask_manager_filter, NULL);
    if (r >= 0) r = sd_bus_start(bus);
    if (r >= 0) r = sd_bus_attach_event(bus, event, 0);
    if (r < 0) { sd_bus_unref(bus); return r; }
    *out = bus;
    return 0;
}

/* logind, for bgtask-session: the path of the session `id` (NULL: the display session of the
 * user `uid`), into `path` (freed with free()). Returns 0 or -errno. */
#include <stdlib.h>
static inline int bgtask_logind_session_path(sd_bus *bus, const char *id, unsigned uid, char **path) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    const char *object = NULL;
    int r;
    if (id) {
        r = sd_bus_call_method(bus, "org.freedesktop.login1", "/org/freedesktop/login1",
                               "org.freedesktop.login1.Manager", "GetSession", &error, &reply, "s", id);
        if (r >= 0) r = sd_bus_message_read(reply, "o", &object);
    } else {
        const char *user = NULL;
        r = sd_bus_call_method(bus, "org.freedesktop.login1", "/org/freedesktop/login1",
                               "org.freedesktop.login1.Manager", "GetUser", &error, &reply, "u", uid);
        if (r >= 0) r = sd_bus_message_read(reply, "o", &user);
        char *copy = r >= 0 && user ? strdup(user) : NULL;
        sd_bus_message_unref(reply);
        reply = NULL;
        if (r >= 0 && !copy) r = -ENOMEM;
        if (r >= 0) {
            r = sd_bus_get_property(bus, "org.freedesktop.login1", copy, "org.freedesktop.login1.User", "Display",
                                    &error, &reply, "(so)");
            const char *session = NULL;
            if (r >= 0) r = sd_bus_message_read(reply, "(so)", &session, &object);
            if (r >= 0 && (!session || !session[0])) r = -ENXIO; /* no display session */
        }
        free(copy);
    }
    if (r >= 0) { *path = strdup(object); if (!*path) r = -ENOMEM; }
    sd_bus_message_unref(reply);
    sd_bus_error_free(&error);
    return r;
}

/* The session's LockedHint and Active, read now. Returns 0 or -errno. */
static inline int bgtask_logind_session_state(sd_bus *bus, const char *path, int *locked, int *active) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int r = sd_bus_get_property_trivial(bus, "org.freedesktop.login1", path, "org.freedesktop.login1.Session",
                                        "LockedHint", &error, 'b', locked);
    if (r >= 0) r = sd_bus_get_property_trivial(bus, "org.freedesktop.login1", path, "org.freedesktop.login1.Session",
                                                "Active", &error, 'b', active);
    sd_bus_error_free(&error);
    return r;
}

/* What a session's PropertiesChanged (`m`, unread) says of LockedHint and Active: the values it
 * carries (logind sends both with their values, EMITS_CHANGE) into `locked` and `active`, with
 * bit 1 set for LockedHint and bit 2 for Active; bit 4 if either is only named as invalidated
 * (its value then has to be read). 0 for another interface's. Returns the bits or -errno. */
static inline int bgtask_logind_changed(sd_bus_message *m, int *locked, int *active) {
    const char *interface = NULL, *name = NULL;
    int found = 0;
    int r = sd_bus_message_read(m, "s", &interface);
    if (r < 0) return r;
    if (strcmp(interface, "org.freedesktop.login1.Session") != 0) return 0;
    r = sd_bus_message_enter_container(m, 'a', "{sv}");
    while (r >= 0 && (r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
        r = sd_bus_message_read(m, "s", &name);
        int *into = r < 0 ? NULL : strcmp(name, "LockedHint") == 0 ? locked : strcmp(name, "Active") == 0 ? active : NULL;
        if (r >= 0) r = into ? sd_bus_message_read(m, "v", "b", into) : sd_bus_message_skip(m, "v");
        if (r >= 0 && into) found |= into == locked ? 1 : 2;
        if (r >= 0) r = sd_bus_message_exit_container(m);
    }
    if (r >= 0) r = sd_bus_message_exit_container(m);
    if (r >= 0) r = sd_bus_message_enter_container(m, 'a', "s");
    while (r >= 0 && (r = sd_bus_message_read(m, "s", &name)) > 0)
        if (strcmp(name, "LockedHint") == 0 || strcmp(name, "Active") == 0) found |= 4;
    return r < 0 ? r : found;
}

/* The unique name that owns `name` on the bus now (the bus's GetNameOwner), into `out`
 * (malloc'd, the caller frees it). Returns 0 or -errno (-ENXIO: no owner). */
static inline int bgtask_bus_name_owner(sd_bus *bus, const char *name, char **out) {
    sd_bus_creds *creds = NULL;
    const char *unique = NULL;
    int r = sd_bus_get_name_creds(bus, name, SD_BUS_CREDS_UNIQUE_NAME, &creds);
    if (r >= 0) r = sd_bus_creds_get_unique_name(creds, &unique);
    if (r >= 0) {
        *out = strdup(unique);
        if (!*out) r = -ENOMEM;
    }
    sd_bus_creds_unref(creds);
    return r;
}

/* Calls `callback` on every NameOwnerChanged the bus sends about `name` (read the new owner
 * with bgtask_bus_new_owner, which checks the sender). Returns 0 or -errno. */
static inline int bgtask_bus_watch_owner(sd_bus *bus, const char *name, sd_bus_message_handler_t callback, void *userdata) {
    char rule[256];
    int n = snprintf(rule, sizeof rule, "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
                     "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='%s'", name);
    if (n < 0 || (size_t)n >= sizeof rule) return -EINVAL;
    return sd_bus_add_match(bus, NULL, rule, callback, userdata);
}

/* The new owner a NameOwnerChanged (`m`) names ("" for none; owned by `m`), or NULL when
 * the bus itself did not send it: the bus stamps every client's message with the client's
 * unique name, so only its own carry the sender "org.freedesktop.DBus" — the match's sender
 * is not enough (see bgtask_logind_watch). */
static inline const char *bgtask_bus_new_owner(sd_bus_message *m) {
    const char *sender = sd_bus_message_get_sender(m), *name = NULL, *old_owner = NULL, *new_owner = NULL;
    if (!sender || strcmp(sender, "org.freedesktop.DBus") != 0) return NULL;
    if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return NULL;
    return new_owner;
}

/* Calls `callback` on every PropertiesChanged of the session at `path` (the match stays
 * across logind's restart). The match's sender is logind's well-known name, which the bus
 * applies to what it broadcasts; a signal addressed to this connection reaches it whoever
 * sent it, and sd-bus cannot tell a well-known sender from a unique name: the callback
 * compares the sender with logind's unique name (bgtask_bus_name_owner, then
 * bgtask_bus_watch_owner). Returns 0 or -errno. */
static inline int bgtask_logind_watch(sd_bus *bus, const char *path, sd_bus_message_handler_t callback, void *userdata) {
    return sd_bus_match_signal(bus, NULL, "org.freedesktop.login1", path, "org.freedesktop.DBus.Properties",
                               "PropertiesChanged", callback, userdata);
}

/* Asks logind for an inhibitor lock (Manager.Inhibit `what`, `who`, `why`, `mode`) on a
 * connection of its own to the system bus, attached to `event`: the answer goes to `callback`
 * on the event loop (read it with bgtask_logind_inhibitor); nothing waits. The lock is the
 * descriptor the answer carries, not the connection: the caller drops the connection once
 * answered. Returns 0 or -errno (no system bus: -ENOENT). */
static inline int bgtask_logind_inhibit(sd_event *event, const char *what, const char *who, const char *why,
                                        const char *mode, sd_bus_message_handler_t callback, void *userdata,
                                        sd_bus **out) {
    sd_bus *bus = NULL;
    int r = sd_bus_open_system(&bus);
    if (r < 0) return r;
    r = sd_bus_attach_event(bus, event, 0);
    if (r >= 0) r = sd_bus_call_method_async(bus, NULL, "org.freedesktop.login1", "/org/freedesktop/login1",
                                             "org.freedesktop.login1.Manager", "Inhibit", callback, userdata,
                                             "ssss", what, who, why, mode);
    if (r < 0) { sd_bus_flush_close_unref(bus); return r; }
    *out = bus;
    return 0;
}

/* logind's answer to Inhibit (`m`): the lock's descriptor, a close-on-exec copy of the one the
 * message owns, or -errno with the error's text in `why` (owned by `m`). */
static inline int bgtask_logind_inhibitor(sd_bus_message *m, const char **why) {
    const sd_bus_error *error = sd_bus_message_get_error(m);
    if (error && sd_bus_error_is_set(error)) {
        *why = error->message ? error->message : error->name;
        int e = sd_bus_error_get_errno(error);
        return -(e > 0 ? e : EACCES);
    }
    int fd = -1;
    int r = sd_bus_message_read(m, "h", &fd);
    if (r < 0) { *why = "an answer without a descriptor"; return r; }
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (copy < 0) { *why = "the descriptor could not be kept"; return -errno; }
    return copy;
}

/* Sends each of `count` buffers as one datagram on the connected socket `fd`, as many per
 * sendmmsg(2) as it takes (up to 64 at a time); returns how many went, or -1 if none did. */
static inline int bgtask_send_datagrams(int fd, const struct iovec *buffers, unsigned count) {
    struct { struct msghdr msg_hdr; unsigned int msg_len; } headers[64];  /* struct mmsghdr */
    unsigned sent = 0;
    while (sent < count) {
        unsigned batch = count - sent < 64 ? count - sent : 64;
        for (unsigned i = 0; i < batch; i++) {
            struct msghdr message = {0};
            message.msg_iov = (struct iovec *)&buffers[sent + i];
            message.msg_iovlen = 1;
            headers[i].msg_hdr = message;
            headers[i].msg_len = 0;
        }
        int n = syscall(SYS_sendmmsg, fd, headers, batch, MSG_NOSIGNAL);
        if (n <= 0) return sent > 0 ? (int)sent : -1;
        sent += (unsigned)n;
    }
    return (int)sent;
}

/* Names the calling thread (prctl(2) PR_SET_NAME: at most 15 bytes, the rest cut). */
#include <sys/prctl.h>
static inline void bgtask_name_thread(const char *name) { (void)prctl(PR_SET_NAME, name, 0, 0, 0); }

/* getdents64(2), which glibc 2.36 declares only under _GNU_SOURCE. */
static inline long bgtask_getdents64(int fd, void *buffer, unsigned long size) {
    return syscall(SYS_getdents64, fd, buffer, size);
}

/* PIDFD_GET_INFO (Linux 6.13, <linux/pidfd.h>; Debian 12's headers predate it): the
 * process's pid, parent and credentials from its pidfd, one ioctl instead of reading and
 * parsing /proc/PID/stat and status. The first 64 bytes of struct pidfd_info (its VER0). */
struct bgtask_pidfd_info {
    unsigned long long mask, cgroupid;
    unsigned int pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    int exit_code;
};
#include <sys/ioctl.h>
/* Returns 0, or -errno (ESRCH: the process has exited; ENOTTY/EINVAL: an older kernel). */
static inline int bgtask_pidfd_info(int pidfd, struct bgtask_pidfd_info *out) {
    memset(out, 0, sizeof *out);
    out->mask = 1 /* PIDFD_INFO_PID */ | 2 /* PIDFD_INFO_CREDS */;
    if (ioctl(pidfd, _IOWR(0xFF, 11, struct bgtask_pidfd_info), out) < 0) return -errno;
    return (out->mask & 3) == 3 ? 0 : -EINVAL;
}

#endif
