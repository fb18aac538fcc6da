/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask's internals, shared by its three files (bgtask.c: the API; bgtask-io.c: the
 * sockets and calls; bgtask-state.c: what bgtaskd says, the tasks and the deadlines). Not
 * installed; nothing here is exported (-fvisibility=hidden and libbgtask.sym). */
#ifndef BGTASK_INTERNAL_H
#define BGTASK_INTERNAL_H

#include "bgtask.h"
#include "json.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* bgtask-io.c */
uint64_t now_ns(void);
void close_fd(bgtask_app *app, int *fd);
int watch(bgtask_app *app, int fd, uint32_t events, uint64_t token, int op);
/* A non-blocking connection (a full backlog is -EAGAIN at once, not a wait). */
int connect_socket(const char *path);
int buffer_append(buffer *b, const char *data, size_t n);
void buffer_consume(buffer *b, size_t n);
int flush_out(int fd, buffer *b);
int read_available(int fd, buffer *b);
int append(char **buffer, size_t *length, size_t *capacity, const char *text);
int send_call(bgtask_app *app, const char *method, const char *parameters);
void send_end(bgtask_app *app, uint64_t id);
int call(bgtask_app *app, const char *method, const char *parameters, json_value *reply);

/* bgtask-state.c */
task *find_task(bgtask_app *app, uint64_t id);
void remove_task(bgtask_app *app, task *t);
void run_expiries(bgtask_app *app);
void arm_timer(bgtask_app *app);
void lost(bgtask_app *app, uint64_t now);
void tick(bgtask_app *app, uint64_t now);
void read_subscription(bgtask_app *app, uint64_t now);
void read_send_replies(bgtask_app *app);

#endif
