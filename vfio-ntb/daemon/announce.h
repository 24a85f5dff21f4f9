/*
 * This node's announcements to the other daemons (announce.c): what it lends and the
 * leases it holds, on each change, to a new link, and now and then (the heartbeat's,
 * cluster.c).  A send that fails is owed: the next beat sends it again.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_ANNOUNCE_H
#define VN_ANNOUNCE_H

#include "daemon.h"

#include <glib.h>
#include <stdbool.h>

/* Announce now, to every daemon whose link is up (each told which devices it may not
 * borrow); a coalesced one that was due is this one. */
void vn_announce(VnDaemon *d);
/* Announce within VN_DAEMON_ANNOUNCE_DELAY_MS, coalescing changes. */
void vn_announce_soon(VnDaemon *d);
/* Our announcement to @peer alone, now (it just came, or we owe it a return). */
void vn_announce_to(VnDaemon *d, const char *peer);
/* Announce now, unless nothing changed since the last broadcast. */
void vn_announce_changed(VnDaemon *d);
/* Is our periodic announcement due to a host at heartbeat @beat (VN_DAEMON_ANNOUNCE_EVERY):
 * @phase its beat of each VN_DAEMON_REFRESH_EVERY, @owed the last send to it failed,
 * @partner it shares a lease with us. */
bool vn_announce_due(guint beat, guint phase, bool owed, bool partner);
/* The heartbeat's periodic announcements, at beat d->beats: to each host that is up and
 * due (vn_announce_due). */
void vn_announce_beat(VnDaemon *d);

#endif /* VN_ANNOUNCE_H */
