/* SPDX-License-Identifier: Apache-2.0 */
/* libbgtask's internals, shared by its three files (bgtask.c: the API; bgtask-io.c: the
 * sockets, calls and the timer; bgtask-state.c: the rules, pure: what bgtaskd says, the tasks
 * and the deadlines, with time as an argument). Not installed; nothing here is exported
 * (-fvisibility=hidden and libbgtask.sym). */
#ifndef BGTASK_INTERNAL_H
#define BGTASK_INTERNAL_H

#include "bgtask.h"
#include "bgtask-protocol.h"
#include "json.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

#define SYSTEM_SOCKET "/run/bgtaskd/io.bgtaskd"
#define NSEC_PER_MSEC 1000000ULL
#define NSEC_PER_SEC 1000000000ULL
#define FINISH_MARGIN BGTASK_FINISH_MARGIN_NS
#define RECONNECT_FIRST BGTASK_RECONNECT_FIRST_NS
#define RECONNECT_MAX BGTASK_RECONNECT_MAXIMUM_NS
#define RESTART_GRACE BGTASK_RESTART_GRACE_NS
#define MAX_MESSAGE BGTASK_MAXIMUM_MESSAGE_BYTES
#define MAX_PENDING_ENDS BGTASK_MAXIMUM_PENDING_ENDS

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
    /* A launch's task: the request's identifier (owned). */
    char *launch;
} task;

/* A call the rules want sent (bgtask-io.c's flush_outbox sends it, without waiting). */
typedef enum { OUT_FINISH_TRANSITION, OUT_FINISH_WAKE, OUT_END_TASK } out_kind;
typedef struct {
    out_kind kind;
    uint64_t id;
} out_call;

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
    uint64_t timer_armed;  /* the deadline the timer is set to; 0: none (arm_timer) */
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
    bgtask_launch_handler_t did_launch;
    bgtask_expiration_handler_t launch_expired;
    void *launch_userdata;

    expiry *expiries;
    size_t n_expiries, expiries_capacity;
    out_call *outbox;
    size_t n_outbox, outbox_capacity;
    char last_error[128];
};

/* bgtask-io.c: sockets, calls, the timer. */
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
int call(bgtask_app *app, const char *method, const char *parameters, json_value *reply);
/* The subscription broke: its connections closed, the rules told. */
void lost(bgtask_app *app, uint64_t now);
/* What is due at `now` done: a reconnection, the outbox sent, the timer armed. */
void settle(bgtask_app *app, uint64_t now);
void read_subscription(bgtask_app *app, uint64_t now);
void read_send_replies(bgtask_app *app);

/* bgtask-state.c: the rules. No descriptor, no clock, no system call: each function takes
 * the instant it happens at; calls to make go to the outbox; handlers to run to the
 * expiries. Tests/libbgtask/vectors.c runs the client vectors against these alone. */
task *find_task(bgtask_app *app, uint64_t id);
void run_expiries(bgtask_app *app);
uint64_t next_deadline(const bgtask_app *app);
/* A message of the subscription; -EPROTO if the stream must start again (an error reply,
 * no event). */
int state_receive(bgtask_app *app, const json_value *message, uint64_t now);
/* BeginTask returned `id`; -ENOMEM if it cannot be kept. */
int state_begun(bgtask_app *app, uint64_t id, bool granted, bgtask_expiration_handler_t handler, void *userdata);
/* The app ends `id`: -ENOENT unknown, 0 ended by bgtaskd already, 1 EndTask must go out. */
int state_end(bgtask_app *app, uint64_t id);
/* The task of the launch of `identifier`, or NULL. */
task *find_launch(bgtask_app *app, const char *identifier);
/* EndTask could not reach bgtaskd: sent once it is back. */
void state_end_undelivered(bgtask_app *app, uint64_t id);
void state_lost(bgtask_app *app, uint64_t now);
/* What is due at `now`; true if a reconnection is (bgtask-io.c makes it). */
bool state_tick(bgtask_app *app, uint64_t now);
void state_reconnect_failed(bgtask_app *app, uint64_t now);
/* bgtask_finish_transition: false if there was none. */
bool state_finish_transition(bgtask_app *app);
/* bgtask_finish_wake: false if there was none. */
bool state_wake_completed(bgtask_app *app, uint64_t now);
double state_time_remaining(const bgtask_app *app, uint64_t now);

#endif
