/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bgtask-bench-logind: the peer in the benchmark. N times, over sd-bus (the system bus):
 * logind's Inhibit (what "sleep", mode "delay": a delay inhibitor lock, the nearest thing
 * Linux has to a background task), close the lock's file descriptor, then one more call
 * (ListInhibitors), so each sample is a take-and-release pair like BeginTask + EndTask.
 * Prints each sample in microseconds, one per line.
 *
 *   bgtask-bench-logind N
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <systemd/sd-bus.h>

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

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 1000;
    sd_bus *bus = NULL;
    if (sd_bus_open_system(&bus) < 0) { fprintf(stderr, "cannot connect to the system bus\n"); return 1; }
    for (int i = 0; i < count / 10; i++) if (pair(bus) < 0) return 1;  /* warm up */
    for (int i = 0; i < count; i++) {
        double start = now_us();
        if (pair(bus) < 0) return 1;
        printf("%.3f\n", now_us() - start);
    }
    sd_bus_flush_close_unref(bus);
    return 0;
}
