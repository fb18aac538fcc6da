/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "bgtask_wlr.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if __has_include("generated/wlr-foreign-toplevel-client.h")
#include <wayland-client.h>
#include "generated/wlr-foreign-toplevel-client.h"

/* A compositor may announce toplevels without end: past this many, new ones are dropped. */
#define MAXIMUM_TOPLEVELS 4096
/* The app_id kept (libwayland's messages are at most 4 KiB anyway). */
#define MAXIMUM_APP_ID 1024

struct toplevel {
    struct toplevel *next, *previous;
    struct bgtask_wlr *wlr;
    struct zwlr_foreign_toplevel_handle_v1 *handle;
    unsigned id;
    char *app_id;
    int activated, minimized;
};

struct bgtask_wlr {
    struct wl_display *display;
    struct wl_registry *registry;
    struct zwlr_foreign_toplevel_manager_v1 *manager;
    bgtask_wlr_callback callback;
    void *userdata;
    unsigned next_id;
    unsigned count;
    struct toplevel *toplevels;
};

static void forget(struct toplevel *t) {
    if (t->previous) t->previous->next = t->next; else t->wlr->toplevels = t->next;
    if (t->next) t->next->previous = t->previous;
    t->wlr->count--;
    zwlr_foreign_toplevel_handle_v1_destroy(t->handle);
    free(t->app_id);
    free(t);
}

static void handle_title(void *data, struct zwlr_foreign_toplevel_handle_v1 *h, const char *title) {
    (void)data; (void)h; (void)title;
}

static void handle_app_id(void *data, struct zwlr_foreign_toplevel_handle_v1 *h, const char *app_id) {
    (void)h;
    struct toplevel *t = data;
    free(t->app_id);
    t->app_id = app_id ? strndup(app_id, MAXIMUM_APP_ID) : NULL;
}

static void handle_output(void *data, struct zwlr_foreign_toplevel_handle_v1 *h, struct wl_output *o) {
    (void)data; (void)h; (void)o;
}

static void handle_state(void *data, struct zwlr_foreign_toplevel_handle_v1 *h, struct wl_array *state) {
    (void)h;
    struct toplevel *t = data;
    t->activated = t->minimized = 0;
    uint32_t *entry;
    wl_array_for_each(entry, state) {
        if (*entry == ZWLR_FOREIGN_TOPLEVEL_HANDLE_V1_STATE_ACTIVATED) t->activated = 1;
        if (*entry == ZWLR_FOREIGN_TOPLEVEL_HANDLE_V1_STATE_MINIMIZED) t->minimized = 1;
    }
}

static void handle_done(void *data, struct zwlr_foreign_toplevel_handle_v1 *h) {
    (void)h;
    struct toplevel *t = data;
    t->wlr->callback(t->wlr->userdata, 1, t->id, t->app_id, t->activated, t->minimized);
}

static void handle_closed(void *data, struct zwlr_foreign_toplevel_handle_v1 *h) {
    struct toplevel *t = data;
    (void)h;
    t->wlr->callback(t->wlr->userdata, 2, t->id, t->app_id, 0, 0);
    forget(t);
}

static void handle_parent(void *data, struct zwlr_foreign_toplevel_handle_v1 *h, struct zwlr_foreign_toplevel_handle_v1 *p) {
    (void)data; (void)h; (void)p;
}

static const struct zwlr_foreign_toplevel_handle_v1_listener handle_listener = {
    .title = handle_title, .app_id = handle_app_id, .output_enter = handle_output, .output_leave = handle_output,
    .state = handle_state, .done = handle_done, .closed = handle_closed, .parent = handle_parent,
};

static void manager_toplevel(void *data, struct zwlr_foreign_toplevel_manager_v1 *m, struct zwlr_foreign_toplevel_handle_v1 *h) {
    (void)m;
    struct bgtask_wlr *wlr = data;
    struct toplevel *t = wlr->count < MAXIMUM_TOPLEVELS ? calloc(1, sizeof(*t)) : NULL;
    if (!t) { zwlr_foreign_toplevel_handle_v1_destroy(h); return; }
    t->wlr = wlr;
    t->handle = h;
    t->id = ++wlr->next_id;
    wlr->count++;
    t->next = wlr->toplevels;
    if (t->next) t->next->previous = t;
    wlr->toplevels = t;
    zwlr_foreign_toplevel_handle_v1_add_listener(h, &handle_listener, t);
}

static void manager_finished(void *data, struct zwlr_foreign_toplevel_manager_v1 *m) {
    struct bgtask_wlr *wlr = data;
    wlr->callback(wlr->userdata, 3, 0, NULL, 0, 0);
    zwlr_foreign_toplevel_manager_v1_destroy(m);
    wlr->manager = NULL;
}

static const struct zwlr_foreign_toplevel_manager_v1_listener manager_listener = {
    .toplevel = manager_toplevel, .finished = manager_finished,
};

static void registry_global(void *data, struct wl_registry *r, uint32_t name, const char *interface, uint32_t version) {
    struct bgtask_wlr *wlr = data;
    if (wlr->manager || strcmp(interface, zwlr_foreign_toplevel_manager_v1_interface.name) != 0) return;
    wlr->manager = wl_registry_bind(r, name, &zwlr_foreign_toplevel_manager_v1_interface, version < 3 ? version : 3);
    zwlr_foreign_toplevel_manager_v1_add_listener(wlr->manager, &manager_listener, wlr);
}

static void registry_remove(void *data, struct wl_registry *r, uint32_t name) { (void)data; (void)r; (void)name; }

static const struct wl_registry_listener registry_listener = { .global = registry_global, .global_remove = registry_remove };

int bgtask_wlr_connect(const char *name, bgtask_wlr_callback callback, void *userdata, struct bgtask_wlr **out,
                       long *peer_uid) {
    struct bgtask_wlr *wlr = calloc(1, sizeof(*wlr));
    if (!wlr) return -ENOMEM;
    wlr->callback = callback;
    wlr->userdata = userdata;
    wlr->display = wl_display_connect(name);
    if (!wlr->display) { free(wlr); return -ECONNREFUSED; }
    /* The user's own compositor or root's, before anything it says is read (PeerCredentials'
     * isThisUserOrRoot in Swift: another user's display, reached through a path others may write, would
     * name the toplevels whose units the agent moves). */
    struct ucred cred;
    socklen_t length = sizeof(cred);
    if (getsockopt(wl_display_get_fd(wlr->display), SOL_SOCKET, SO_PEERCRED, &cred, &length) < 0) cred.uid = (uid_t)-1;
    if (peer_uid) *peer_uid = cred.uid == (uid_t)-1 ? -1 : (long)cred.uid;
    if (cred.uid != 0 && cred.uid != getuid() && cred.uid != geteuid()) {
        wl_display_disconnect(wlr->display);
        free(wlr);
        return -EPERM;
    }
    wlr->registry = wl_display_get_registry(wlr->display);
    wl_registry_add_listener(wlr->registry, &registry_listener, wlr);
    /* The globals, then the toplevels that exist, then their states. */
    for (int i = 0; i < 3; i++) {
        if (wl_display_roundtrip(wlr->display) < 0) { int e = errno; bgtask_wlr_free(wlr); return -(e ? e : EPIPE); }
    }
    if (!wlr->manager) { bgtask_wlr_free(wlr); return -ENOENT; }
    *out = wlr;
    return 0;
}

int bgtask_wlr_fd(struct bgtask_wlr *wlr) { return wl_display_get_fd(wlr->display); }

int bgtask_wlr_peer_pid(struct bgtask_wlr *wlr) {
    struct ucred cred;
    socklen_t length = sizeof(cred);
    if (getsockopt(wl_display_get_fd(wlr->display), SOL_SOCKET, SO_PEERCRED, &cred, &length) < 0) return 0;
    return cred.pid;
}

int bgtask_wlr_dispatch(struct bgtask_wlr *wlr) {
    while (wl_display_prepare_read(wlr->display) != 0) {
        if (wl_display_dispatch_pending(wlr->display) < 0) return -errno;
    }
    wl_display_flush(wlr->display);
    if (wl_display_read_events(wlr->display) < 0) return errno == EAGAIN ? 0 : -errno;
    if (wl_display_dispatch_pending(wlr->display) < 0) return -errno;
    return wlr->manager ? 0 : -ESHUTDOWN;
}

void bgtask_wlr_free(struct bgtask_wlr *wlr) {
    if (!wlr) return;
    while (wlr->toplevels) forget(wlr->toplevels);
    if (wlr->manager) zwlr_foreign_toplevel_manager_v1_destroy(wlr->manager);
    if (wlr->registry) wl_registry_destroy(wlr->registry);
    if (wlr->display) wl_display_disconnect(wlr->display);
    free(wlr);
}

#include "generated/wlr-foreign-toplevel-protocol.c"

#else

int bgtask_wlr_connect(const char *name, bgtask_wlr_callback callback, void *userdata, struct bgtask_wlr **out,
                       long *peer_uid) {
    (void)name; (void)callback; (void)userdata; (void)out; (void)peer_uid;
    return -ENOTSUP;
}
int bgtask_wlr_fd(struct bgtask_wlr *wlr) { (void)wlr; return -1; }
int bgtask_wlr_peer_pid(struct bgtask_wlr *wlr) { (void)wlr; return 0; }
int bgtask_wlr_dispatch(struct bgtask_wlr *wlr) { (void)wlr; return -ENOTSUP; }
void bgtask_wlr_free(struct bgtask_wlr *wlr) { (void)wlr; }

#endif
