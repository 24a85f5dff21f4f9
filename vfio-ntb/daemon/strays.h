/*
 * Workers nobody recorded, stopped at start (strays.c).
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_STRAYS_H
#define VN_STRAYS_H

#include "daemon.h"

#include <glib.h>

/* strays.c: vn_spawn_ops.stop_strays. */
guint vn_strays_stop(VnDaemon *d);

#endif /* VN_STRAYS_H */
