/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libbgtask: the app's side of bgtaskd in C. The same rules as the Swift library
 * (Sources/BGTaskClient/ClientState.swift): a task's handler runs exactly once with a
 * reason, unless the task was ended first; the transition is finished once the tasks begun
 * in it are granted; when bgtaskd goes away the library reconnects, and the tasks it still
 * holds on its return go on, while the others' handlers run with DAEMON_UNAVAILABLE after a
 * grace of 3 s.
 *
 * Three connections, as in the Swift library: the subscription (events, read from
 * bgtask_app_process), one for the caller's calls (a blocking round trip each, bounded by
 * a timeout), and one for the library's own calls (FinishBackgroundTransition, FinishWake,
 * EndTask left over from an outage), written without waiting, their replies read when they
 * come. All of them, and a timerfd for the library's deadlines, sit in one epoll instance:
 * the descriptor the caller polls.
 */
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

/* ---- The public API ---- */

EXPORT int bgtask_app_process(bgtask_app *app) {
    if (!app) return -EINVAL;
    bgtask_app_ref(app);  /* a handler may drop the caller's reference */
    struct epoll_event events[8];
    int n = epoll_wait(app->epoll_fd, events, 8, 0);
    int result = n < 0 && errno != EINTR ? -errno : 0;
    for (int i = 0; i < n; i++) {
        uint64_t now = now_ns();
        switch (events[i].data.u64) {
        case TOKEN_TIMER: {
            uint64_t expirations;
            (void)!read(app->timer_fd, &expirations, sizeof(expirations));
            app->timer_armed = 0;  /* it fired: the next settle sets it again */
            break;
        }
        case TOKEN_SUBSCRIPTION:
            if (app->subscription_fd >= 0) read_subscription(app, now);
            break;
        case TOKEN_SEND:
            if (app->send_fd < 0) break;
            if (events[i].events & EPOLLOUT && flush_out(app->send_fd, &app->send_out) < 0) {
                close_fd(app, &app->send_fd);
                break;
            }
            read_send_replies(app);
            if (app->send_fd >= 0 && !app->send_out.length) watch(app, app->send_fd, EPOLLIN, TOKEN_SEND, EPOLL_CTL_MOD);
            break;
        }
        run_expiries(app);
    }
    settle(app, now_ns());
    run_expiries(app);
    settle(app, now_ns());  /* what the handlers did */
    bgtask_app_unref(app);
    return result;
}

/* A connection to the daemon at path where it runs as this process's user or root, else -1:
 * an inherited $XDG_RUNTIME_DIR (sudo -E, su without -) names another user's directory. */
static int connect_own_daemon(const char *path) {
    int fd = connect_socket(path);
    if (fd < 0) return -1;
    struct ucred peer;
    socklen_t length = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 &&
        (peer.uid == 0 || peer.uid == getuid() || peer.uid == geteuid()))
        return fd;
    close(fd);
    return -1;
}

/* The per-user daemon's socket: $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd, else
 * /run/user/UID/bgtaskd/io.bgtaskd (as DaemonSocket.userPath in the Swift library). */
static char *user_socket_path(void) {
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    char *path = NULL;
    int n = runtime && *runtime ? asprintf(&path, "%s/bgtaskd/io.bgtaskd", runtime)
                                : asprintf(&path, "/run/user/%u/bgtaskd/io.bgtaskd", (unsigned)getuid());
    return n < 0 ? NULL : path;
}

EXPORT int bgtask_app_new(bgtask_app **ret, const char *socket_path) {
    if (!ret) return -EINVAL;
    bgtask_app *app = calloc(1, sizeof(*app));
    if (!app) return -ENOMEM;
    app->n_ref = 1;
    app->subscription_fd = app->call_fd = app->send_fd = -1;
    app->timeout_usec = 5000000;
    app->reconnect_delay = RECONNECT_FIRST;
    /* The socket: the caller's, else $BGTASKD_SOCKET, else the per-user daemon's where one
     * answers as this user or root (the connection is the subscription's), else the system
     * daemon's. */
    const char *path = socket_path ? socket_path : getenv("BGTASKD_SOCKET");
    int fd = -1;
    if (path && *path) {
        app->socket_path = strdup(path);
    } else if ((app->socket_path = user_socket_path()) && (fd = connect_own_daemon(app->socket_path)) < 0) {
        free(app->socket_path);
        app->socket_path = strdup(SYSTEM_SOCKET);
    }
    app->pending_ends = calloc(MAX_PENDING_ENDS, sizeof(uint64_t));
    app->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    app->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    app->subscription_fd = fd;
    int r = -ENOMEM;
    if (!app->socket_path || !app->pending_ends) goto fail;
    r = app->epoll_fd < 0 || app->timer_fd < 0 ? -errno : watch(app, app->timer_fd, EPOLLIN, TOKEN_TIMER, EPOLL_CTL_ADD);
    if (r < 0) goto fail;
    /* Subscribed before returning, so the first call finds the app known. */
    static const char subscribe[] = "{\"method\":\"" BGTASK_INTERFACE_APP "." BGTASK_METHOD_SUBSCRIBE "\",\"more\":true}";
    if (fd < 0) fd = connect_socket(app->socket_path);
    if (fd < 0) { r = fd; goto fail; }
    app->subscription_fd = fd;
    if (send(fd, subscribe, sizeof(subscribe), MSG_NOSIGNAL) != (ssize_t)sizeof(subscribe)) { r = -errno; goto fail; }
    uint64_t deadline = now_ns() + app->timeout_usec * 1000;
    while (!app->connected) {
        uint64_t now = now_ns();
        if (now >= deadline) { r = -ETIMEDOUT; goto fail; }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)((deadline - now) / NSEC_PER_MSEC) + 1) < 0 && errno != EINTR) { r = -errno; goto fail; }
        read_subscription(app, now_ns());
        if (app->subscription_fd < 0) { r = -ECONNRESET; goto fail; }
    }
    r = watch(app, fd, EPOLLIN, TOKEN_SUBSCRIPTION, EPOLL_CTL_ADD);
    if (r < 0) goto fail;
    *ret = app;
    return 0;
fail:
    app->n_ref = 1;
    bgtask_app_unref(app);
    return r;
}

EXPORT bgtask_app *bgtask_app_ref(bgtask_app *app) {
    if (app) app->n_ref++;
    return app;
}

EXPORT bgtask_app *bgtask_app_unref(bgtask_app *app) {
    if (!app || --app->n_ref > 0) return NULL;
    if (app->subscription_fd >= 0) close(app->subscription_fd);
    if (app->call_fd >= 0) close(app->call_fd);
    if (app->send_fd >= 0) close(app->send_fd);
    if (app->timer_fd >= 0) close(app->timer_fd);
    if (app->epoll_fd >= 0) close(app->epoll_fd);
    for (size_t i = 0; i < app->n_expiries; i++) free(app->expiries[i].detail);
    free(app->expiries);
    free(app->outbox);
    free(app->subscription_in.data);
    free(app->send_in.data);
    free(app->send_out.data);
    for (size_t i = 0; i < app->n_tasks; i++) free(app->tasks[i].launch);
    free(app->tasks);
    free(app->pending_ends);
    free(app->socket_path);
    free(app);
    return NULL;
}

EXPORT int bgtask_app_set_handlers(bgtask_app *app, bgtask_lifecycle_handler_t did_enter_background,
                                   bgtask_lifecycle_handler_t will_enter_foreground, void *userdata) {
    if (!app) return -EINVAL;
    app->did_enter_background = did_enter_background;
    app->will_enter_foreground = will_enter_foreground;
    app->lifecycle_userdata = userdata;
    return 0;
}

EXPORT int bgtask_app_set_wake_handler(bgtask_app *app, bgtask_wake_handler_t did_wake, void *userdata) {
    if (!app) return -EINVAL;
    app->did_wake = did_wake;
    app->wake_userdata = userdata;
    return 0;
}

EXPORT int bgtask_app_set_timeout(bgtask_app *app, uint64_t usec) {
    if (!app || usec == 0) return -EINVAL;
    app->timeout_usec = usec;
    return 0;
}

EXPORT int bgtask_app_get_fd(bgtask_app *app) { return app ? app->epoll_fd : -EINVAL; }
EXPORT int bgtask_app_get_state(bgtask_app *app) { return app ? (int)app->state : -EINVAL; }
EXPORT int bgtask_app_is_connected(bgtask_app *app) { return app ? app->connected : -EINVAL; }
EXPORT const char *bgtask_app_get_error(bgtask_app *app) { return app && app->last_error[0] ? app->last_error : NULL; }

EXPORT int bgtask_begin(bgtask_app *app, const char *name, bgtask_expiration_handler_t expiration, void *userdata,
                        uint64_t *ret_id) {
    if (!app || !ret_id) return -EINVAL;
    char *parameters = NULL;
    size_t length = 0, capacity = 0;
    int r = append(&parameters, &length, &capacity, "{\"name\":");
    if (r == 0) r = json_append_string(&parameters, &length, &capacity, name ? name : "");
    if (r == 0) r = append(&parameters, &length, &capacity, expiration ? ",\"expirationHandler\":true}" : ",\"expirationHandler\":false}");
    if (r < 0) { free(parameters); return r; }
    json_value reply;
    r = call(app, BGTASK_METHOD_BEGIN_TASK, parameters, &reply);
    free(parameters);
    if (r < 0) return r;
    uint64_t id = 0;
    const char *state = "pending";
    bool ok = json_get_id(json_get(&reply, "parameters"), "taskId", &id);
    json_get_string(json_get(&reply, "parameters"), "state", &state);
    bool granted = strcmp(state, "granted") == 0;
    json_free(&reply);
    if (!ok) return -EPROTO;
    r = state_begun(app, id, granted, expiration, userdata);
    if (r < 0) return r;
    *ret_id = id;
    return 0;
}

EXPORT int bgtask_end(bgtask_app *app, uint64_t id) {
    if (!app) return -EINVAL;
    int send = state_end(app, id);
    if (send < 0) return send;
    if (send) {
        char parameters[64];
        snprintf(parameters, sizeof(parameters), "{\"taskId\":%llu}", (unsigned long long)id);
        json_value reply;
        int r = call(app, BGTASK_METHOD_END_TASK, parameters, &reply);
        if (r == 0) {
            json_free(&reply);
        } else if (r == -ENOTCONN || r == -ETIMEDOUT || r == -ECONNRESET || r == -ECONNREFUSED || r == -EPIPE) {
            state_end_undelivered(app, id);  /* once it is back */
        }
        /* -ENOENT: bgtaskd ended it meanwhile (expired, or the app left the background). */
    }
    settle(app, now_ns());  /* the transition may have been waiting on it */
    return 0;
}

EXPORT int bgtask_time_remaining(bgtask_app *app, double *ret_seconds) {
    if (!app || !ret_seconds) return -EINVAL;
    *ret_seconds = state_time_remaining(app, now_ns());
    return 0;
}

EXPORT int bgtask_finish_transition(bgtask_app *app) {
    if (!app) return -EINVAL;
    if (!state_finish_transition(app)) return 0;
    settle(app, now_ns());
    return 1;
}

/* ---- Scheduled work ---- */

EXPORT int bgtask_app_set_launch_handler(bgtask_app *app, bgtask_launch_handler_t launch,
                                         bgtask_expiration_handler_t expiration, void *userdata) {
    if (!app) return -EINVAL;
    app->did_launch = launch;
    app->launch_expired = expiration;
    app->launch_userdata = userdata;
    return 0;
}

/* A call with no reply to keep. */
static int call_only(bgtask_app *app, const char *method, const char *parameters) {
    json_value reply;
    int r = call(app, method, parameters, &reply);
    if (r == 0) json_free(&reply);
    return r;
}

/* {"identifier":"...", with more fields appended by the caller. */
static char *identifier_parameters(const char *identifier, size_t *length, size_t *capacity) {
    char *text = NULL;
    *length = *capacity = 0;
    if (append(&text, length, capacity, "{\"identifier\":") < 0 || json_append_string(&text, length, capacity, identifier) < 0) {
        free(text);
        return NULL;
    }
    return text;
}

EXPORT int bgtask_submit(bgtask_app *app, const char *identifier, bgtask_request_kind kind, double earliest_begin,
                         unsigned flags, double interval) {
    if (!app || !identifier || (kind != BGTASK_REQUEST_REFRESH && kind != BGTASK_REQUEST_PROCESSING)) return -EINVAL;
    if (!(earliest_begin >= 0 && earliest_begin <= 366 * 86400.0) || !(interval >= 0 && interval <= 366 * 86400.0)) return -EINVAL;
    size_t length, capacity;
    char *parameters = identifier_parameters(identifier, &length, &capacity);
    if (!parameters) return -ENOMEM;
    char rest[256];
    /* Whole milliseconds: no locale can change how an integer is written. */
    int n = snprintf(rest, sizeof(rest), ",\"kind\":\"%s\",\"earliestBeginDate\":%llu.%03llu,\"requiresExternalPower\":%s,"
                     "\"requiresNetworkConnectivity\":%s",
                     kind == BGTASK_REQUEST_PROCESSING ? "processing" : "refresh",
                     (unsigned long long)(earliest_begin * 1000) / 1000, (unsigned long long)(earliest_begin * 1000) % 1000,
                     flags & BGTASK_REQUIRES_EXTERNAL_POWER ? "true" : "false", flags & BGTASK_REQUIRES_NETWORK ? "true" : "false");
    if (n > 0 && interval > 0)
        n += snprintf(rest + n, sizeof(rest) - (size_t)n, ",\"interval\":%llu", (unsigned long long)interval);
    int r = n > 0 && (size_t)n < sizeof(rest) - 2 ? append(&parameters, &length, &capacity, rest) : -EINVAL;
    if (r == 0) r = append(&parameters, &length, &capacity, "}");
    if (r == 0) r = call_only(app, BGTASK_METHOD_SUBMIT_TASK_REQUEST, parameters);
    free(parameters);
    return r;
}

EXPORT int bgtask_cancel_request(bgtask_app *app, const char *identifier) {
    if (!app) return -EINVAL;
    if (!identifier) return call_only(app, BGTASK_METHOD_CANCEL_ALL_TASK_REQUESTS, "{}");
    size_t length, capacity;
    char *parameters = identifier_parameters(identifier, &length, &capacity);
    int r = parameters ? append(&parameters, &length, &capacity, "}") : -ENOMEM;
    if (r == 0) r = call_only(app, BGTASK_METHOD_CANCEL_TASK_REQUEST, parameters);
    free(parameters);
    return r;
}

EXPORT int bgtask_set_task_completed(bgtask_app *app, const char *identifier, int success) {
    if (!app || !identifier) return -EINVAL;
    task *launch = find_launch(app, identifier);
    if (!launch) return -ENOENT;
    state_end(app, launch->id);  /* its handler will not run */
    size_t length, capacity;
    char *parameters = identifier_parameters(identifier, &length, &capacity);
    int r = parameters ? append(&parameters, &length, &capacity, success ? ",\"success\":true}" : ",\"success\":false}") : -ENOMEM;
    if (r == 0) r = call_only(app, BGTASK_METHOD_SET_TASK_COMPLETED, parameters);
    free(parameters);
    settle(app, now_ns());
    return r;
}

EXPORT int bgtask_finish_wake(bgtask_app *app) {
    if (!app) return -EINVAL;
    if (!state_wake_completed(app, now_ns())) return 0;
    settle(app, now_ns());
    return 1;
}
