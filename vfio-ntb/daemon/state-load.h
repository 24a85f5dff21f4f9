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

bool vn_state_load(VnDaemon *d, GError **error);

#endif /* VN_STATE_LOAD_H */
