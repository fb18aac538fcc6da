/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask: sockets and calls. The caller's calls are a round trip each on their
 * own connection, bounded by the timeout; the library's own calls go out on another without
 * waiting, their replies read when they come (bgtask_app_process). */
#define _GNU_SOURCE
#include "bgtask-internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * NSEC_PER_SEC + (uint64_t)t.tv_nsec;
}

void close_fd(bgtask_app *app, int *fd) {
    if (*fd < 0) return;
    epoll_ctl(app->epoll_fd, EPOLL_CTL_DEL, *fd, NULL);
    close(*fd);
    *fd = -1;
}

int watch(bgtask_app *app, int fd, uint32_t events, uint64_t token, int op) {
    struct epoll_event event = {.events = events, .data.u64 = token};
    return epoll_ctl(app->epoll_fd, op, fd, &event) < 0 ? -errno : 0;
}

int connect_socket(const char *path) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(address.sun_path)) return -ENAMETOOLONG;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int buffer_append(buffer *b, const char *data, size_t n) {
    return json_append_raw(&b->data, &b->length, &b->capacity, data, n);
}

void buffer_consume(buffer *b, size_t n) {
    memmove(b->data, b->data + n, b->length - n);
    b->length -= n;
}

/* Writes what the socket takes now; -errno if it is broken. */
int flush_out(int fd, buffer *b) {
    while (b->length > 0) {
        ssize_t n = send(fd, b->data, b->length, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        buffer_consume(b, (size_t)n);
    }
    return 0;
}

/* Reads what is there into `b`; 0 if more may come, -ECONNRESET at the end, -errno. */
int read_available(int fd, buffer *b) {
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n == 0) return -ECONNRESET;
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        if (b->length + (size_t)n > MAX_MESSAGE * 2) return -EMSGSIZE;
        if (buffer_append(b, chunk, (size_t)n) < 0) return -ENOMEM;
    }
}

/* ---- The library's own calls ---- */

int send_call(bgtask_app *app, const char *method, const char *parameters) {
    if (app->send_fd < 0) {
        int fd = connect_socket(app->socket_path);
        if (fd < 0) return fd;
        app->send_fd = fd;
        app->send_in.length = app->send_out.length = 0;
        int r = watch(app, fd, EPOLLIN, TOKEN_SEND, EPOLL_CTL_ADD);
        if (r < 0) { close_fd(app, &app->send_fd); return r; }
    }
    char frame[512];
    int n = snprintf(frame, sizeof(frame), "{\"method\":\"io.bgtaskd.App.%s\",\"parameters\":%s}", method, parameters);
    if (n < 0 || (size_t)n >= sizeof(frame)) return -EINVAL;
    if (buffer_append(&app->send_out, frame, (size_t)n + 1) < 0) return -ENOMEM;  /* with its NUL */
    int r = flush_out(app->send_fd, &app->send_out);
    if (r < 0) { close_fd(app, &app->send_fd); return r; }
    return watch(app, app->send_fd, EPOLLIN | (app->send_out.length ? EPOLLOUT : 0), TOKEN_SEND, EPOLL_CTL_MOD);
}

void send_end(bgtask_app *app, uint64_t id) {
    char parameters[64];
    snprintf(parameters, sizeof(parameters), "{\"taskId\":%llu}", (unsigned long long)id);
    if (send_call(app, "EndTask", parameters) < 0 && app->n_pending_ends < MAX_PENDING_ENDS)
        app->pending_ends[app->n_pending_ends++] = id;
}

int append(char **buffer, size_t *length, size_t *capacity, const char *text) {
    return json_append_raw(buffer, length, capacity, text, strlen(text));
}

static int errno_of(const char *error) {
    static const struct { const char *name; int code; } table[] = {
        {"io.bgtaskd.App.NoBackgroundTime", ETIME},
        {"io.bgtaskd.App.LimitExceeded", EDQUOT},
        {"io.bgtaskd.App.NoSuchTask", ENOENT},
        {"io.bgtaskd.App.StateNotWritable", EAGAIN},
        {"org.varlink.service.InvalidParameter", EINVAL},
        {"org.varlink.service.PermissionDenied", EPERM},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(error, table[i].name) == 0) return -table[i].code;
    return -EPROTO;
}

/* One call on the call connection, waiting for its reply at most the timeout. On success
 * the reply's parameters are in *parameters (to be freed with json_free on *reply). */
int call(bgtask_app *app, const char *method, const char *parameters, json_value *reply) {
    app->last_error[0] = 0;
    if (!app->connected) return -ENOTCONN;
    if (app->call_fd < 0) {
        int fd = connect_socket(app->socket_path);
        if (fd < 0) return fd;
        app->call_fd = fd;
    }
    char *frame = NULL;
    size_t length = 0, capacity = 0;
    int r = append(&frame, &length, &capacity, "{\"method\":\"io.bgtaskd.App.");
    if (r == 0) r = append(&frame, &length, &capacity, method);
    if (r == 0) r = append(&frame, &length, &capacity, "\",\"parameters\":");
    if (r == 0) r = append(&frame, &length, &capacity, parameters);
    if (r == 0) r = append(&frame, &length, &capacity, "}");  /* sent with its NUL: json_append_raw keeps one */
    if (r < 0) { free(frame); return r; }
    uint64_t deadline = now_ns() + app->timeout_usec * 1000;
    buffer in = {0};
    for (size_t sent = 0; r == 0 && sent < length + 1;) {
        ssize_t n = send(app->call_fd, frame + sent, length + 1 - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
        } else if (errno == EAGAIN) {  /* the daemon is not reading yet: wait, within the bound */
            uint64_t now = now_ns();
            struct pollfd p = {app->call_fd, POLLOUT, 0};
            if (now >= deadline) r = -ETIMEDOUT;
            else if (poll(&p, 1, (int)((deadline - now) / NSEC_PER_MSEC) + 1) < 0 && errno != EINTR) r = -errno;
        } else if (errno != EINTR) {
            r = -errno;
        }
    }
    free(frame);
    char *nul = NULL;
    while (r == 0 && !nul) {
        uint64_t now = now_ns();
        if (now >= deadline) { r = -ETIMEDOUT; break; }
        struct pollfd p = {app->call_fd, POLLIN, 0};
        int ready = poll(&p, 1, (int)((deadline - now) / NSEC_PER_MSEC) + 1);
        if (ready < 0 && errno != EINTR) r = -errno;
        if (ready <= 0) continue;
        r = read_available(app->call_fd, &in);
        if (in.length) nul = memchr(in.data, 0, in.length);
        if (r == -ECONNRESET && nul) r = 0;  /* the whole reply, then the end: the reply counts */
        /* else the end came mid-reply: an error now, not a spin on a readable EOF */
        if (r == 0 && !nul && in.length > MAX_MESSAGE) r = -EMSGSIZE;
    }
    if (r == 0) r = json_parse(in.data, (size_t)(nul - in.data), reply);
    if (r == 0 && nul + 1 != in.data + in.length) {  /* more than one reply: out of step */
        json_free(reply);
        r = -EPROTO;
    }
    free(in.data);
    if (r < 0) {
        close(app->call_fd);  /* broken or out of step: start afresh next time */
        app->call_fd = -1;
        return r;
    }
    const char *error;
    if (json_get_string(reply, "error", &error)) {
        snprintf(app->last_error, sizeof(app->last_error), "%s", error);
        int code = errno_of(error);  /* before the reply, which holds `error`, is freed */
        json_free(reply);
        return code;
    }
    return 0;
}

