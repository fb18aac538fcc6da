/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libbgtask against a broken or hostile peer (finding 11 of the second review), built with
 * ASan and UBSan by Tests/EndToEndTests/CLibraryHostilePeerTests.swift, which reads what it
 * prints: one "ok NAME" or "fail NAME: why" a check. A child process plays the daemon on a
 * socket of its own, answering each call on a connection with what the check needs; at
 * exit LeakSanitizer fails the run if anything leaked.
 *
 *   hostile_peer_test DIR   (DIR: a directory for the socket; LC_ALL may name a locale whose
 *                            decimal point is a comma, found through LOCPATH)
 */
#define _GNU_SOURCE
#include "bgtask-internal.h"

#include <errno.h>
#include <locale.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
static void check(int condition, const char *name, const char *why) {
    if (condition) printf("ok %s\n", name);
    else { printf("fail %s: %s\n", name, why); failures++; }
    fflush(stdout);
}

/* The library's reads and timer settings, counted: the test is linked with
 * -Wl,--wrap=recv,--wrap=timerfd_settime, so the library's calls come here first. */
static int recvs, timer_sets;
ssize_t __real_recv(int fd, void *buffer, size_t length, int flags);
ssize_t __wrap_recv(int fd, void *buffer, size_t length, int flags) {
    recvs++;
    return __real_recv(fd, buffer, length, flags);
}
int __real_timerfd_settime(int fd, int flags, const struct itimerspec *value, struct itimerspec *old);
int __wrap_timerfd_settime(int fd, int flags, const struct itimerspec *value, struct itimerspec *old) {
    timer_sets++;
    return __real_timerfd_settime(fd, flags, value, old);
}

/* The peer: for each connection, reads one message, then writes `answer` (of `length`
 * bytes) and, if `hang_up`, closes; else waits for the next message. */
static pid_t start_peer(const char *path, const char *answer, size_t length, int hang_up) {
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", path);
    unlink(path);
    if (bind(listener, (struct sockaddr *)&address, sizeof(address)) < 0 || listen(listener, 16) < 0) {
        perror("peer");
        exit(2);
    }
    pid_t pid = fork();
    if (pid != 0) {
        close(listener);
        return pid;
    }
    /* Gone with the test (an ASan abort included): it holds the test's output open. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) _exit(0);
        char buffer[65536];
        for (;;) {
            ssize_t n = read(fd, buffer, sizeof(buffer));
            if (n <= 0) break;
            if (write(fd, answer, length) < 0) break;
            if (hang_up) break;
        }
        close(fd);
    }
}

static void stop_peer(pid_t pid) {
    kill(pid, SIGKILL);  /* our own child, just forked */
    waitpid(pid, NULL, 0);
}

static bgtask_app *fake_app(const char *path) {
    bgtask_app *app = calloc(1, sizeof(*app));
    app->socket_path = strdup(path);
    app->epoll_fd = app->timer_fd = app->subscription_fd = app->call_fd = app->send_fd = -1;
    app->connected = true;
    app->timeout_usec = 2 * 1000 * 1000;
    return app;
}

static void free_app(bgtask_app *app) {
    if (app->call_fd >= 0) close(app->call_fd);
    free(app->socket_path);
    free(app);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char path[256];
    snprintf(path, sizeof(path), "%s/peer.sock", argv[1]);

    /* An extra message after each reply: the call is out of step (-EPROTO), and the reply it
     * parsed is freed (it leaked: 2,000 calls, 394 MB). */
    static const char extra[] = "{\"parameters\":{\"state\":\"foreground\"}}\0{\"parameters\":{}}";
    pid_t peer = start_peer(path, extra, sizeof(extra), 0);
    bgtask_app *app = fake_app(path);
    int refused = 0;
    for (int i = 0; i < 2000; i++) {
        json_value reply;
        if (call(app, "GetTimeRemaining", "{}", &reply) == -EPROTO) refused++;
    }
    check(refused == 2000, "extra-message-is-out-of-step", "a call with two replies was not -EPROTO");
    free_app(app);
    stop_peer(peer);

    /* Half a reply, then the end: an error at once, not a spin at 100% CPU until the timeout. */
    static const char half[] = "{\"parameters\":{\"sta";
    peer = start_peer(path, half, sizeof(half) - 1, 1);
    app = fake_app(path);
    json_value reply;
    int r = call(app, "GetTimeRemaining", "{}", &reply);
    char why[64];
    snprintf(why, sizeof(why), "returned %d, not -ECONNRESET", r);
    check(r == -ECONNRESET, "end-mid-reply-is-an-error", why);
    free_app(app);
    stop_peer(peer);

    /* An error reply: its errno is read before the reply is freed (it was read after: a use
     * after free ASan reports, found by the fuzzer, and a wrong errno whenever the memory had
     * been reused). */
    static const char denied[] = "{\"error\":\"io.bgtaskd.App.NoSuchTask\",\"parameters\":{\"taskId\":7}}";
    peer = start_peer(path, denied, sizeof(denied), 0);
    app = fake_app(path);
    r = call(app, "EndTask", "{\"taskId\":7}", &reply);
    snprintf(why, sizeof(why), "returned %d, not -ENOENT", r);
    check(r == -ENOENT && strcmp(app->last_error, "io.bgtaskd.App.NoSuchTask") == 0, "error-reply-errno", why);
    free_app(app);
    stop_peer(peer);

    /* Numbers whatever the app's locale: under de_DE.UTF-8 every fraction was -EBADMSG. */
    const char *locale = setlocale(LC_ALL, "");
    if (locale && strcmp(localeconv()->decimal_point, ",") == 0) {
        static const char message[] = "{\"transitionTimeout\":5.0,\"backgroundTimeRemaining\":2.5e1}";
        json_value value;
        int parsed = json_parse(message, sizeof(message) - 1, &value);
        double timeout = 0, remaining = 0;
        if (parsed == 0) {
            json_get_number(&value, "transitionTimeout", &timeout);
            json_get_number(&value, "backgroundTimeRemaining", &remaining);
            json_free(&value);
        }
        check(parsed == 0 && timeout == 5.0 && remaining == 25.0, "numbers-in-a-comma-locale",
              parsed ? "not parsed" : "parsed wrong");
    } else {
        printf("skip numbers-in-a-comma-locale: no locale with a decimal comma (LC_ALL=%s)\n", getenv("LC_ALL"));
    }

    /* A reply that came whole is one read: a read shorter than asked took all there was (a
     * second read only to hear EAGAIN was a system call more per call). */
    static const char empty[] = "{\"parameters\":{}}";
    peer = start_peer(path, empty, sizeof(empty), 0);
    app = fake_app(path);
    int answered = 0;
    recvs = 0;
    for (int i = 0; i < 100; i++) {
        if (call(app, "GetTimeRemaining", "{}", &reply) == 0) {
            answered++;
            json_free(&reply);
        }
    }
    snprintf(why, sizeof(why), "%d of 100 answered in %d reads", answered, recvs);
    check(answered == 100 && recvs == 100, "a-reply-is-one-read", why);
    free_app(app);
    stop_peer(peer);

    /* The timer is set when its deadline changes, not at every settle (three timerfd_settime
     * a Begin+End pair before). */
    app = fake_app(path);
    app->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    app->wake = true;
    app->wake_finish_by = now_ns() + 10 * NSEC_PER_SEC;
    timer_sets = 0;
    for (int i = 0; i < 100; i++) settle(app, now_ns());
    int once = timer_sets;
    app->wake_finish_by += NSEC_PER_SEC;
    settle(app, now_ns());
    int moved = timer_sets;
    app->wake = false;
    for (int i = 0; i < 100; i++) settle(app, now_ns());
    struct itimerspec left;
    timerfd_gettime(app->timer_fd, &left);
    snprintf(why, sizeof(why), "set %d, %d, %d times; left armed: %d", once, moved, timer_sets,
             left.it_value.tv_sec || left.it_value.tv_nsec);
    check(once == 1 && moved == 2 && timer_sets == 3 && !left.it_value.tv_sec && !left.it_value.tv_nsec,
          "timer-set-only-when-its-deadline-changes", why);
    close(app->timer_fd);
    free_app(app);

    unlink(path);
    return failures ? 1 : 0;
}
