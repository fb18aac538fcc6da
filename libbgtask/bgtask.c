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
#include "bgtask.h"
#include "json.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#define SYSTEM_SOCKET "/run/bgtaskd/io.bgtaskd"
#define NSEC_PER_MSEC 1000000ULL
#define NSEC_PER_SEC 1000000000ULL
/* How early, before bgtaskd's transition deadline, FinishBackgroundTransition goes out
 * when a grant is still outstanding. */
#define FINISH_MARGIN (25 * NSEC_PER_MSEC)
#define RECONNECT_FIRST (50 * NSEC_PER_MSEC)
#define RECONNECT_MAX NSEC_PER_SEC
#define RESTART_GRACE (3 * NSEC_PER_SEC)
#define MAX_MESSAGE (1 << 20)
#define MAX_PENDING_ENDS 4096

/* Tokens in the epoll instance. */
enum { TOKEN_TIMER = 1, TOKEN_SUBSCRIPTION, TOKEN_SEND };

typedef struct {
    char *data;
    size_t length, capacity;
} buffer;

typedef struct {
    uint64_t id;
    bgtask_expiration_handler_t handler;
    void *userdata;
    bool granted;
    /* bgtaskd ended it (denied, expired, gone): bgtask_end sends nothing. */
    bool finished;
    /* bgtaskd went away while it was active: it may still hold it when it comes back. */
    bool orphaned;
} task;

/* A handler to run once the state is settled (handlers may call back into the library). */
typedef struct {
    bgtask_expiration_handler_t handler;
    void *userdata;
    uint64_t id;
    bgtask_expiration_reason reason;
    char *detail;
} expiry;

struct bgtask_app {
    unsigned n_ref;
    char *socket_path;
    int epoll_fd, timer_fd;
    int subscription_fd, call_fd, send_fd;
    buffer subscription_in, send_in, send_out;
    uint64_t timeout_usec;

    bool connected;
    bgtask_state state;
    bool has_remaining;
    double remaining;
    uint64_t remaining_at;
    task *tasks;
    size_t n_tasks, tasks_capacity;
    bool transition, transition_returned;
    uint64_t transition_finish_by;
    bool wake, wake_completed;
    uint64_t wake_finish_by;
    uint64_t *pending_ends;
    size_t n_pending_ends;
    uint64_t next_reconnect, orphan_deadline, reconnect_delay;

    bgtask_lifecycle_handler_t did_enter_background, will_enter_foreground;
    void *lifecycle_userdata;
    bgtask_wake_handler_t did_wake;
    void *wake_userdata;

    expiry *expiries;
    size_t n_expiries, expiries_capacity;
    char last_error[128];
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * NSEC_PER_SEC + (uint64_t)t.tv_nsec;
}

static void close_fd(bgtask_app *app, int *fd) {
    if (*fd < 0) return;
    epoll_ctl(app->epoll_fd, EPOLL_CTL_DEL, *fd, NULL);
    close(*fd);
    *fd = -1;
}

static int watch(bgtask_app *app, int fd, uint32_t events, uint64_t token, int op) {
    struct epoll_event event = {.events = events, .data.u64 = token};
    return epoll_ctl(app->epoll_fd, op, fd, &event) < 0 ? -errno : 0;
}

static int connect_socket(const char *path, bool blocking) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(address.sun_path)) return -ENAMETOOLONG;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (blocking ? 0 : SOCK_NONBLOCK), 0);
    if (fd < 0) return -errno;
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

static int buffer_append(buffer *b, const char *data, size_t n) {
    return json_append_raw(&b->data, &b->length, &b->capacity, data, n);
}

static void buffer_consume(buffer *b, size_t n) {
    memmove(b->data, b->data + n, b->length - n);
    b->length -= n;
}

/* Writes what the socket takes now; -errno if it is broken. */
static int flush_out(int fd, buffer *b) {
    while (b->length > 0) {
        ssize_t n = send(fd, b->data, b->length, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        buffer_consume(b, (size_t)n);
    }
    return 0;
}

/* Reads what is there into `b`; 0 if more may come, -ECONNRESET at the end, -errno. */
static int read_available(int fd, buffer *b) {
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n == 0) return -ECONNRESET;
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        if (b->length + (size_t)n > MAX_MESSAGE * 2) return -EMSGSIZE;
        if (buffer_append(b, chunk, (size_t)n) < 0) return -ENOMEM;
    }
}

/* ---- Tasks and handlers ---- */

static task *find_task(bgtask_app *app, uint64_t id) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (app->tasks[i].id == id) return &app->tasks[i];
    return NULL;
}

static void remove_task(bgtask_app *app, task *t) {
    *t = app->tasks[--app->n_tasks];
}

static bool waiting_for_grant(bgtask_app *app) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (!app->tasks[i].granted && !app->tasks[i].finished) return true;
    return false;
}

/* Queues a task's handler (exactly once: it is taken from the task). */
static void expire(bgtask_app *app, task *t, bgtask_expiration_reason reason, const char *detail) {
    if (!t->handler) return;
    if (app->n_expiries == app->expiries_capacity) {
        size_t next = app->expiries_capacity ? app->expiries_capacity * 2 : 8;
        expiry *grown = realloc(app->expiries, next * sizeof(expiry));
        if (!grown) return;  /* out of memory: the handler is lost, the task still ends */
        app->expiries = grown;
        app->expiries_capacity = next;
    }
    app->expiries[app->n_expiries++] = (expiry){t->handler, t->userdata, t->id, reason, detail ? strdup(detail) : NULL};
    t->handler = NULL;
}

/* Runs the queued handlers; each may end tasks, begin others, or drop the app. */
static void run_expiries(bgtask_app *app) {
    for (size_t i = 0; i < app->n_expiries; i++) {
        expiry e = app->expiries[i];
        e.handler(app, e.id, e.reason, e.detail, e.userdata);
        free(e.detail);
    }
    app->n_expiries = 0;
}

/* ---- The library's own calls ---- */

static int send_call(bgtask_app *app, const char *method, const char *parameters) {
    if (app->send_fd < 0) {
        int fd = connect_socket(app->socket_path, false);
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

static void send_end(bgtask_app *app, uint64_t id) {
    char parameters[64];
    snprintf(parameters, sizeof(parameters), "{\"taskId\":%llu}", (unsigned long long)id);
    if (send_call(app, "EndTask", parameters) < 0 && app->n_pending_ends < MAX_PENDING_ENDS)
        app->pending_ends[app->n_pending_ends++] = id;
}

/* ---- Deadlines ---- */

static uint64_t next_deadline(bgtask_app *app) {
    uint64_t next = 0;
#define CONSIDER(t) do { if ((t) && (!next || (t) < next)) next = (t); } while (0)
    if (app->transition && app->transition_returned) CONSIDER(app->transition_finish_by);
    if (app->wake) CONSIDER(app->wake_finish_by);
    if (!app->connected) CONSIDER(app->next_reconnect);
    CONSIDER(app->orphan_deadline);
#undef CONSIDER
    return next;
}

static void arm_timer(bgtask_app *app) {
    uint64_t next = next_deadline(app);
    struct itimerspec spec = {0};
    if (next) {
        spec.it_value.tv_sec = (time_t)(next / NSEC_PER_SEC);
        spec.it_value.tv_nsec = (long)(next % NSEC_PER_SEC);
        if (!spec.it_value.tv_sec && !spec.it_value.tv_nsec) spec.it_value.tv_nsec = 1;
    }
    timerfd_settime(app->timer_fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

/* The orphans' handlers, with DAEMON_UNAVAILABLE, for those bgtaskd does not hold: `held`
 * is what it said it holds on resubscribing, NULL while it has not come back. */
static void expire_orphans(bgtask_app *app, const json_value *held) {
    for (size_t i = 0; i < app->n_tasks; i++) {
        task *t = &app->tasks[i];
        if (!t->orphaned) continue;
        bool kept = false;
        if (held) {
            t->orphaned = false;
            for (size_t j = 0; held->type == JSON_ARRAY && j < held->count; j++)
                if (held->items[j].type == JSON_NUMBER && (uint64_t)held->items[j].number == t->id) kept = true;
        }
        if (kept) {
            t->finished = false;  /* it goes on, even if its handler ran while bgtaskd was away */
        } else if (!t->finished) {
            t->finished = true;
            expire(app, t, BGTASK_EXPIRATION_DAEMON_UNAVAILABLE, NULL);
        }
    }
}

/* The subscription broke: tasks wait RESTART_GRACE for bgtaskd (it keeps them across a
 * restart); reconnecting starts after RECONNECT_FIRST, then twice as long each time. */
static void lost(bgtask_app *app, uint64_t now) {
    bool was_connected = app->connected;
    close_fd(app, &app->subscription_fd);
    close_fd(app, &app->send_fd);
    if (app->call_fd >= 0) { close(app->call_fd); app->call_fd = -1; }
    app->subscription_in.length = 0;
    app->connected = false;
    app->state = BGTASK_STATE_ACTIVE;
    app->has_remaining = false;
    app->transition = false;
    if (was_connected) {
        bool orphans = false;
        for (size_t i = 0; i < app->n_tasks; i++)
            if (!app->tasks[i].finished) orphans = app->tasks[i].orphaned = true;
        if (orphans && !app->orphan_deadline) app->orphan_deadline = now + RESTART_GRACE;
        app->reconnect_delay = RECONNECT_FIRST;
    }
    app->next_reconnect = now + app->reconnect_delay;
}

static void reconnect(bgtask_app *app, uint64_t now) {
    static const char subscribe[] = "{\"method\":\"io.bgtaskd.App.Subscribe\",\"more\":true}";
    int fd = connect_socket(app->socket_path, false);
    if (fd >= 0 && send(fd, subscribe, sizeof(subscribe), MSG_NOSIGNAL) != (ssize_t)sizeof(subscribe)) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0 && watch(app, fd, EPOLLIN, TOKEN_SUBSCRIPTION, EPOLL_CTL_ADD) < 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        app->reconnect_delay = app->reconnect_delay * 2 > RECONNECT_MAX ? RECONNECT_MAX : app->reconnect_delay * 2;
        app->next_reconnect = now + app->reconnect_delay;
        return;
    }
    app->subscription_fd = fd;
    app->next_reconnect = 0;  /* connected once "subscribed" arrives */
}

/* What is due at `now`: the orphans' handlers, the transition's or wake's end, reconnecting. */
static void tick(bgtask_app *app, uint64_t now) {
    if (app->orphan_deadline && now >= app->orphan_deadline) {
        app->orphan_deadline = 0;
        expire_orphans(app, NULL);
    }
    if (app->transition && app->transition_returned && (!waiting_for_grant(app) || now >= app->transition_finish_by)) {
        app->transition = false;
        send_call(app, "FinishBackgroundTransition", "{}");
    }
    if (app->wake && (now >= app->wake_finish_by || (app->wake_completed && !waiting_for_grant(app)))) {
        app->wake = false;
        send_call(app, "FinishWake", "{}");
    }
    if (!app->connected && app->subscription_fd < 0 && app->next_reconnect && now >= app->next_reconnect) reconnect(app, now);
}

/* ---- Events from bgtaskd ---- */

static void set_remaining(bgtask_app *app, const json_value *parameters, uint64_t now) {
    app->has_remaining = json_get_number(parameters, "backgroundTimeRemaining", &app->remaining);
    app->remaining_at = now;
}

static void apply_to_task(bgtask_app *app, uint64_t id, const char *event, const char *reason) {
    task *t = find_task(app, id);
    if (!t) return;  /* ended meanwhile */
    if (strcmp(event, "taskGranted") == 0) {
        t->granted = true;
    } else if (strcmp(event, "taskDenied") == 0) {
        t->finished = true;
        expire(app, t, BGTASK_EXPIRATION_DENIED, reason);
    } else if (strcmp(event, "taskExpiring") == 0) {
        expire(app, t, BGTASK_EXPIRATION_EXPIRING, NULL);
    } else if (strcmp(event, "taskExpired") == 0) {
        t->finished = true;
        expire(app, t, BGTASK_EXPIRATION_EXPIRED, NULL);
    }
}

static void receive(bgtask_app *app, const json_value *message, uint64_t now) {
    const json_value *parameters = json_get(message, "parameters");
    const char *event = NULL, *text = NULL;
    if (json_get(message, "error") || !json_get_string(parameters, "event", &event)) {
        lost(app, now);  /* an error ends the stream: start again */
        return;
    }
    const json_value *ids = json_get(parameters, "taskIds");
    uint64_t id;
    if (strcmp(event, "subscribed") == 0) {
        app->connected = true;
        app->next_reconnect = 0;
        app->reconnect_delay = RECONNECT_FIRST;
        app->state = json_get_string(parameters, "state", &text) && strcmp(text, "foreground") != 0
                         ? BGTASK_STATE_BACKGROUND : BGTASK_STATE_ACTIVE;
        set_remaining(app, parameters, now);
        app->orphan_deadline = 0;
        static const json_value none = {.type = JSON_ARRAY};
        expire_orphans(app, ids ? ids : &none);
        /* Warned while the library was away (a daemon restart): their handlers run now,
         * once (a handler that ran already is gone from its task). */
        const json_value *expiring = json_get(parameters, "expiringTaskIds");
        for (size_t i = 0; expiring && expiring->type == JSON_ARRAY && i < expiring->count; i++)
            if (expiring->items[i].type == JSON_NUMBER) apply_to_task(app, (uint64_t)expiring->items[i].number, "taskExpiring", NULL);
        size_t n = app->n_pending_ends;
        app->n_pending_ends = 0;
        for (size_t i = 0; i < n; i++) send_end(app, app->pending_ends[i]);
    } else if (strcmp(event, "didEnterBackground") == 0) {
        double timeout = 0;
        json_get_number(parameters, "transitionTimeout", &timeout);
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now);
        uint64_t window = timeout > 0 ? (uint64_t)(timeout * 1e9) : 0;
        app->transition = true;
        app->transition_returned = false;
        app->transition_finish_by = now + (window > FINISH_MARGIN ? window - FINISH_MARGIN : 0);
        if (app->did_enter_background) app->did_enter_background(app, app->lifecycle_userdata);
        app->transition_returned = true;
    } else if (strcmp(event, "willEnterForeground") == 0) {
        app->state = BGTASK_STATE_INACTIVE;  /* as in UIKit, until the handler returns */
        app->has_remaining = false;
        app->transition = app->wake = false;
        if (app->will_enter_foreground) app->will_enter_foreground(app, app->lifecycle_userdata);
        if (app->state == BGTASK_STATE_INACTIVE) app->state = BGTASK_STATE_ACTIVE;
    } else if (strcmp(event, "taskGranted") == 0 || strcmp(event, "taskDenied") == 0) {
        const char *reason = NULL;
        json_get_string(parameters, "reason", &reason);
        if (json_get_id(parameters, "taskId", &id)) apply_to_task(app, id, event, reason ? reason : "denied");
    } else if (strcmp(event, "taskExpiring") == 0 || strcmp(event, "taskExpired") == 0) {
        if (strcmp(event, "taskExpiring") == 0) set_remaining(app, parameters, now);
        for (size_t i = 0; ids && ids->type == JSON_ARRAY && i < ids->count; i++)
            if (ids->items[i].type == JSON_NUMBER) apply_to_task(app, (uint64_t)ids->items[i].number, event, NULL);
    } else if (strcmp(event, "didWake") == 0) {
        const char *reason = "";
        json_get_string(parameters, "reason", &reason);
        const json_value *payload = json_get(parameters, "payload");
        char *payload_text = payload && payload->type == JSON_OBJECT ? strndup(payload->text, payload->text_length) : NULL;
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now);
        app->wake = app->has_remaining;  /* an exempt app has no window to finish */
        app->wake_completed = !app->did_wake;
        uint64_t window = (uint64_t)(app->remaining * 1e9);
        app->wake_finish_by = now + (window > FINISH_MARGIN ? window - FINISH_MARGIN : 0);
        if (app->did_wake) app->did_wake(app, reason, payload_text, app->wake_userdata);
        free(payload_text);
    }
    /* Events this library does not know are for newer libraries. */
}

/* Splits the subscription's bytes into messages and applies them in order. */
static void read_subscription(bgtask_app *app, uint64_t now) {
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
        receive(app, &message, now);
        json_free(&message);
    }
    if (app->subscription_fd >= 0) {
        buffer_consume(&app->subscription_in, start);
        if (r < 0 || app->subscription_in.length > MAX_MESSAGE) lost(app, now);
    }
}

/* Replies to the library's own calls: nothing to do with them but read them. */
static void read_send_replies(bgtask_app *app) {
    int r = read_available(app->send_fd, &app->send_in);
    char *nul;
    while ((nul = memchr(app->send_in.data, 0, app->send_in.length)))
        buffer_consume(&app->send_in, (size_t)(nul - app->send_in.data) + 1);
    if (r < 0) close_fd(app, &app->send_fd);
}

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
    tick(app, now_ns());
    run_expiries(app);
    arm_timer(app);
    bgtask_app_unref(app);
    return result;
}

EXPORT int bgtask_app_new(bgtask_app **ret, const char *socket_path) {
    if (!ret) return -EINVAL;
    const char *path = socket_path;
    if (!path) path = getenv("BGTASKD_SOCKET");
    if (!path || !*path) path = SYSTEM_SOCKET;
    bgtask_app *app = calloc(1, sizeof(*app));
    if (!app) return -ENOMEM;
    app->n_ref = 1;
    app->subscription_fd = app->call_fd = app->send_fd = -1;
    app->timeout_usec = 5000000;
    app->reconnect_delay = RECONNECT_FIRST;
    app->socket_path = strdup(path);
    app->pending_ends = calloc(MAX_PENDING_ENDS, sizeof(uint64_t));
    app->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    app->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    int r = -ENOMEM;
    if (!app->socket_path || !app->pending_ends) goto fail;
    r = app->epoll_fd < 0 || app->timer_fd < 0 ? -errno : watch(app, app->timer_fd, EPOLLIN, TOKEN_TIMER, EPOLL_CTL_ADD);
    if (r < 0) goto fail;
    /* Subscribed before returning, so the first call finds the app known. */
    static const char subscribe[] = "{\"method\":\"io.bgtaskd.App.Subscribe\",\"more\":true}";
    int fd = connect_socket(app->socket_path, false);
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
    free(app->subscription_in.data);
    free(app->send_in.data);
    free(app->send_out.data);
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

static int append(char **buffer, size_t *length, size_t *capacity, const char *text) {
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
static int call(bgtask_app *app, const char *method, const char *parameters, json_value *reply) {
    app->last_error[0] = 0;
    if (!app->connected) return -ENOTCONN;
    if (app->call_fd < 0) {
        int fd = connect_socket(app->socket_path, true);
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
        if (n < 0 && errno != EINTR) r = -errno;
        if (n > 0) sent += (size_t)n;
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
        if (r == -ECONNRESET && in.length) r = 0;
        if (in.length) nul = memchr(in.data, 0, in.length);
        if (r == 0 && !nul && in.length > MAX_MESSAGE) r = -EMSGSIZE;
    }
    if (r == 0) r = json_parse(in.data, (size_t)(nul - in.data), reply);
    if (r == 0 && nul + 1 != in.data + in.length) r = -EPROTO;  /* more than one reply: out of step */
    free(in.data);
    if (r < 0) {
        close(app->call_fd);  /* broken or out of step: start afresh next time */
        app->call_fd = -1;
        return r;
    }
    const char *error;
    if (json_get_string(reply, "error", &error)) {
        snprintf(app->last_error, sizeof(app->last_error), "%s", error);
        json_free(reply);
        return errno_of(error);
    }
    return 0;
}

EXPORT int bgtask_begin(bgtask_app *app, const char *name, bgtask_expiration_handler_t expiration, void *userdata,
                        uint64_t *ret_id) {
    if (!app || !ret_id) return -EINVAL;
    if (app->n_tasks == app->tasks_capacity) {
        size_t next = app->tasks_capacity ? app->tasks_capacity * 2 : 8;
        task *grown = realloc(app->tasks, next * sizeof(task));
        if (!grown) return -ENOMEM;
        app->tasks = grown;
        app->tasks_capacity = next;
    }
    char *parameters = NULL;
    size_t length = 0, capacity = 0;
    int r = append(&parameters, &length, &capacity, "{\"name\":");
    if (r == 0) r = json_append_string(&parameters, &length, &capacity, name ? name : "");
    if (r == 0) r = append(&parameters, &length, &capacity, expiration ? ",\"expirationHandler\":true}" : ",\"expirationHandler\":false}");
    if (r < 0) { free(parameters); return r; }
    json_value reply;
    r = call(app, "BeginTask", parameters, &reply);
    free(parameters);
    if (r < 0) return r;
    uint64_t id = 0;
    const char *state = "pending";
    bool ok = json_get_id(json_get(&reply, "parameters"), "taskId", &id);
    json_get_string(json_get(&reply, "parameters"), "state", &state);
    task t = {.id = id, .handler = expiration, .userdata = userdata, .granted = strcmp(state, "granted") == 0};
    json_free(&reply);
    if (!ok) return -EPROTO;
    app->tasks[app->n_tasks++] = t;
    *ret_id = id;
    return 0;
}

EXPORT int bgtask_end(bgtask_app *app, uint64_t id) {
    if (!app) return -EINVAL;
    task *t = find_task(app, id);
    if (!t) return -ENOENT;
    bool send = !t->finished || t->orphaned;
    remove_task(app, t);
    if (send) {
        char parameters[64];
        snprintf(parameters, sizeof(parameters), "{\"taskId\":%llu}", (unsigned long long)id);
        json_value reply;
        int r = call(app, "EndTask", parameters, &reply);
        if (r == 0) {
            json_free(&reply);
        } else if (r == -ENOTCONN || r == -ETIMEDOUT || r == -ECONNRESET || r == -ECONNREFUSED || r == -EPIPE) {
            if (app->n_pending_ends < MAX_PENDING_ENDS) app->pending_ends[app->n_pending_ends++] = id;  /* once it is back */
        }
        /* -ENOENT: bgtaskd ended it meanwhile (expired, or the app left the background). */
    }
    tick(app, now_ns());  /* the transition may have been waiting on it */
    arm_timer(app);
    return 0;
}

EXPORT int bgtask_time_remaining(bgtask_app *app, double *ret_seconds) {
    if (!app || !ret_seconds) return -EINVAL;
    if (!app->connected || !app->has_remaining) {
        *ret_seconds = INFINITY;
    } else {
        double left = app->remaining - (double)(now_ns() - app->remaining_at) / 1e9;
        *ret_seconds = left > 0 ? left : 0;
    }
    return 0;
}

EXPORT int bgtask_finish_transition(bgtask_app *app) {
    if (!app) return -EINVAL;
    if (!app->transition) return 0;
    app->transition = false;
    send_call(app, "FinishBackgroundTransition", "{}");
    arm_timer(app);
    return 1;
}

EXPORT int bgtask_finish_wake(bgtask_app *app) {
    if (!app) return -EINVAL;
    if (!app->wake) return 0;
    app->wake_completed = true;
    tick(app, now_ns());
    arm_timer(app);
    return 1;
}
