/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bgtask-example.c: the whole background cycle in C, with libbgtask.
 *
 *     cc -o bgtask-example bgtask-example.c $(pkg-config --cflags --libs bgtask)
 *     BGTASKD_SOCKET=/run/user/$UID/bgtaskd/io.bgtaskd ./bgtask-example &
 *     bgtaskctl background $!
 *
 * Sent to the background, it begins an "upload" task in did_enter_background and uploads a
 * chunk every 100 ms; when its time is nearly up the expiration handler ends the task, and
 * bgtaskd suspends the app (State: T in /proc). bgtaskctl foreground PID brings it back.
 * Each step is one line on stdout.
 */
#include <bgtask.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static struct {
    bgtask_app *app;
    uint64_t upload;  /* 0: none */
    int chunks, expirations;
} state;

static void say(const char *line) {
    printf("%s\n", line);
    fflush(stdout);
}

static void expired(bgtask_app *app, uint64_t id, bgtask_expiration_reason reason, const char *detail, void *userdata) {
    (void)userdata;
    state.expirations++;
    printf("expiration handler: task %llu, reason %d%s%s, after %d chunks\n", (unsigned long long)id, (int)reason,
           detail ? ", " : "", detail ? detail : "", state.chunks);
    fflush(stdout);
    int r = bgtask_end(app, id);
    printf("ended task %llu: %s\n", (unsigned long long)id, r < 0 ? strerror(-r) : "ok");
    fflush(stdout);
    state.upload = 0;
}

static void entered_background(bgtask_app *app, void *userdata) {
    (void)userdata;
    double left;
    bgtask_time_remaining(app, &left);
    printf("entered the background with %.1fs of background time\n", left);
    int r = bgtask_begin(app, "upload", expired, NULL, &state.upload);
    if (r < 0) {
        printf("no background task: %s (%s)\n", strerror(-r), bgtask_app_get_error(app) ? bgtask_app_get_error(app) : "-");
        state.upload = 0;
    } else {
        printf("began background task %llu\n", (unsigned long long)state.upload);
    }
    fflush(stdout);
}

static void entering_foreground(bgtask_app *app, void *userdata) {
    (void)app;
    (void)userdata;
    printf("back in the foreground after %d chunks\n", state.chunks);
    fflush(stdout);
}

int main(void) {
    int r = bgtask_app_new(&state.app, NULL);
    if (r < 0) {
        fprintf(stderr, "bgtask-example: cannot reach bgtaskd: %s\n", strerror(-r));
        return 1;
    }
    bgtask_app_set_handlers(state.app, entered_background, entering_foreground, NULL);
    printf("pid %d running in the foreground\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        struct pollfd p = {bgtask_app_get_fd(state.app), POLLIN, 0};
        /* Work while a task is held: a chunk every 100 ms; otherwise wait for bgtaskd. */
        if (poll(&p, 1, state.upload ? 100 : -1) < 0 && errno != EINTR) break;
        if (state.upload) state.chunks++;
        if ((r = bgtask_app_process(state.app)) < 0) {
            fprintf(stderr, "bgtask-example: %s\n", strerror(-r));
            break;
        }
    }
    bgtask_app_unref(state.app);
    return 1;
}
