/*
 * vfio-ntbd's persisted state read back at start (state-load.c; state.h writes it).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_STATE_LOAD_H
#define VN_STATE_LOAD_H

#include "daemon.h"

#include <glib.h>
#include <stdbool.h>

/*
 * At start, before any worker starts: what the state file says, into @d (devices lent
 * again, leases restored in doubt, revokes resumed, workers adopted, losses); no file is
 * nothing to restore.  An entry that does not pass its checks is skipped; false with
 * @error only when the file cannot be read or is no state file.
 */
bool vn_state_load(VnDaemon *d, GError **error);

#endif /* VN_STATE_LOAD_H */
