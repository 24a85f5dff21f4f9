/*
 * ntbctl top [DEV] [--interval-ms N] [--count N]: a live per-device view of
 * a node's counters (query-stats, docs/control.md), with per-second rates
 * from the difference of two answers.  On a terminal each frame replaces
 * the last (ANSI: cursor home, clear screen); otherwise frames follow one
 * another, separated by a blank line, for a log or a pipe.
 *
 * Only ntbctl links it (like ntbctl-virt.c).  Blocking; no threads.
 */
#ifndef NTBCTL_TOP_H
#define NTBCTL_TOP_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

/* --interval-ms: the default and its bounds (faster than 10 frames a
 * second is unreadable and asks every worker as often; an hour is not
 * live). */
#define NTBCTL_TOP_DEFAULT_INTERVAL_MS 1000
#define NTBCTL_TOP_MIN_INTERVAL_MS 100
#define NTBCTL_TOP_MAX_INTERVAL_MS 3600000
/* --count: at most this many frames (0: until interrupted). */
#define NTBCTL_TOP_MAX_COUNT 1000000

/*
 * Show the counters of the node whose control socket is @socket_path
 * (@device "host/name", or NULL for all its devices) every @interval_ms
 * (0: NTBCTL_TOP_DEFAULT_INTERVAL_MS), @count frames (0: until
 * interrupted), on stdout.  Each request waits at most @timeout_ms.
 * Returns 0 when the frames are shown, -1 with @error (VN_CTL_ERROR: USAGE
 * for a bad argument, the daemon's class, UNREACHABLE, TIMEOUT or
 * PROTOCOL) otherwise.  A dropped connection is made again once per frame.
 */
int ntbctl_top(const char *socket_path, int timeout_ms, const char *device, int interval_ms,
               int count, GError **error);

/*
 * One frame's body: @cur, a query-stats answer of node @node, with rates
 * against @prev (NULL: none yet) taken @seconds earlier; only @device when
 * not NULL.  Checks @cur's shape (VN_CTL_ERROR_PROTOCOL, appending
 * nothing); the daemon's text passes through vn_ctl_format_sanitize().
 */
bool ntbctl_top_render(GString *out, const char *node, JsonNode *prev, JsonNode *cur,
                       double seconds, const char *device, GError **error);

#endif /* NTBCTL_TOP_H */
