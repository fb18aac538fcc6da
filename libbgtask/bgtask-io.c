/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask: sockets, calls and the timer; the rules (bgtask-state.c) decide, this file
 * does. The caller's calls are a round trip each on their own connection, bounded by the
 * timeout; the library's own calls (the rules' outbox) go out on another without waiting,
 * their replies read when they come (bgtask_app_process). */
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

/* Reads what is there into `b`; 0 if more may come, -ECONNRESET at the end, -errno. A
 * read shorter than asked took all the socket held (a stream socket's read copies every
 * queued byte up to the size asked): no second read to hear EAGAIN, and the caller's wait
 * (poll, level-triggered epoll) says when more comes. */
int read_available(int fd, buffer *b) {
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n == 0) return -ECONNRESET;
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        if (b->length + (size_t)n > MAX_MESSAGE * 2) return -EMSGSIZE;
        if (buffer_append(b, chunk, (size_t)n) < 0) return -ENOMEM;
        if ((size_t)n < sizeof(chunk)) return 0;
    }
}

/* ---- The library's own calls ---- */

static int send_call(bgtask_app *app, const char *method, const char *parameters) {
    if (app->send_fd < 0) {
        int fd = connect_socket(app->socket_path);
        if (fd < 0) return fd;
        app->send_fd = fd;
        app->send_in.length = app->send_out.length = 0;
        int r = watch(app, fd, EPOLLIN, TOKEN_SEND, EPOLL_CTL_ADD);
        if (r < 0) { close_fd(app, &app->send_fd); return r; }
    }
    char frame[512];
    int n = snprintf(frame, sizeof(frame), "{\"method\":\"" BGTASK_INTERFACE_APP ".%s\",\"parameters\":%s}", method, parameters);
    if (n < 0 || (size_t)n >= sizeof(frame)) return -EINVAL;
    if (buffer_append(&app->send_out, frame, (size_t)n + 1) < 0) return -ENOMEM;  /* with its NUL */
    int r = flush_out(app->send_fd, &app->send_out);
    if (r < 0) { close_fd(app, &app->send_fd); return r; }
    return watch(app, app->send_fd, EPOLLIN | (app->send_out.length ? EPOLLOUT : 0), TOKEN_SEND, EPOLL_CTL_MOD);
}

/* Sends what the rules queued; an EndTask that cannot go out waits for bgtaskd's return. */
static void flush_outbox(bgtask_app *app) {
    for (size_t i = 0; i < app->n_outbox; i++) {
        out_call c = app->outbox[i];
        char parameters[64] = "{}";
        const char *method = BGTASK_METHOD_FINISH_BACKGROUND_TRANSITION;
        if (c.kind == OUT_FINISH_WAKE) method = BGTASK_METHOD_FINISH_WAKE;
        if (c.kind == OUT_END_TASK) {
            method = BGTASK_METHOD_END_TASK;
            snprintf(parameters, sizeof(parameters), "{\"taskId\":%llu}", (unsigned long long)c.id);
        }
        if (send_call(app, method, parameters) < 0 && c.kind == OUT_END_TASK) state_end_undelivered(app, c.id);
    }
    app->n_outbox = 0;
}

int append(char **buffer, size_t *length, size_t *capacity, const char *text) {
    return json_append_raw(buffer, length, capacity, text, strlen(text));
}

static int errno_of(const char *error) {
    static const struct { const char *name; int code; } table[] = {
        {BGTASK_ERROR_NO_BACKGROUND_TIME, ETIME},
        {BGTASK_ERROR_LIMIT_EXCEEDED, EDQUOT},
        {BGTASK_ERROR_NO_SUCH_TASK, ENOENT},
        {BGTASK_ERROR_STATE_NOT_WRITABLE, EAGAIN},
        {BGTASK_ERROR_INVALID_PARAMETER, EINVAL},
        {BGTASK_ERROR_PERMISSION_DENIED, EPERM},
        {BGTASK_ERROR_TOO_MANY_PENDING_TASK_REQUESTS, EBUSY},
        {BGTASK_ERROR_NO_SUCH_TASK_REQUEST, ENOENT},
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
    int r = append(&frame, &length, &capacity, "{\"method\":\"" BGTASK_INTERFACE_APP ".");
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

/* ---- The subscription and the timer ---- */

void lost(bgtask_app *app, uint64_t now) {
    close_fd(app, &app->subscription_fd);
    close_fd(app, &app->send_fd);
    if (app->call_fd >= 0) { close(app->call_fd); app->call_fd = -1; }
    app->subscription_in.length = 0;
    state_lost(app, now);
}

static void reconnect(bgtask_app *app, uint64_t now) {
    static const char subscribe[] = "{\"method\":\"" BGTASK_INTERFACE_APP "." BGTASK_METHOD_SUBSCRIBE "\",\"more\":true}";
    int fd = connect_socket(app->socket_path);
    if (fd >= 0 && send(fd, subscribe, sizeof(subscribe), MSG_NOSIGNAL) != (ssize_t)sizeof(subscribe)) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0 && watch(app, fd, EPOLLIN, TOKEN_SUBSCRIPTION, EPOLL_CTL_ADD) < 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        state_reconnect_failed(app, now);
        return;
    }
    app->subscription_fd = fd;
}

/* Sets the timer to the next deadline, unless it is set there already (`timer_armed`, 0 when
 * disarmed or fired and read): most calls change no deadline, and a call is then no
 * timerfd_settime. */
static void arm_timer(bgtask_app *app) {
    uint64_t next = next_deadline(app);
    if (next == app->timer_armed) return;
    app->timer_armed = next;
    struct itimerspec spec = {0};
    if (next) {
        spec.it_value.tv_sec = (time_t)(next / NSEC_PER_SEC);
        spec.it_value.tv_nsec = (long)(next % NSEC_PER_SEC);
        if (!spec.it_value.tv_sec && !spec.it_value.tv_nsec) spec.it_value.tv_nsec = 1;
    }
    timerfd_settime(app->timer_fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

void settle(bgtask_app *app, uint64_t now) {
    if (state_tick(app, now) && app->subscription_fd < 0) reconnect(app, now);
    flush_outbox(app);
    arm_timer(app);
}

/* Splits the subscription's bytes into messages and applies them in order. */
void read_subscription(bgtask_app *app, uint64_t now) {
    int r = read_available(app->subscription_fd, &app->subscription_in);
    size_t start = 0;
    while (app->subscription_fd >= 0) {
        char *nul = memchr(app->subscription_in.data + start, 0, app->subscription_in.length - start);
        if (!nul) break;
        json_value message;
        size_t length = (size_t)(nul - (app->subscription_in.data + start));
        if (json_parse(app->subscription_in.data + start, length, &message) < 0) {
            lost(app, now);
            return;
        }
        start += length + 1;
        int r = state_receive(app, &message, now);
        json_free(&message);
        if (r < 0) {
            lost(app, now);
            return;
        }
    }
    if (app->subscription_fd >= 0) {
        buffer_consume(&app->subscription_in, start);
        if (r < 0 || app->subscription_in.length > MAX_MESSAGE) lost(app, now);
    }
}

/* Replies to the library's own calls: nothing to do with them but read them. */
void read_send_replies(bgtask_app *app) {
    int r = read_available(app->send_fd, &app->send_in);
    char *nul;
    while ((nul = memchr(app->send_in.data, 0, app->send_in.length)))
        buffer_consume(&app->send_in, (size_t)(nul - app->send_in.data) + 1);
    if (r < 0) close_fd(app, &app->send_fd);
}

