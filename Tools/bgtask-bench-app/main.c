/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bgtask-bench-app: the smallest possible app, for the benchmark's 10,000 apps.
 *
 *   bgtask-bench-app [--cgroup DIR] SOCKET TASKS [subscribe|hold|requests]
 *   bgtask-bench-app --signal SIGNAL PIDFILE
 *   bgtask-bench-app --freeze 0|1 CGROUPFILE
 *   bgtask-bench-app --freeze-opening 0|1 CGROUPFILE
 *   bgtask-bench-app --deadline-floor SOCKET COUNT
 *
 * Begins TASKS background tasks (pipelined BeginTask calls, no "more", so they outlive the
 * connection), closes that connection, optionally keeps a Subscribe stream open (and never
 * finishes a transition), writes "ok PID\n" to stdout, then waits for stdin to close and
 * exits. With "hold" it also begins one task with "more" and keeps its stream: the moment
 * the task is expiring it closes the stream, ending the task, as an expiration handler
 * does. Written in C so that 10,000 of them fit in little memory.
 *
 * --signal is the baseline of the burst benchmarks: it opens a pidfd for every pid in
 * PIDFILE, writes "ready\n", waits for a byte on stdin, then sends SIGNAL through each.
 * --freeze is the freezer bursts' baseline: the same with each cgroup directory of
 * CGROUPFILE's cgroup.freeze, written 1 or 0; --freeze-opening opens, writes and closes each
 * file in the timed loop (what a daemon must do that keeps no descriptor per app). With --cgroup the app first moves itself into
 * DIR (a unit app's cgroup of its own, for the freezer bursts).
 *
 * --deadline-floor is the deadline burst's floor: a daemon that costs nothing but its system
 * calls. It listens on SOCKET, answers the held BeginTask of COUNT "hold" apps, takes each
 * one's pidfd (SO_PEERPIDFD), then takes one more connection, a monitor (the bench's, as
 * on the daemon), writes "ready\n", waits for a byte on stdin, then does what the daemon
 * must when their deadlines fall together: writes each stream its "expiring" event, and
 * after each 16 (the daemon's slice) one write of their 16 events to the monitor (made
 * beforehand); then as each app ends its task (closes the stream) closes its end and stops
 * the app through its pidfd.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

static int connect_to(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (fd < 0 || strlen(path) >= sizeof(address.sun_path)) return -1;
    strcpy(address.sun_path, path);
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) return -1;
    return fd;
}

static int write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n <= 0) return -1;
        data += n;
        length -= (size_t)n;
    }
    return 0;
}

/* Reads until `count` NUL-terminated replies arrived; fails on an error reply. */
static int read_replies(int fd, int count) {
    char buffer[4096];
    int seen = 0;
    while (seen < count) {
        ssize_t n = read(fd, buffer, sizeof(buffer));
        if (n <= 0) return -1;
        for (ssize_t i = 0; i < n; i++) seen += buffer[i] == 0;
        if (memmem(buffer, (size_t)n, "\"error\"", 7)) return -1;
    }
    return 0;
}

/* The baseline: a plain loop of pidfd_send_signal over pidfds opened beforehand. */
static int signal_all(int signal, const char *path) {
    FILE *file = fopen(path, "re");
    if (!file) { perror("fopen"); return 1; }
    static int pidfds[65536];
    int count = 0, pid;
    while (count < 65536 && fscanf(file, "%d", &pid) == 1) {
        if (pid <= 1) continue;  /* never pid 1, 0 or -1 */
        int fd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (fd < 0) { perror("pidfd_open"); return 1; }
        pidfds[count++] = fd;
    }
    fclose(file);
    write_all(1, "ready\n", 6);
    char go;
    if (read(0, &go, 1) != 1) return 1;
    for (int i = 0; i < count; i++) syscall(SYS_pidfd_send_signal, pidfds[i], signal, NULL, 0);
    return 0;
}

/* The freezer baseline: a plain loop of writes to cgroup.freeze files opened beforehand, or
 * (opening) each file opened, written and closed in the loop, as a daemon that cannot keep a
 * descriptor per app must. */
static int freeze_all(const char *value, const char *path, int opening) {
    FILE *file = fopen(path, "re");
    if (!file) { perror("fopen"); return 1; }
    static int fds[65536];
    static char *names[65536];
    static char directory[4096], name[4200];
    int count = 0;
    while (count < 65536 && fscanf(file, "%4095s", directory) == 1) {
        snprintf(name, sizeof(name), "%s/cgroup.freeze", directory);
        if (opening) {
            if (!(names[count++] = strdup(name))) { perror("strdup"); return 1; }
            continue;
        }
        int fd = open(name, O_WRONLY | O_CLOEXEC);
        if (fd < 0) { perror(name); return 1; }
        fds[count++] = fd;
    }
    fclose(file);
    write_all(1, "ready\n", 6);
    char go;
    if (read(0, &go, 1) != 1) return 1;
    for (int i = 0; i < count; i++) {
        int fd = opening ? open(names[i], O_WRONLY | O_CLOEXEC) : fds[i];
        if (fd < 0) { perror(names[i]); return 1; }
        if (write(fd, value, 1) != 1) { perror("write cgroup.freeze"); return 1; }
        if (opening) close(fd);
    }
    return 0;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

static int deadline_floor(const char *path, int count) {
    static int sockets[32768], pidfds[32768], pids[32768];
    if (count < 1 || count > 32768) return 2;
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (listener < 0 || strlen(path) >= sizeof(address.sun_path)) return 1;
    strcpy(address.sun_path, path);
    unlink(path);
    if (bind(listener, (struct sockaddr *)&address, sizeof(address)) < 0 || listen(listener, 4096) < 0) {
        perror("listen");
        return 1;
    }
    static const char granted[] = "{\"continues\":true,\"parameters\":{\"state\":\"running\",\"taskId\":1}}";
    for (int i = 0; i < count;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) { perror("accept"); return 1; }
        char buffer[4096];
        ssize_t n;
        while ((n = read(fd, buffer, sizeof(buffer))) > 0 && !memchr(buffer, 0, (size_t)n)) {}
        if (n == 0) { close(fd); continue; }  /* an app's first connection, for its TASKS (0) tasks */
        socklen_t length = sizeof(int);
        if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfds[i], &length) < 0 ||
            write_all(fd, granted, sizeof(granted)) < 0) {
            perror("the held BeginTask");
            return 1;
        }
        struct ucred peer;
        length = sizeof(peer);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) < 0) { perror("SO_PEERCRED"); return 1; }
        pids[i] = peer.pid;
        sockets[i++] = fd;
    }
    /* The monitor: its call read, its events made now, each app's right after the one before. */
    int monitor = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    char call[4096];
    ssize_t got;
    while (monitor >= 0 && (got = read(monitor, call, sizeof(call))) > 0 && !memchr(call, 0, (size_t)got)) {}
    if (monitor < 0) { perror("the monitor"); return 1; }
    static char events[32768 * 112];
    static size_t ends[32768];
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        used += (size_t)snprintf(events + used, sizeof(events) - used, "{\"continues\":true,\"parameters\":{\"event\":"
                                 "\"taskChanged\",\"task\":{\"appPid\":%d,\"state\":\"expiring\"}}}", pids[i]) + 1;
        ends[i] = used;
    }
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < count; i++) {
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(epoll, EPOLL_CTL_ADD, sockets[i], &event) < 0) { perror("epoll_ctl"); return 1; }
    }
    write_all(1, "ready\n", 6);
    char go;
    if (read(0, &go, 1) != 1) return 1;
    static const char expiring[] = "{\"continues\":true,\"parameters\":{\"state\":\"expiring\",\"taskId\":1}}";
    for (int i = 0, sent = 0; i < count; i++) {
        write_all(sockets[i], expiring, sizeof(expiring));
        if ((i + 1) % 16 == 0 || i + 1 == count) {
            size_t from = sent > 0 ? ends[sent - 1] : 0;
            write_all(monitor, events + from, ends[i] - from);
            sent = i + 1;
        }
    }
    static struct epoll_event ready[1024];
    for (int stopped = 0; stopped < count;) {
        int n = epoll_wait(epoll, ready, 1024, -1);
        for (int k = 0; k < n; k++) {
            int i = (int)ready[k].data.u32;
            char buffer[256];
            if (read(sockets[i], buffer, sizeof(buffer)) > 0) continue;  /* not the end yet */
            close(sockets[i]);  /* leaves the epoll set with its last reference */
            syscall(SYS_pidfd_send_signal, pidfds[i], SIGSTOP, NULL, 0);
            stopped++;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--signal") == 0) return signal_all(atoi(argv[2]), argv[3]);
    if (argc == 4 && strcmp(argv[1], "--freeze") == 0) return freeze_all(argv[2], argv[3], 0);
    if (argc == 4 && strcmp(argv[1], "--freeze-opening") == 0) return freeze_all(argv[2], argv[3], 1);
    if (argc == 4 && strcmp(argv[1], "--deadline-floor") == 0) return deadline_floor(argv[2], atoi(argv[3]));
    if (argc > 2 && strcmp(argv[1], "--cgroup") == 0) {
        char procs[4200];
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", argv[2]);
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write_all(fd, "0", 1) < 0) { perror(procs); return 1; }  /* "0": the writer itself */
        close(fd);
        argc -= 2;
        argv += 2;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: bgtask-bench-app [--cgroup DIR] SOCKET TASKS [subscribe|hold|requests]\n"
                        "       bgtask-bench-app --signal SIGNAL PIDFILE\n       bgtask-bench-app --freeze[-opening] 0|1 CGROUPFILE\n"
                        "       bgtask-bench-app --deadline-floor SOCKET COUNT\n");
        return 2;
    }
    int tasks = atoi(argv[2]);
    int fd = connect_to(argv[1]);
    if (fd < 0) { perror("connect"); return 1; }
    static const char call[] =
        "{\"method\":\"io.bgtaskd.App.BeginTask\",\"parameters\":{\"name\":\"bench\",\"expirationHandler\":true}}";
    for (int i = 0; i < tasks; i++) {
        if (write_all(fd, call, sizeof(call)) < 0) { perror("write"); return 1; }  /* sizeof includes the NUL */
    }
    if (read_replies(fd, tasks) < 0) { fprintf(stderr, "BeginTask failed\n"); return 1; }
    close(fd);
    int subscription = -1;
    if (argc > 3 && strcmp(argv[3], "subscribe") == 0) {
        static const char subscribe[] = "{\"method\":\"io.bgtaskd.App.Subscribe\",\"more\":true}";
        subscription = connect_to(argv[1]);
        if (subscription < 0 || write_all(subscription, subscribe, sizeof(subscribe)) < 0 ||
            read_replies(subscription, 1) < 0) { fprintf(stderr, "Subscribe failed\n"); return 1; }
    }
    if (argc > 3 && strcmp(argv[3], "requests") == 0) {
        /* 1 refresh and 9 processing requests, due in a day: pending, and nothing to do. */
        int calls = connect_to(argv[1]);
        for (int i = 0; i < 10 && calls >= 0; i++) {
            char request[256];
            int n = snprintf(request, sizeof(request),
                             "{\"method\":\"io.bgtaskd.App.SubmitTaskRequest\",\"parameters\":{\"identifier\":\"bench.%d\","
                             "\"kind\":\"%s\",\"earliestBeginDate\":86400}}", i, i == 0 ? "refresh" : "processing");
            if (write_all(calls, request, (size_t)n + 1) < 0) calls = -1;
        }
        if (calls < 0 || read_replies(calls, 10) < 0) { fprintf(stderr, "SubmitTaskRequest failed\n"); return 1; }
        close(calls);
    }
    int held = -1;
    if (argc > 3 && strcmp(argv[3], "hold") == 0) {
        static const char begin[] =
            "{\"method\":\"io.bgtaskd.App.BeginTask\",\"parameters\":{\"name\":\"held\",\"expirationHandler\":true},\"more\":true}";
        held = connect_to(argv[1]);
        if (held < 0 || write_all(held, begin, sizeof(begin)) < 0 || read_replies(held, 1) < 0) {
            fprintf(stderr, "BeginTask (held) failed\n");
            return 1;
        }
    }
    char line[32];
    int length = snprintf(line, sizeof(line), "ok %d\n", (int)getpid());
    write_all(1, line, (size_t)length);
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = held, .events = POLLIN}};
    for (;;) {
        if (poll(fds, held >= 0 ? 2 : 1, -1) < 0) continue;  /* EINTR: stopped and continued */
        char buffer[4096];
        if (fds[0].revents) {
            if (read(0, buffer, sizeof(buffer)) <= 0) return 0;
        }
        if (held >= 0 && fds[1].revents) {
            ssize_t n = read(held, buffer, sizeof(buffer));
            /* The expiration handler: end the task (close its stream), nothing else. */
            if (n <= 0 || memmem(buffer, (size_t)n, "\"expiring\"", 10)) {
                close(held);
                held = -1;
            }
        }
    }
}
