/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libbgtask: background tasks from bgtaskd, for any program that can call C.
 *
 * The shape is UIKit's (beginBackgroundTask(withName:expirationHandler:), endBackgroundTask,
 * backgroundTimeRemaining, applicationDidEnterBackground / WillEnterForeground) in
 * libsystemd's manner: an object with a reference count, negative errno returns, callbacks
 * with a void *userdata, and one file descriptor to poll.
 *
 *     bgtask_app *app;
 *     int r = bgtask_app_new(&app, NULL);          // $BGTASKD_SOCKET, else per-user, else system
 *     bgtask_app_set_handlers(app, entered_background, entering_foreground, state);
 *     for (;;) {                                    // or sd_event_add_io(..., bgtask_app_get_fd(app), EPOLLIN, ...)
 *         struct pollfd p = { bgtask_app_get_fd(app), POLLIN, 0 };
 *         poll(&p, 1, -1);
 *         bgtask_app_process(app);                  // runs the callbacks that are due
 *     }
 *
 * The library is not thread-safe: call it from one thread (the one that runs your loop).
 * Callbacks run only from bgtask_app_process(), and may call any function here.
 *
 * Events never block: they arrive on the descriptor of bgtask_app_get_fd(), which also
 * wakes the loop for the library's own deadlines (finishing a transition, reconnecting).
 * bgtask_begin() and bgtask_end() are one round trip each to the local daemon (like
 * sd_bus_call()), bounded by a timeout (bgtask_app_set_timeout(), 5 s by default).
 */
#ifndef BGTASK_H
#define BGTASK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bgtask_app bgtask_app;

/* Why an expiration handler runs. It runs at most once per task, and never after the task
 * was ended with bgtask_end(). */
typedef enum bgtask_expiration_reason {
    /* Background time is nearly up (bgtaskd's ExpirationWarningSec): end the task now. */
    BGTASK_EXPIRATION_EXPIRING = 1,
    /* The time ran out before the handler could run (the task is over). */
    BGTASK_EXPIRATION_EXPIRED = 2,
    /* bgtaskd denied the task (detail: why, e.g. "suspendedBeforeGrant"). */
    BGTASK_EXPIRATION_DENIED = 3,
    /* bgtaskd went away and did not come back holding the task in time. */
    BGTASK_EXPIRATION_DAEMON_UNAVAILABLE = 4,
} bgtask_expiration_reason;

/* The app's state, as bgtaskd last reported it (UIApplication.State). */
typedef enum bgtask_state {
    BGTASK_STATE_ACTIVE = 0,     /* foreground (also while disconnected) */
    BGTASK_STATE_INACTIVE = 1,   /* while the will_enter_foreground handler runs */
    BGTASK_STATE_BACKGROUND = 2,
} bgtask_state;

/* applicationDidEnterBackground / applicationWillEnterForeground. When the first returns,
 * the library tells bgtaskd the transition is done, as soon as every task begun in it has
 * been granted (or just before the transition's timeout): the tasks must not be denied for
 * an app that was simply quick. */
typedef void (*bgtask_lifecycle_handler_t)(bgtask_app *app, void *userdata);

/* A task's expiration handler: end the task (bgtask_end) and stop its work. `detail` is
 * NULL or a word from bgtaskd (the denial's reason). */
typedef void (*bgtask_expiration_handler_t)(bgtask_app *app, uint64_t id, bgtask_expiration_reason reason,
                                            const char *detail, void *userdata);

/* A manager woke the app (bgtaskctl wake; a silent push, a background fetch): `reason` is
 * the manager's word, `payload` a JSON object's text or NULL. Call bgtask_finish_wake()
 * when done (the completion handler); tasks begun meanwhile keep the app running. */
typedef void (*bgtask_wake_handler_t)(bgtask_app *app, const char *reason, const char *payload, void *userdata);

/* Connects to bgtaskd at `socket_path` (NULL: $BGTASKD_SOCKET, else the per-user daemon's
 * $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd where one answers as this user or root, else
 * /run/bgtaskd/io.bgtaskd)
 * and subscribes to this process's app. Returns 0, or -errno if the daemon cannot be
 * reached (-ENOENT, -ECONNREFUSED, -ETIMEDOUT, ...). Later losses of the daemon are not
 * errors: the library reconnects by itself. */
int bgtask_app_new(bgtask_app **ret, const char *socket_path);
bgtask_app *bgtask_app_ref(bgtask_app *app);
/* Drops a reference; the last closes the connections. Outstanding handlers do not run.
 * Returns NULL. */
bgtask_app *bgtask_app_unref(bgtask_app *app);

/* Sets (or, with NULL, clears) the lifecycle handlers. Returns 0 or -EINVAL. */
int bgtask_app_set_handlers(bgtask_app *app, bgtask_lifecycle_handler_t did_enter_background,
                            bgtask_lifecycle_handler_t will_enter_foreground, void *userdata);
/* Sets (or clears) the wake handler. Without one, a wake is finished at once. */
int bgtask_app_set_wake_handler(bgtask_app *app, bgtask_wake_handler_t did_wake, void *userdata);
/* The bound on each call's round trip, in microseconds (default 5,000,000). */
int bgtask_app_set_timeout(bgtask_app *app, uint64_t usec);

/* The descriptor to poll for POLLIN (an epoll instance: stable across reconnections). */
int bgtask_app_get_fd(bgtask_app *app);
/* Reads what arrived, runs the handlers that are due, and does what is due (finishing a
 * transition, reconnecting). Never blocks. Returns 0, or -errno on a failure of the
 * library's own descriptors. */
int bgtask_app_process(bgtask_app *app);

/* BGTASK_STATE_*, or -EINVAL. */
int bgtask_app_get_state(bgtask_app *app);
/* 1 while subscribed to bgtaskd, 0 while it is away, or -EINVAL. */
int bgtask_app_is_connected(bgtask_app *app);
/* The Varlink error name of the last call that failed with one, or NULL. */
const char *bgtask_app_get_error(bgtask_app *app);

/* Begins a background task. The grant follows after bgtaskd's latency. `expiration` runs
 * once, from bgtask_app_process(), if the task expires, is denied, or the daemon goes away.
 * Returns 0 with the task's id in *ret_id, or -errno: -ENOTCONN (no daemon), -ETIME (no
 * background time left), -EDQUOT (a limit), -EAGAIN (bgtaskd cannot record it now),
 * -EINVAL (a bad name), -ETIMEDOUT, -EPROTO. */
int bgtask_begin(bgtask_app *app, const char *name, bgtask_expiration_handler_t expiration, void *userdata,
                 uint64_t *ret_id);
/* Ends a task. Returns 0 (also for a task bgtaskd already ended), -ENOENT for an id that is
 * not (or no longer) one of this app's tasks. While bgtaskd is away the end is sent once
 * it is back. */
int bgtask_end(bgtask_app *app, uint64_t id);
/* Seconds of background time left, counting down locally from bgtaskd's last word:
 * INFINITY in the foreground, while disconnected, or for an exempt app. Returns 0. */
int bgtask_time_remaining(bgtask_app *app, double *ret_seconds);
/* Tells bgtaskd now that the background transition is done, without waiting for pending
 * grants (tasks still pending are then denied). Returns 1 if a transition was in
 * progress, 0 if not. */
int bgtask_finish_transition(bgtask_app *app);
/* The wake's completion handler: bgtaskd is told once no task begun is waiting for its
 * grant. Returns 1 if a wake was in progress, 0 if not. */
int bgtask_finish_wake(bgtask_app *app);

/* ---- Scheduled work (iOS's BGTaskScheduler; since LIBBGTASK_0.1) ---- */

/* BGAppRefreshTaskRequest (a short window) or BGProcessingTaskRequest (a long one). */
typedef enum bgtask_request_kind {
    BGTASK_REQUEST_REFRESH = 1,
    BGTASK_REQUEST_PROCESSING = 2,
} bgtask_request_kind;

/* A processing request's conditions (bgtask_submit's flags). */
enum {
    BGTASK_REQUIRES_EXTERNAL_POWER = 1 << 0,
    BGTASK_REQUIRES_NETWORK = 1 << 1,
};

/* A request was launched: do its work, then call bgtask_set_task_completed(). The launch
 * is the task `task_id`: the expiration handler given with this one runs for it, once, when
 * its window is about to end. */
typedef void (*bgtask_launch_handler_t)(bgtask_app *app, const char *identifier, bgtask_request_kind kind,
                                        uint64_t task_id, void *userdata);

/* Sets the handler of every launch, and the expiration handler of their tasks. */
int bgtask_app_set_launch_handler(bgtask_app *app, bgtask_launch_handler_t launch, bgtask_expiration_handler_t expiration,
                                  void *userdata);
/* Asks to be launched no earlier than `earliest_begin` seconds from now, when `flags`'
 * conditions hold; `interval` (at least 900 s, or 0) makes it periodic. Both count the time
 * the machine sleeps (a request due while it slept runs as it wakes). Replaces a pending
 * request with the same identifier. Returns 0 or -errno: -EBUSY (as many of that kind
 * pending as allowed: 1 refresh, 10 processing), -EINVAL (a bad identifier or value),
 * -EDQUOT (a limit), -ENOTCONN. */
int bgtask_submit(bgtask_app *app, const char *identifier, bgtask_request_kind kind, double earliest_begin,
                  unsigned flags, double interval);
/* Cancels the pending request `identifier`, or every one with NULL. Returns 0 or -errno. */
int bgtask_cancel_request(bgtask_app *app, const char *identifier);
/* The launch of `identifier` is done (BGTask.setTaskCompleted): its task ends, and its
 * expiration handler will not run. Returns 0, -ENOENT (no such launch), or -errno. */
int bgtask_set_task_completed(bgtask_app *app, const char *identifier, int success);

#ifdef __cplusplus
}
#endif

#endif
