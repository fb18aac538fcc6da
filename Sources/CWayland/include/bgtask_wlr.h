/* SPDX-License-Identifier: Apache-2.0 */
#ifndef BGTASK_WLR_H
#define BGTASK_WLR_H
/* The wlr-foreign-toplevel-management client of bgtask-session, over libwayland-client and
 * the glue wayland-scanner generates at build time (make; Sources/CWayland/generated/).
 * Built without that glue, bgtask_wlr_connect answers -ENOTSUP. */

/* What a toplevel became: 1 = new or changed (after its "done"), 2 = closed, 3 = the
 * compositor stopped sending (the manager's "finished"). `app_id` may be NULL. */
typedef void (*bgtask_wlr_callback)(void *userdata, int kind, unsigned id, const char *app_id,
                                    int activated, int minimized);

struct bgtask_wlr;

/* Connects to the Wayland display `name` (NULL: $WAYLAND_DISPLAY), binds the toplevel
 * manager and reads the toplevels that exist (each reported to `callback`). Returns 0, or
 * -ENOTSUP (no glue built), -ECONNREFUSED (no display), -EPERM (the compositor runs as
 * neither this process's user nor root: nothing read from it), -ENOENT (the compositor has
 * no toplevel manager), -errno. `peer_uid` (may be NULL) gets the compositor's uid once
 * connected, -1 unknown. */
int bgtask_wlr_connect(const char *name, bgtask_wlr_callback callback, void *userdata, struct bgtask_wlr **out,
                       long *peer_uid);
/* The connection's descriptor, to wait for readability on. */
int bgtask_wlr_fd(struct bgtask_wlr *wlr);
/* The pid of the compositor (SO_PEERCRED), or 0. */
int bgtask_wlr_peer_pid(struct bgtask_wlr *wlr);
/* Reads what arrived and reports it; < 0 when the connection is gone. */
int bgtask_wlr_dispatch(struct bgtask_wlr *wlr);
void bgtask_wlr_free(struct bgtask_wlr *wlr);

#endif
