/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bgtask-bench-logind: the peer in the benchmark. N times, over sd-bus (the system bus):
 * logind's Inhibit (what "sleep", mode "delay": a delay inhibitor lock, the nearest thing
 * Linux has to a background task), close the lock's file descriptor, then one more call
 * (ListInhibitors), so each sample is a take-and-release pair like BeginTask + EndTask.
 * Prints each sample in microseconds, one per line.
 *
 *   bgtask-bench-logind N
 *
 * With --lock, the session lock: ROUNDS times, the session's LockedHint set (as a screen
 * locker sets it) and the time until every one of the PIDs (every process of the session's
 * apps, which bgtask-session suspends through bgtaskd: the first ROOTS are the windows' own,
 * the rest their descendants) is stopped, read from /proc/PID/stat; then the hint cleared and
 * every one running again, timed too. Then the baseline, the same ROUNDS on the same
 * processes: SIGSTOP sent to each through a pidfd opened before, timed the same way until
 * every one is stopped, then SIGCONT, timed until every one runs; and the same for the ROOTS
 * alone. Prints "lock MS", "unlock MS", "loop MS", "loop-continue MS", "roots MS" and
 * "roots-continue MS" lines, and after each "lock" line a "lock-start MS" line: when that
 * lock began, in CLOCK_MONOTONIC milliseconds, to find each lock in a trace of the machine
 * (scripts/bench-lock's BENCH_LOCK_KEEP keeps the lines). With BENCH_DAEMON_PID, the first round holds the lock for 6 s
 * once every process is stopped, and the last 5 s of it give that process's wake-ups and
 * CPU (all its threads, from /proc) while nothing happens: "locked-wakeups PER-SECOND" and
 * "locked-cpu MS-PER-SECOND" lines.
 *
 *   bgtask-bench-logind --lock SESSION-PATH ROUNDS ROOTS PID...
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <systemd/sd-bus.h>
#include <signal.h>
#include <string.h>
#include <fcntl.h>
#include <dirent.h>
#include <sys/syscall.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int pair(sd_bus *bus) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int r = sd_bus_call_method(bus, "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager",
                               "Inhibit", &error, &reply, "ssss", "sleep", "bgtaskd-bench", "benchmark", "delay");
    if (r < 0) { fprintf(stderr, "Inhibit: %s\n", error.message ? error.message : "failed"); sd_bus_error_free(&error); return r; }
    int fd = -1;
    r = sd_bus_message_read(reply, "h", &fd);
    if (r < 0 || fd < 0) { fprintf(stderr, "Inhibit: no file descriptor\n"); sd_bus_message_unref(reply); return -1; }
    sd_bus_message_unref(reply);  /* the message owns the lock's fd: this closes it, releasing the lock */
    reply = NULL;
    r = sd_bus_call_method(bus, "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager",
                           "ListInhibitors", &error, &reply, "");
    if (r < 0) { fprintf(stderr, "ListInhibitors: %s\n", error.message ? error.message : "failed"); sd_bus_error_free(&error); return r; }
    sd_bus_message_unref(reply);
    return 0;
}

/* The state letter of /proc/PID/stat (after the command's closing parenthesis). */
static char state_of(int pid) {
    char path[64], buffer[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return '?';
    ssize_t n = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (n <= 0) return '?';
    buffer[n] = 0;
    char *end = strrchr(buffer, ')');
    return end && end[1] == ' ' ? end[2] : '?';
}

/* Waits until every pid is stopped (or, stopped == 0, none is); gives up after 10 s. Rests
 * 200 µs after each sweep that found one not there yet: on two CPUs a busy poll would take
 * one of them from the processes it waits for (logind, the bus, the agent, bgtaskd). The
 * same for the lock and the loop. */
static int await_all(const int *pids, int count, int stopped) {
    double give_up = now_us() + 10e6;
    int next = 0;
    for (;;) {
        while (next < count && (state_of(pids[next]) == 'T') == stopped) next++;
        if (next == count) return 0;
        if (now_us() > give_up) return -1;
        usleep(200);
    }
}

static int set_locked(sd_bus *bus, const char *session, int locked) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int r = sd_bus_call_method(bus, "org.freedesktop.login1", session, "org.freedesktop.login1.Session", "SetLockedHint",
                               &error, NULL, "b", locked);
    if (r < 0) fprintf(stderr, "SetLockedHint: %s\n", error.message ? error.message : strerror(-r));
    sd_bus_error_free(&error);
    return r;
}

/* Between rounds: the apps continued catch up with their compositor (200 windows redrawn)
 * before the next lock, so that a round measures the lock, not that. */
static const useconds_t settle = 500000;

/* ROUNDS of SIGSTOP through `pidfds` to the first `count`, timed until all are stopped, then
 * SIGCONT; each printed as "LABEL MS". */
static int loop_rounds(const char *label, int rounds, const int *pids, const int *pidfds, int count) {
    for (int round = 0; round < rounds; round++) {
        double start = now_us();
        for (int i = 0; i < count; i++) syscall(SYS_pidfd_send_signal, pidfds[i], SIGSTOP, NULL, 0);
        if (await_all(pids, count, 1) < 0) return 1;
        printf("%s %.3f\n", label, (now_us() - start) / 1e3);
        start = now_us();
        for (int i = 0; i < count; i++) syscall(SYS_pidfd_send_signal, pidfds[i], SIGCONT, NULL, 0);
        if (await_all(pids, count, 0) < 0) return 1;
        printf("%s-continue %.3f\n", label, (now_us() - start) / 1e3);
        usleep(settle);
    }
    return 0;
}

/* The context switches (voluntary and not) and CPU nanoseconds of every thread of `pid`,
 * summed; -1 when it cannot be read. */
static int counters_of(int pid, double *switches, double *cpu_ns) {
    char path[128], line[256];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks) return -1;
    *switches = 0;
    *cpu_ns = 0;
    for (struct dirent *task; (task = readdir(tasks));) {
        if (task->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%d/task/%s/status", pid, task->d_name);
        FILE *status = fopen(path, "re");
        if (!status) continue;
        while (fgets(line, sizeof line, status)) {
            unsigned long long n;
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &n) == 1 || sscanf(line, "nonvoluntary_ctxt_switches: %llu", &n) == 1)
                *switches += (double)n;
        }
        fclose(status);
        snprintf(path, sizeof path, "/proc/%d/task/%s/schedstat", pid, task->d_name);
        FILE *schedstat = fopen(path, "re");
        unsigned long long ns;
        if (schedstat && fscanf(schedstat, "%llu", &ns) == 1) *cpu_ns += (double)ns;
        if (schedstat) fclose(schedstat);
    }
    closedir(tasks);
    return 0;
}

/* With the session locked and every process stopped: the daemon's wake-ups and CPU a second
 * over `seconds`, after a second for what the lock started to end. */
static void hold_locked(int daemon, int seconds) {
    double switches0, cpu0, switches1, cpu1;
    sleep(1);
    double start = now_us();
    if (counters_of(daemon, &switches0, &cpu0) < 0) { fprintf(stderr, "cannot read /proc/%d\n", daemon); return; }
    sleep((unsigned)seconds);
    if (counters_of(daemon, &switches1, &cpu1) < 0) { fprintf(stderr, "cannot read /proc/%d\n", daemon); return; }
    double elapsed = (now_us() - start) / 1e6;
    printf("locked-wakeups %.1f\nlocked-cpu %.3f\n", (switches1 - switches0) / elapsed, (cpu1 - cpu0) / 1e6 / elapsed);
}

static int lock_rounds(const char *session, int rounds, const int *pids, int count, int roots) {
    sd_bus *bus = NULL;
    if (sd_bus_open_system(&bus) < 0) { fprintf(stderr, "cannot connect to the system bus\n"); return 1; }
    for (int round = 0; round < rounds; round++) {
        double start = now_us();
        if (set_locked(bus, session, 1) < 0) return 1;
        if (await_all(pids, count, 1) < 0) { fprintf(stderr, "round %d: not every app stopped within 10 s of the lock\n", round); return 1; }
        printf("lock %.3f\nlock-start %.3f\n", (now_us() - start) / 1e3, start / 1e3);
        const char *daemon = getenv("BENCH_DAEMON_PID");
        if (round == 0 && daemon && atoi(daemon) > 1) hold_locked(atoi(daemon), 5);
        start = now_us();
        if (set_locked(bus, session, 0) < 0) return 1;
        if (await_all(pids, count, 0) < 0) { fprintf(stderr, "round %d: not every app running again after the unlock\n", round); return 1; }
        printf("unlock %.3f\n", (now_us() - start) / 1e3);
        usleep(settle);
    }
    sd_bus_flush_close_unref(bus);
    int *pidfds = calloc((size_t)count, sizeof *pidfds);
    for (int i = 0; i < count; i++) {
        pidfds[i] = pids[i] > 1 ? (int)syscall(SYS_pidfd_open, pids[i], 0) : -1;
        if (pidfds[i] < 0) { fprintf(stderr, "pidfd_open(%d) failed\n", pids[i]); return 1; }
    }
    return loop_rounds("loop", rounds, pids, pidfds, count) || loop_rounds("roots", rounds, pids, pidfds, roots);
}

int main(int argc, char **argv) {
    if (argc > 4 && strcmp(argv[1], "--lock") == 0) {
        int count = argc - 5, roots = atoi(argv[4]);
        if (roots < 1 || roots > count) { fprintf(stderr, "ROOTS must be 1 to the number of PIDs\n"); return 2; }
        int *pids = calloc((size_t)count + 1, sizeof *pids);
        for (int i = 0; i < count; i++) pids[i] = atoi(argv[5 + i]);
        return lock_rounds(argv[2], atoi(argv[3]), pids, count, roots);
    }
    int count = argc > 1 ? atoi(argv[1]) : 1000;
    sd_bus *bus = NULL;
    if (sd_bus_open_system(&bus) < 0) { fprintf(stderr, "cannot connect to the system bus\n"); return 1; }
    for (int i = 0; i < count / 10; i++) if (pair(bus) < 0) return 1;  /* warm up */
    /* The samples printed after the last pair, as bgtaskd-bench --pairs keeps its own: no
     * work of the measuring client's between two pairs on the one CPU they share. */
    double *samples = calloc(count > 0 ? (size_t)count : 1, sizeof *samples);
    if (!samples) return 1;
    for (int i = 0; i < count; i++) {
        double start = now_us();
        if (pair(bus) < 0) return 1;
        samples[i] = now_us() - start;
    }
    for (int i = 0; i < count; i++) printf("%.3f\n", samples[i]);
    free(samples);
    sd_bus_flush_close_unref(bus);
    return 0;
}
