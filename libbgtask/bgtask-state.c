/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask's rules: what bgtaskd says, the tasks, and the library's deadlines; the same
 * rules as the Swift library's ClientState (Sources/BGTaskClient/ClientState.swift), held
 * together by the client vectors (Tests/ClientVectors, run against both). Pure: no
 * descriptor, clock or system call here; bgtask-io.c does what the outbox asks. */
#define _GNU_SOURCE
#include "bgtask-internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    return seconds > BGTASK_MAXIMUM_SECONDS ? BGTASK_MAXIMUM_SECONDS * NSEC_PER_SEC : (uint64_t)(seconds * 1e9);
}

/* A call for bgtask-io.c to send (out of memory: it is lost, as a send that failed). */
static void queue(bgtask_app *app, out_kind kind, uint64_t id) {
    if (app->n_outbox == app->outbox_capacity) {
        size_t next = app->outbox_capacity ? app->outbox_capacity * 2 : 8;
        out_call *grown = realloc(app->outbox, next * sizeof(out_call));
        if (!grown) return;
        app->outbox = grown;
        app->outbox_capacity = next;
    }
    app->outbox[app->n_outbox++] = (out_call){kind, id};
}

task *find_task(bgtask_app *app, uint64_t id) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (app->tasks[i].id == id) return &app->tasks[i];
    return NULL;
}

static void remove_task(bgtask_app *app, task *t) {
    free(t->launch);
    *t = app->tasks[--app->n_tasks];
}

task *find_launch(bgtask_app *app, const char *identifier) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (app->tasks[i].launch && strcmp(app->tasks[i].launch, identifier) == 0) return &app->tasks[i];
    return NULL;
}

int state_begun(bgtask_app *app, uint64_t id, bool granted, bgtask_expiration_handler_t handler, void *userdata) {
    if (app->n_tasks == app->tasks_capacity) {
        size_t next = app->tasks_capacity ? app->tasks_capacity * 2 : 8;
        task *grown = realloc(app->tasks, next * sizeof(task));
        if (!grown) return -ENOMEM;
        app->tasks = grown;
        app->tasks_capacity = next;
    }
    app->tasks[app->n_tasks++] = (task){.id = id, .handler = handler, .userdata = userdata, .granted = granted};
    return 0;
}

int state_end(bgtask_app *app, uint64_t id) {
    task *t = find_task(app, id);
    if (!t) return -ENOENT;
    bool send = !t->finished || t->orphaned;
    remove_task(app, t);
    return send;
}

void state_end_undelivered(bgtask_app *app, uint64_t id) {
    if (app->n_pending_ends < MAX_PENDING_ENDS) app->pending_ends[app->n_pending_ends++] = id;
}

static bool waiting_for_grant(bgtask_app *app) {
    for (size_t i = 0; i < app->n_tasks; i++)
        if (!app->tasks[i].granted && !app->tasks[i].finished) return true;
    return false;
}

/* Queues a task's handler (exactly once: it is taken from the task). */
static void queue_handler(bgtask_app *app, task *t, bgtask_expiration_reason reason, const char *detail) {
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

uint64_t next_deadline(const bgtask_app *app) {
    uint64_t next = 0;
#define CONSIDER(t) do { if ((t) && (!next || (t) < next)) next = (t); } while (0)
    if (app->transition && app->transition_returned) CONSIDER(app->transition_finish_by);
    if (app->wake) CONSIDER(app->wake_finish_by);
    if (!app->connected) CONSIDER(app->next_reconnect);
    CONSIDER(app->orphan_deadline);
#undef CONSIDER
    return next;
}

double state_time_remaining(const bgtask_app *app, uint64_t now) {
    if (!app->connected || !app->has_remaining) return INFINITY;
    double left = app->remaining - (double)(now - app->remaining_at) / 1e9;
    return left > 0 ? left : 0;
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
            queue_handler(app, t, BGTASK_EXPIRATION_DAEMON_UNAVAILABLE, NULL);
        }
    }
}

/* The subscription broke: tasks wait RESTART_GRACE for bgtaskd (it keeps them across a
 * restart); reconnecting starts after RECONNECT_FIRST, then twice as long each time. */
void state_lost(bgtask_app *app, uint64_t now) {
    bool was_connected = app->connected;
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

void state_reconnect_failed(bgtask_app *app, uint64_t now) {
    app->reconnect_delay = app->reconnect_delay * 2 > RECONNECT_MAX ? RECONNECT_MAX : app->reconnect_delay * 2;
    app->next_reconnect = now + app->reconnect_delay;
}

/* What is due at `now`: the orphans' handlers, the transition's or wake's end, reconnecting. */
bool state_tick(bgtask_app *app, uint64_t now) {
    if (app->orphan_deadline && now >= app->orphan_deadline) {
        app->orphan_deadline = 0;
        expire_orphans(app, NULL);
    }
    if (app->transition && app->transition_returned && (!waiting_for_grant(app) || now >= app->transition_finish_by)) {
        app->transition = false;
        queue(app, OUT_FINISH_TRANSITION, 0);
    }
    if (app->wake && (now >= app->wake_finish_by || (app->wake_completed && !waiting_for_grant(app)))) {
        app->wake = false;
        queue(app, OUT_FINISH_WAKE, 0);
    }
    if (!app->connected && app->next_reconnect && now >= app->next_reconnect) {
        app->next_reconnect = 0;  /* connected once BGTASK_EVENT_SUBSCRIBED arrives, else reconnect_failed */
        return true;
    }
    return false;
}

bool state_finish_transition(bgtask_app *app) {
    if (!app->transition) return false;
    app->transition = false;
    queue(app, OUT_FINISH_TRANSITION, 0);
    return true;
}

bool state_wake_completed(bgtask_app *app, uint64_t now) {
    if (!app->wake) return false;
    app->wake_completed = true;
    state_tick(app, now);
    return true;
}

/* ---- Events from bgtaskd ---- */

/* The time a message gives, within [0, a day]; none is unlimited (an exempt app, or the
 * foreground) unless `missing_is_zero` (a warning without a time: the time is up). */
static void set_remaining(bgtask_app *app, const json_value *parameters, uint64_t now, bool missing_is_zero) {
    double seconds = 0;
    bool given = json_get_number(parameters, "backgroundTimeRemaining", &seconds);
    app->has_remaining = given || missing_is_zero;
    app->remaining = !given || !(seconds > 0) ? 0 : seconds > BGTASK_MAXIMUM_SECONDS ? BGTASK_MAXIMUM_SECONDS : seconds;
    app->remaining_at = now;
}

static void apply_to_task(bgtask_app *app, uint64_t id, const char *event, const char *reason) {
    task *t = find_task(app, id);
    if (!t) return;  /* ended meanwhile */
    if (strcmp(event, BGTASK_EVENT_TASK_GRANTED) == 0) {
        t->granted = true;
    } else if (strcmp(event, BGTASK_EVENT_TASK_DENIED) == 0) {
        t->finished = true;
        queue_handler(app, t, BGTASK_EXPIRATION_DENIED, reason);
    } else if (strcmp(event, BGTASK_EVENT_TASK_EXPIRING) == 0) {
        queue_handler(app, t, BGTASK_EXPIRATION_EXPIRING, NULL);
    } else if (strcmp(event, BGTASK_EVENT_TASK_EXPIRED) == 0) {
        t->finished = true;
        queue_handler(app, t, BGTASK_EXPIRATION_EXPIRED, NULL);
    }
}

int state_receive(bgtask_app *app, const json_value *message, uint64_t now) {
    const json_value *parameters = json_get(message, "parameters");
    const char *event = NULL, *text = NULL;
    if (json_get(message, "error")) return -EPROTO;  /* an error ends the stream: start again */
    if (!json_get_string(parameters, "event", &event)) return 0;  /* not an event: nothing to do */
    const json_value *ids = json_get(parameters, "taskIds");
    uint64_t id;
    if (strcmp(event, BGTASK_EVENT_SUBSCRIBED) == 0) {
        app->connected = true;
        app->next_reconnect = 0;
        app->reconnect_delay = RECONNECT_FIRST;
        app->state = json_get_string(parameters, "state", &text) && strcmp(text, "foreground") != 0
                         ? BGTASK_STATE_BACKGROUND : BGTASK_STATE_ACTIVE;
        set_remaining(app, parameters, now, false);
        app->orphan_deadline = 0;
        static const json_value none = {.type = JSON_ARRAY};
        expire_orphans(app, ids ? ids : &none);
        /* Warned while the library was away (a daemon restart): their handlers run now,
         * once (a handler that ran already is gone from its task). */
        const json_value *expiring = json_get(parameters, "expiringTaskIds");
        for (size_t i = 0; expiring && expiring->type == JSON_ARRAY && i < expiring->count; i++)
            if (id_of(&expiring->items[i])) apply_to_task(app, id_of(&expiring->items[i]), BGTASK_EVENT_TASK_EXPIRING, NULL);
        size_t n = app->n_pending_ends;
        app->n_pending_ends = 0;
        for (size_t i = 0; i < n; i++) queue(app, OUT_END_TASK, app->pending_ends[i]);
    } else if (strcmp(event, BGTASK_EVENT_DID_ENTER_BACKGROUND) == 0) {
        double timeout = 0;
        json_get_number(parameters, "transitionTimeout", &timeout);
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now, false);
        uint64_t window = nanoseconds(timeout);
        app->transition = true;
        app->transition_returned = false;
        app->transition_finish_by = now + (window > FINISH_MARGIN ? window - FINISH_MARGIN : 0);
        if (app->did_enter_background) app->did_enter_background(app, app->lifecycle_userdata);
        app->transition_returned = true;
    } else if (strcmp(event, BGTASK_EVENT_WILL_ENTER_FOREGROUND) == 0) {
        app->state = BGTASK_STATE_INACTIVE;  /* as in UIKit, until the handler returns */
        app->has_remaining = false;
        app->transition = app->wake = false;
        if (app->will_enter_foreground) app->will_enter_foreground(app, app->lifecycle_userdata);
        if (app->state == BGTASK_STATE_INACTIVE) app->state = BGTASK_STATE_ACTIVE;
    } else if (strcmp(event, BGTASK_EVENT_TASK_GRANTED) == 0 || strcmp(event, BGTASK_EVENT_TASK_DENIED) == 0) {
        const char *reason = NULL;
        json_get_string(parameters, "reason", &reason);
        if (json_get_id(parameters, "taskId", &id)) apply_to_task(app, id, event, reason ? reason : "denied");
    } else if (strcmp(event, BGTASK_EVENT_TASK_EXPIRING) == 0 || strcmp(event, BGTASK_EVENT_TASK_EXPIRED) == 0) {
        if (strcmp(event, BGTASK_EVENT_TASK_EXPIRING) == 0) set_remaining(app, parameters, now, true);
        for (size_t i = 0; ids && ids->type == JSON_ARRAY && i < ids->count; i++)
            if (id_of(&ids->items[i])) apply_to_task(app, id_of(&ids->items[i]), event, NULL);
    } else if (strcmp(event, BGTASK_EVENT_LAUNCH_TASK) == 0) {
        const char *identifier = NULL, *kind = "refresh";
        if (!json_get_string(parameters, "identifier", &identifier) || !json_get_id(parameters, "taskId", &id)) return 0;
        json_get_string(parameters, "kind", &kind);
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now, false);
        if (find_task(app, id) || state_begun(app, id, false, app->launch_expired, app->launch_userdata) < 0) return 0;
        find_task(app, id)->launch = strdup(identifier);
        if (app->did_launch)
            app->did_launch(app, identifier, strcmp(kind, "processing") == 0 ? BGTASK_REQUEST_PROCESSING : BGTASK_REQUEST_REFRESH,
                            id, app->launch_userdata);
    } else if (strcmp(event, BGTASK_EVENT_DID_WAKE) == 0) {
        const char *reason = "";
        json_get_string(parameters, "reason", &reason);
        const json_value *payload = json_get(parameters, "payload");
        char *payload_text = payload && payload->type == JSON_OBJECT ? strndup(payload->text, payload->text_length) : NULL;
        app->state = BGTASK_STATE_BACKGROUND;
        set_remaining(app, parameters, now, false);
        app->wake = app->has_remaining;  /* an exempt app has no window to finish */
        app->wake_completed = !app->did_wake;
        uint64_t window = nanoseconds(app->remaining);
        app->wake_finish_by = now + (window > FINISH_MARGIN ? window - FINISH_MARGIN : 0);
        if (app->did_wake) app->did_wake(app, reason, payload_text, app->wake_userdata);
        free(payload_text);
    }
    /* Events this library does not know are for newer libraries. */
    return 0;
}
