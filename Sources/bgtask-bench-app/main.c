/*
 * bgtask-bench-app: the smallest possible app, for the benchmark's 10,000 apps.
 *
 *   bgtask-bench-app SOCKET TASKS [subscribe]
 *
 * Begins TASKS background tasks (pipelined BeginTask calls, no "more", so they outlive the
 * connection), closes that connection, optionally keeps a Subscribe stream open (and never
 * finishes a transition), writes "ok PID\n" to stdout, then waits for stdin to close and
 * exits. Written in C so that 10,000 of them fit in little memory.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int connect_to(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (fd < 0 || strlen(path) >= sizeof(address.sun_path)) return -1;
    strcpy(address.sun_path, path);
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0) return -1;
    return fd;
}

static int write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n <= 0) return -1;
        data += n;
        length -= (size_t)n;
    }
    return 0;
}

/* Reads until `count` NUL-terminated replies arrived; fails on an error reply. */
static int read_replies(int fd, int count) {
    char buffer[4096];
    int seen = 0;
    while (seen < count) {
        ssize_t n = read(fd, buffer, sizeof(buffer));
        if (n <= 0) return -1;
        for (ssize_t i = 0; i < n; i++) seen += buffer[i] == 0;
        if (memmem(buffer, (size_t)n, "\"error\"", 7)) return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bgtask-bench-app SOCKET TASKS [subscribe]\n");
        return 2;
    }
    int tasks = atoi(argv[2]);
    int fd = connect_to(argv[1]);
    if (fd < 0) { perror("connect"); return 1; }
    static const char call[] =
        "{\"method\":\"io.bgtaskd.App.BeginTask\",\"parameters\":{\"name\":\"bench\",\"expirationHandler\":true}}";
    for (int i = 0; i < tasks; i++) {
        if (write_all(fd, call, sizeof(call)) < 0) { perror("write"); return 1; }  /* sizeof includes the NUL */
    }
    if (read_replies(fd, tasks) < 0) { fprintf(stderr, "BeginTask failed\n"); return 1; }
    close(fd);
    int subscription = -1;
    if (argc > 3 && strcmp(argv[3], "subscribe") == 0) {
        static const char subscribe[] = "{\"method\":\"io.bgtaskd.App.Subscribe\",\"more\":true}";
        subscription = connect_to(argv[1]);
        if (subscription < 0 || write_all(subscription, subscribe, sizeof(subscribe)) < 0 ||
            read_replies(subscription, 1) < 0) { fprintf(stderr, "Subscribe failed\n"); return 1; }
    }
    char line[32];
    int length = snprintf(line, sizeof(line), "ok %d\n", (int)getpid());
    write_all(1, line, (size_t)length);
    char byte;
    while (read(0, &byte, 1) > 0) {}
    return 0;
}
