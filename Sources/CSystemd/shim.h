#ifndef BGTASKD_CSYSTEMD_SHIM_H
#define BGTASKD_CSYSTEMD_SHIM_H

#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <systemd/sd-journal.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/random.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/vfs.h>
#include <spawn.h>

/* Linux 6.5+; Debian 12's headers predate it. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* Declared by glibc only under _GNU_SOURCE, which the Swift Glibc module does not set. */
int accept4(int fd, struct sockaddr *__restrict addr, socklen_t *__restrict len, int flags);
int pipe2(int pipefd[2], int flags);

struct bgtask_ucred {
    int pid;
    unsigned uid;
    unsigned gid;
};

/* SO_PEERCRED into a struct laid out like the kernel's struct ucred. */
static inline int bgtask_peer_credentials(int fd, struct bgtask_ucred *out) {
    socklen_t length = sizeof(*out);
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &length);
}

/* sched_setaffinity needs _GNU_SOURCE's cpu_set_t; the raw system call takes a mask. */
#include <sys/syscall.h>
#include <unistd.h>
static inline int bgtask_set_affinity(int pid, unsigned long long mask) {
    return (int)syscall(SYS_sched_setaffinity, pid, sizeof(mask), &mask);
}

/* Swift cannot import these function-like macros. */
static inline int bgtask_wifexited(int status) { return WIFEXITED(status); }
static inline int bgtask_wexitstatus(int status) { return WEXITSTATUS(status); }
static inline int bgtask_wifsignaled(int status) { return WIFSIGNALED(status); }
static inline int bgtask_wtermsig(int status) { return WTERMSIG(status); }

#endif
