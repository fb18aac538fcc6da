/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bgtask-scheduled.c: scheduled work in C (iOS's BGTaskScheduler), with libbgtask.
 *
 *     cc -o bgtask-scheduled bgtask-scheduled.c $(pkg-config --cflags --libs bgtask)
 *     BGTASKD_SOCKET=/run/user/$UID/bgtaskd/io.bgtaskd ./bgtask-scheduled 5 &
 *     bgtaskctl background $!       # suspended; in 5 s bgtaskd wakes it for its refresh
 *
 * It asks for a refresh no earlier than SECONDS from now, then waits for bgtaskd. Launched,
 * it does its refresh (a line), asks for the next one and completes the launch: bgtaskd
 * suspends it again at once. Each step is one line on stdout.
 */
#include <bgtask.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double every = 5;

static void submit(bgtask_app *app) {
    int r = bgtask_submit(app, "org.example.refresh", BGTASK_REQUEST_REFRESH, every, 0, 0);
    printf("submitted a refresh in %.0fs: %s\n", every, r < 0 ? strerror(-r) : "ok");
    fflush(stdout);
}

static void launched(bgtask_app *app, const char *identifier, bgtask_request_kind kind, uint64_t task, void *userdata) {
    (void)userdata;
    printf("launched %s (%s, task %llu): refreshed\n", identifier, kind == BGTASK_REQUEST_PROCESSING ? "processing" : "refresh",
           (unsigned long long)task);
    fflush(stdout);
    submit(app);  /* the next one, before completing: completed, the app is suspended at once */
    int r = bgtask_set_task_completed(app, identifier, 1);
    if (r < 0) printf("completing %s failed: %s\n", identifier, strerror(-r));
    fflush(stdout);
}

/* The window is ending before the work is done: stop it, and complete the launch as failed. */
static void expiring(bgtask_app *app, uint64_t task, bgtask_expiration_reason reason, const char *detail, void *userdata) {
    (void)task;
    (void)reason;
    (void)detail;
    (void)userdata;
    printf("launch expiring\n");
    fflush(stdout);
    bgtask_set_task_completed(app, "org.example.refresh", 0);
}

int main(int argc, char **argv) {
    if (argc > 1) every = atof(argv[1]);
    bgtask_app *app;
    int r = bgtask_app_new(&app, NULL);
    if (r < 0) {
        fprintf(stderr, "bgtask-scheduled: cannot reach bgtaskd: %s\n", strerror(-r));
        return 1;
    }
    bgtask_app_set_launch_handler(app, launched, expiring, NULL);
    printf("pid %d running\n", (int)getpid());
    submit(app);
    for (;;) {
        struct pollfd p = {bgtask_app_get_fd(app), POLLIN, 0};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) break;
        if ((r = bgtask_app_process(app)) < 0) {
            fprintf(stderr, "bgtask-scheduled: %s\n", strerror(-r));
            break;
        }
    }
    bgtask_app_unref(app);
    return 1;
}
