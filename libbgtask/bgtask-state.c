/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask: what bgtaskd says, the tasks, and the library's deadlines; the same rules as
 * the Swift library's ClientState (Sources/BGTaskClient/ClientState.swift). */
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

/* ---- Tasks and handlers ---- */

/* A task id from a number in a message: 0 (no task has it) unless a whole number in range.
 * A daemon's numbers are not trusted to fit: converting one that does not is undefined. */
static uint64_t id_of(const json_value *value) {
    if (value->type != JSON_NUMBER || !(value->number >= 1 && value->number <= 9007199254740992.0)) return 0;
    return value->number == floor(value->number) ? (uint64_t)value->number : 0;
}

/* Seconds from a message as nanoseconds, within [0, a day]: a window longer than that is
 * not one bgtaskd gives, and the conversion must not overflow. */
static uint64_t nanoseconds(double seconds) {
    if (!(seconds > 0)) return 0;
    return seconds > 86400 ? 86400 * NSEC_PER_SEC : (uint64_t)(seconds * 1e9);
}

task *find_task(bgtask_app *app, uint64_t id) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (app->tasks[i].id == id) return &app->tasks[i];
    return NULL;
}

void remove_task(bgtask_app *app, task *t) {
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
void run_expiries(bgtask_app *app) {
    for (size_t i = 0; i < app->n_expiries; i++) {
        expiry e = app->expiries[i];
        e.handler(app, e.id, e.reason, e.detail, e.userdata);
        free(e.detail);
    }
    app->n_expiries = 0;
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

void arm_timer(bgtask_app *app) {
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
                if (id_of(&held->items[j]) == t->id) kept = true;
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
void lost(bgtask_app *app, uint64_t now) {
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
        app->reconnect_delay = app->reconnect_delay * 2 > RECONNECT_MAX ? RECONNECT_MAX : app->reconnect_delay * 2;
        app->next_reconnect = now + app->reconnect_delay;
        return;
    }
    app->subscription_fd = fd;
    app->next_reconnect = 0;  /* connected once "subscribed" arrives */
}

/* What is due at `now`: the orphans' handlers, the transition's or wake's end, reconnecting. */
void tick(bgtask_app *app, uint64_t now) {
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
            if (id_of(&expiring->items[i])) apply_to_task(app, id_of(&expiring->items[i]), "taskExpiring", NULL);
        size_t n = app->n_pending_ends;
        app->n_pending_ends = 0;
        for (size_t i = 0; i < n; i++) send_end(app, app->pending_ends[i]);
    } else if (strcmp(event, "didEnterBackground") == 0) {
        double timeout = 0;
        json_get_number(parameters, "transitionTimeout", &timeout);
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now);
        uint64_t window = nanoseconds(timeout);
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
            if (id_of(&ids->items[i])) apply_to_task(app, id_of(&ids->items[i]), event, NULL);
    } else if (strcmp(event, "didWake") == 0) {
        const char *reason = "";
        json_get_string(parameters, "reason", &reason);
        const json_value *payload = json_get(parameters, "payload");
        char *payload_text = payload && payload->type == JSON_OBJECT ? strndup(payload->text, payload->text_length) : NULL;
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now);
        app->wake = app->has_remaining;  /* an exempt app has no window to finish */
        app->wake_completed = !app->did_wake;
        uint64_t window = nanoseconds(app->remaining);
        app->wake_finish_by = now + (window > FINISH_MARGIN ? window - FINISH_MARGIN : 0);
        if (app->did_wake) app->did_wake(app, reason, payload_text, app->wake_userdata);
        free(payload_text);
    }
    /* Events this library does not know are for newer libraries. */
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
        receive(app, &message, now);
        json_free(&message);
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

