/*
 * The control socket's "trace" and "query-trace" (tracing.c): trace events switched
 * in this daemon and in its workers.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_TRACING_H
#define VN_TRACING_H

#include "control.h"
#include "daemon.h"

#include <json-glib/json-glib.h>

/* tracing.c: the control socket's "trace" (switch trace events here and in the workers). */
void vn_daemon_cmd_trace(VnDaemon *d, JsonObject *a, VnControlReply *r);
/* query-trace: every trace event, and whether it is on. */
void vn_daemon_cmd_query_trace(VnDaemon *d, JsonObject *a, VnControlReply *r);

#endif /* VN_TRACING_H */
