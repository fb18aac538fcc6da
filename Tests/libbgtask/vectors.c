/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The client vectors (Tests/ClientVectors, format in its README) against libbgtask's rules,
 * bgtask-state.c, linked alone with json.c: that it links without bgtask-io.c is the proof
 * that the rules do no I/O. Prints "ok FILE" or "not ok FILE step N: what differs" per
 * vector; exits 1 if any failed.
 *
 *   cc -std=c11 -Ilibbgtask Tests/libbgtask/vectors.c libbgtask/bgtask-state.c libbgtask/json.c -lm
 *   ./a.out Tests/ClientVectors/ *.json
 */
#define _GNU_SOURCE
#include "bgtask-internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the library did in one step, as text in the vectors' notation. */
static char handlers[4096], lifecycle[1024];

static void append_to(char *out, size_t size, const char *text) {
    size_t n = strlen(out);
    snprintf(out + n, size - n, "%s%s", n ? "," : "", text);
}

static void expired(bgtask_app *app, uint64_t id, bgtask_expiration_reason reason, const char *detail, void *userdata) {
    (void)app;
    (void)userdata;
    static const char *names[] = {"", "expiring", "expired", "denied", "daemonUnavailable"};
    char entry[512];
    if (reason == BGTASK_EXPIRATION_DENIED)
        snprintf(entry, sizeof(entry), "[%llu,\"%s\",\"%s\"]", (unsigned long long)id, names[reason], detail ? detail : "");
    else
        snprintf(entry, sizeof(entry), "[%llu,\"%s\"]", (unsigned long long)id, names[reason]);
    append_to(handlers, sizeof(handlers), entry);
}

static void entered(bgtask_app *app, void *userdata) { (void)app; (void)userdata; append_to(lifecycle, sizeof(lifecycle), "\"didEnterBackground\""); }
static void entering(bgtask_app *app, void *userdata) { (void)app; (void)userdata; append_to(lifecycle, sizeof(lifecycle), "\"willEnterForeground\""); }
static void launched(bgtask_app *app, const char *identifier, bgtask_request_kind kind, uint64_t id, void *userdata) {
    (void)app;
    (void)id;
    (void)userdata;
    char entry[512];
    snprintf(entry, sizeof(entry), "\"launchTask %s %s\"", identifier, kind == BGTASK_REQUEST_PROCESSING ? "processing" : "refresh");
    append_to(lifecycle, sizeof(lifecycle), entry);
}

static void woke(bgtask_app *app, const char *reason, const char *payload, void *userdata) {
    (void)app;
    (void)userdata;
    char entry[512];
    snprintf(entry, sizeof(entry), "\"didWake %s%s\"", reason, payload ? "+payload" : "");
    append_to(lifecycle, sizeof(lifecycle), entry);
}

/* Handlers sorted by id (their order across tasks is not a rule): bubble sort of entries. */
static int by_id(const void *a, const void *b) {
    unsigned long long x = strtoull(*(char *const *)a + 1, NULL, 10), y = strtoull(*(char *const *)b + 1, NULL, 10);
    return x < y ? -1 : x > y;
}

static void sort_handlers(void) {
    char *entries[64], copy[sizeof(handlers)];
    size_t n = 0;
    strcpy(copy, handlers);
    for (char *p = copy; *p && n < 64;) {
        entries[n++] = p;
        char *end = strstr(p, "],[");
        if (!end) break;
        end[1] = 0;
        p = end + 2;
    }
    qsort(entries, n, sizeof(char *), by_id);
    handlers[0] = 0;
    for (size_t i = 0; i < n; i++) append_to(handlers, sizeof(handlers), entries[i]);
}

/* An expected list's text without spaces, for comparing with what was recorded. */
static void compact(const json_value *value, char *out, size_t size) {
    size_t n = 0;
    bool quoted = false;
    if (value)
        for (size_t i = 1; i + 1 < value->text_length && n + 1 < size; i++) {  /* without the brackets */
            char c = value->text[i];
            if (c == '"' && value->text[i - 1] != '\\') quoted = !quoted;
            if (quoted || (c != ' ' && c != '\n')) out[n++] = c;
        }
    out[n] = 0;
}

static bgtask_app *new_app(void) {
    bgtask_app *app = calloc(1, sizeof(*app));
    app->n_ref = 1;
    app->epoll_fd = app->timer_fd = app->subscription_fd = app->call_fd = app->send_fd = -1;
    app->reconnect_delay = RECONNECT_FIRST;
    app->pending_ends = calloc(MAX_PENDING_ENDS, sizeof(uint64_t));
    app->did_enter_background = entered;
    app->will_enter_foreground = entering;
    app->did_wake = woke;
    app->did_launch = launched;
    app->launch_expired = expired;
    return app;
}

static void free_app(bgtask_app *app) {
    for (size_t i = 0; i < app->n_tasks; i++) free(app->tasks[i].launch);
    for (size_t i = 0; i < app->n_expiries; i++) free(app->expiries[i].detail);
    free(app->expiries);
    free(app->outbox);
    free(app->tasks);
    free(app->pending_ends);
    free(app);
}

static bool flag(const json_value *step, const char *key) {
    const json_value *v = json_get(step, key);
    return v && v->type == JSON_BOOL ? v->boolean : false;
}

/* Runs one step; writes what differs into `failure` (empty: none). */
static void run_step(bgtask_app *app, const json_value *step, char *failure, size_t size) {
    double at = 0, number;
    json_get_number(step, "at", &at);
    uint64_t now = (uint64_t)llround(at * 1e6);
    handlers[0] = lifecycle[0] = 0;
    failure[0] = 0;
    bool reconnect = false;
    const json_value *daemon = json_get(step, "daemon");
    if (daemon) {
        char *text = NULL;
        size_t length = 0, capacity = 0;
        json_append_raw(&text, &length, &capacity, "{\"parameters\":", 14);
        json_append_raw(&text, &length, &capacity, daemon->text, daemon->text_length);
        json_append_raw(&text, &length, &capacity, "}", 1);
        json_value message;
        if (json_parse(text, length, &message) == 0) {
            if (state_receive(app, &message, now) < 0) state_lost(app, now);
            json_free(&message);
        }
        free(text);
    } else if (json_get_number(step, "begin", &number)) {
        const json_value *h = json_get(step, "handler");
        bool handler = !h || h->type != JSON_BOOL || h->boolean;
        state_begun(app, (uint64_t)number, flag(step, "granted"), handler ? expired : NULL, NULL);
    } else if (json_get_number(step, "end", &number)) {
        int r = state_end(app, (uint64_t)number);
        const char *ending = r < 0 ? "unknown" : r ? "send" : "alreadyEnded", *expected = "";
        json_get_string(step, "ending", &expected);
        if (strcmp(ending, expected) != 0) snprintf(failure, size, "ending %s; ", ending);
    } else if (json_get_number(step, "endUndelivered", &number)) {
        state_end_undelivered(app, (uint64_t)number);
    } else if (flag(step, "lost")) {
        state_lost(app, now);
    } else if (flag(step, "reconnectFailed")) {
        state_reconnect_failed(app, now);
    } else if (flag(step, "wakeCompleted")) {
        state_wake_completed(app, now);
    }
    run_expiries(app);
    reconnect = state_tick(app, now);
    run_expiries(app);
    sort_handlers();
    char calls[4096] = "", expected[4096];
    for (size_t i = 0; i < app->n_outbox; i++) {
        char entry[64];
        out_call c = app->outbox[i];
        if (c.kind == OUT_END_TASK) snprintf(entry, sizeof(entry), "\"EndTask %llu\"", (unsigned long long)c.id);
        else snprintf(entry, sizeof(entry), "\"%s\"", c.kind == OUT_FINISH_WAKE ? "FinishWake" : "FinishBackgroundTransition");
        append_to(calls, sizeof(calls), entry);
    }
    app->n_outbox = 0;
    size_t n = strlen(failure);
    compact(json_get(step, "handlers"), expected, sizeof(expected));
    if (strcmp(handlers, expected) != 0) n += (size_t)snprintf(failure + n, size - n, "handlers [%s]; ", handlers);
    compact(json_get(step, "calls"), expected, sizeof(expected));
    if (strcmp(calls, expected) != 0 && n < size) n += (size_t)snprintf(failure + n, size - n, "calls [%s]; ", calls);
    compact(json_get(step, "lifecycle"), expected, sizeof(expected));
    if (strcmp(lifecycle, expected) != 0 && n < size) n += (size_t)snprintf(failure + n, size - n, "lifecycle [%s]; ", lifecycle);
    if (reconnect != flag(step, "reconnect") && n < size) n += (size_t)snprintf(failure + n, size - n, "reconnect %d; ", reconnect);
    const char *state;
    if (json_get_string(step, "state", &state) && n < size) {
        const char *actual = app->state == BGTASK_STATE_BACKGROUND ? "background" : app->state == BGTASK_STATE_INACTIVE ? "inactive" : "active";
        if (strcmp(actual, state) != 0) n += (size_t)snprintf(failure + n, size - n, "state %s; ", actual);
    }
    const json_value *connected = json_get(step, "connected");
    if (connected && connected->boolean != app->connected && n < size)
        n += (size_t)snprintf(failure + n, size - n, "connected %d; ", app->connected);
    const json_value *remaining = json_get(step, "remaining");
    if (remaining && n < size) {
        double left = state_time_remaining(app, now);
        bool matches = remaining->type == JSON_NULL ? isinf(left) : !isinf(left) && fabs(left - remaining->number) < 1e-6;
        if (!matches) snprintf(failure + n, size - n, "remaining %g; ", left);
    }
}

static bool run_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) { printf("not ok %s: cannot open\n", path); return false; }
    static char text[1 << 20];
    size_t length = fread(text, 1, sizeof(text), f);
    fclose(f);
    json_value vector;
    if (json_parse(text, length, &vector) < 0) { printf("not ok %s: not JSON\n", path); return false; }
    const json_value *steps = json_get(&vector, "steps");
    bgtask_app *app = new_app();
    bool ok = steps && steps->type == JSON_ARRAY && steps->count > 0;
    for (size_t i = 0; ok && i < steps->count; i++) {
        char failure[8192];
        run_step(app, &steps->items[i], failure, sizeof(failure));
        if (failure[0]) {
            printf("not ok %s step %zu: %s\n", path, i, failure);
            ok = false;
        }
    }
    if (ok) printf("ok %s\n", path);
    free_app(app);
    json_free(&vector);
    return ok;
}

int main(int argc, char **argv) {
    int failed = 0;
    for (int i = 1; i < argc; i++) failed += !run_file(argv[i]);
    printf("%d of %d vectors passed\n", argc - 1 - failed, argc - 1);
    return failed ? 1 : 0;
}
