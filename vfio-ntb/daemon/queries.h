/*
 * vfio-ntbd's query commands (queries.c, docs/control.md): what the cluster looks like
 * from this node.  None changes anything; each answers its reply once.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_QUERIES_H
#define VN_QUERIES_H

#include "control.h"
#include "daemon.h"

#include <json-glib/json-glib.h>
#include <stdbool.h>

/* queries.c: query-version, -nodes, -devices, -device, -stats. */
void vn_queries_version(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_nodes(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_devices(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_device(VnDaemon *d, JsonObject *a, VnControlReply *r);
void vn_queries_stats(VnDaemon *d, JsonObject *a, VnControlReply *r);
/* Does any node (this one included) lend @node/@name, as far as we know? */
bool vn_queries_device_known(VnDaemon *d, const char *node, const char *name);

#endif /* VN_QUERIES_H */
