/*
 * This node's counters (stats.c): the daemon's own and its workers', asked of every
 * worker at once without waiting.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_STATS_H
#define VN_STATS_H

#include "daemon.h"

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

/*
 * Counters of this node (fabric, lent and borrowed devices; @only: one
 * device "host/name" or NULL for all), as `query-stats` returns them: the
 * workers are asked at once, and @ready gets the JSON (it takes it) when
 * the last has answered or timed out, or the daemon stops.  False, with
 * nothing started, when VN_STATS_MAX_GATHERS are under way.
 */
/* Each asks every worker at once: a socket per worker, 64 at most. */
#define VN_STATS_MAX_GATHERS 4
typedef void (*VnStatsReady)(VnDaemon *d, JsonNode *root, void *opaque);
bool vn_stats_gather(VnDaemon *d, const char *only, VnStatsReady ready, void *opaque);
/* d->gathers, empty (vn_stats_gathers_free frees it). */
GPtrArray *vn_stats_gathers_new(void);
/* Each gather under way gets what it has so far. */
void vn_stats_gathers_free(VnDaemon *d);

#endif /* VN_STATS_H */
