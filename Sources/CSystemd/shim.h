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

/* Linux 6.5+; Debian 12's headers predate it. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* Swift cannot import these function-like macros. */
static inline int bgtask_wifexited(int status) { return WIFEXITED(status); }
static inline int bgtask_wexitstatus(int status) { return WEXITSTATUS(status); }
static inline int bgtask_wifsignaled(int status) { return WIFSIGNALED(status); }
static inline int bgtask_wtermsig(int status) { return WTERMSIG(status); }

#endif
