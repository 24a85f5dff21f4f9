/*
 * vfio-ntbd's persisted state (state.c): the leases this node granted and holds, the
 * workers it started, the next lease id, written whole to STATE-DIR/state.json and
 * renamed into place.  Read back at start by state-load.h.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_STATE_H
#define VN_STATE_H

#include "daemon.h"
#include "leases.h"

#include <glib.h>
#include <stdbool.h>

/* Write the state file now, whole (renamed into place: a crash leaves the old file or the
 * new one); false with @error ("saving state: ..."), the old file left as it was. */
bool vn_state_save(VnDaemon *d, GError **error);
/* The store, as a lease listener: saves when a lease's holder changed, and
 * reports (logs, counts in d->save_errors) a save that failed. */
void vn_state_on_lease(void *opaque, const VnLeaseChange *change);
/* Save now, reporting a failure as vn_state_on_lease() does. */
void vn_state_save_or_report(VnDaemon *d);
/* The state file's path: STATE-DIR/state.json, RUN-DIR/state.json without a state-dir
 * (newly allocated). */
char *vn_state_path(VnDaemon *d);

#endif /* VN_STATE_H */
