/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for libbgtask's side of the wire: whatever bytes arrive on the
 * subscription (a daemon that is buggy, or not bgtaskd at all) are split into messages,
 * parsed, and applied to an app holding three tasks, whose handlers end their tasks, as an
 * app's would. Nothing may crash, leak or loop; every string the JSON reader returns must
 * survive being written back as JSON; every number must read as the C locale reads it
 * (scripts/fuzz runs the target under a locale whose decimal point is a comma); every handler
 * runs at most once per task. The same bytes are also a reply to a call (`call`), followed by
 * the end of the connection: it must neither leak, nor wait for its timeout.
 *
 * Built by scripts/fuzz with clang -fsanitize=fuzzer,address (the library's own files are
 * included, so their static functions are reachable).
 */
#include "../../libbgtask/bgtask-state.c"

#include <assert.h>
#include <locale.h>
#include <sys/socket.h>
#include <unistd.h>

static int handled[4];

static void expired(bgtask_app *app, uint64_t id, bgtask_expiration_reason reason, const char *detail, void *userdata) {
    (void)reason;
    (void)detail;
    (void)userdata;
    assert(id >= 1 && id <= 3);
    handled[id]++;
    assert(handled[id] == 1);  /* exactly once */
    bgtask_end(app, id);       /* not connected: queued for the daemon's return, no I/O */
}

static void check_strings(const json_value *v) {
    if (v->type == JSON_NUMBER) {
        char digits[64];
        size_t n = v->text_length < sizeof(digits) - 1 ? v->text_length : sizeof(digits) - 1;
        memcpy(digits, v->text, n);
        digits[n] = 0;
        static locale_t c;
        if (!c) c = newlocale(LC_ALL_MASK, "C", (locale_t)0);
        assert(strtod_l(digits, NULL, c) == v->number);
    }
    if (v->type == JSON_STRING) {
        char *text = NULL;
        size_t length = 0, capacity = 0;
        assert(json_append_string(&text, &length, &capacity, v->string) == 0);
        json_value back;
        assert(json_parse(text, length, &back) == 0 && back.type == JSON_STRING && strcmp(back.string, v->string) == 0);
        json_free(&back);
        free(text);
    }
    for (size_t i = 0; i < v->count; i++) check_strings(&v->items[i]);
}

/* The input as the reply to a call, then the end of the connection. */
static void as_reply(const uint8_t *data, size_t size) {
    if (size > 65536) return;
    int pair[2];
    assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    assert(send(pair[1], data, size, MSG_NOSIGNAL) == (ssize_t)size);
    shutdown(pair[1], SHUT_WR);
    bgtask_app app = {.call_fd = pair[0], .connected = true, .timeout_usec = 10 * 1000 * 1000};
    uint64_t start = now_ns();
    json_value reply;
    int r = call(&app, "GetTimeRemaining", "{}", &reply);
    assert(now_ns() - start < NSEC_PER_SEC);  /* the end of input is an answer, not a wait */
    if (r == 0) json_free(&reply);
    if (app.call_fd >= 0) close(app.call_fd);
    close(pair[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool localized;
    if (!localized) {
        setlocale(LC_ALL, "");  /* LC_ALL and LOCPATH from scripts/fuzz */
        localized = true;
    }
    as_reply(data, size);
    bgtask_app *app = calloc(1, sizeof(*app));
    app->n_ref = 1;
    app->socket_path = strdup("/nonexistent/io.bgtaskd");
    app->pending_ends = calloc(MAX_PENDING_ENDS, sizeof(uint64_t));
    app->epoll_fd = app->timer_fd = app->subscription_fd = app->call_fd = app->send_fd = -1;
    app->reconnect_delay = RECONNECT_FIRST;
    app->connected = true;
    app->tasks = calloc(8, sizeof(task));
    app->tasks_capacity = 8;
    for (uint64_t id = 1; id <= 3; id++) app->tasks[app->n_tasks++] = (task){.id = id, .handler = expired};
    memset(handled, 0, sizeof(handled));

    const char *text = (const char *)data;
    size_t start = 0;
    for (size_t i = 0; i <= size && app->n_ref; i++) {
        if (i < size && text[i] != 0) continue;
        json_value message;
        if (json_parse(text + start, i - start, &message) == 0) {
            check_strings(&message);
            if (state_receive(app, &message, (uint64_t)i * 1000000) < 0) state_lost(app, (uint64_t)i * 1000000);
            json_free(&message);
            run_expiries(app);
            state_tick(app, (uint64_t)i * 1000000);
            app->n_outbox = 0;  /* sent nowhere: the rules alone are under test here */
            run_expiries(app);
        }
        start = i + 1;
    }
    uint64_t id;
    assert(bgtask_begin(app, "x", expired, NULL, &id) < 0 || id > 0);
    double left;
    assert(bgtask_time_remaining(app, &left) == 0 && left >= 0);
    bgtask_app_unref(app);
    return 0;
}
