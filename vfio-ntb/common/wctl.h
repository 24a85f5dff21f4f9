/*
 * A worker's control channel: how vfio-ntbd asks a worker it started (or
 * adopted after a restart) for its counters and to request an unplug, in
 * place of signals and a stats file.
 *
 * The worker listens on a UNIX socket in the daemon's run directory (mode
 * 0600).  One request per connection: a JSON line {"execute": NAME}, one
 * JSON line back ({"return": ...} or {"error": "..."}), then the worker
 * closes.  The worker's loop never waits on the daemon: a connection is
 * read as its bytes come, bounded by VN_WCTL_MAX_REQUEST, and a reply that
 * does not fit the socket's buffer at once is dropped.  Nor does the
 * daemon's loop wait on the worker: it is answered from its loop, bounded
 * by a timeout.
 *
 * Threads: a server lives in the GMainContext it was created in.
 */
#ifndef VN_WCTL_H
#define VN_WCTL_H

#include <glib.h>
#include <stdbool.h>

/* A request line is a command name and a little JSON around it. */
#define VN_WCTL_MAX_REQUEST 1024
/* Connections a worker serves at once (the daemon makes one at a time). */
#define VN_WCTL_MAX_CLIENTS 8

typedef struct VnWctl VnWctl;

/* The answer to command @name (new JSON text of the "return" value), or
 * NULL with @error for a command the worker does not know. */
typedef char *(*VnWctlHandler)(void *opaque, const char *name, GError **error);

/* Listen on @path (replacing a stale socket there). */
VnWctl *vn_wctl_new(const char *path, VnWctlHandler handler, void *opaque, GError **error);
/* Stops listening and unlinks the socket. */
void vn_wctl_free(VnWctl *w);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnWctl, vn_wctl_free)

/*
 * The daemon's side, which never waits: send command @name to the worker
 * listening on @path; @done runs once, later, from the thread-default
 * context, with the "return" value as JSON text (at most @max_reply bytes;
 * @done frees it), or NULL and @error (no answer after @timeout_ms, an
 * error answer, a reply that is not one JSON object line).  NULL with
 * @error when there is no worker there to ask (or its backlog is full).  A
 * call cancelled before its answer never calls @done.
 */
typedef struct VnWctlCall VnWctlCall;
typedef void (*VnWctlDone)(char *answer, const GError *error, void *opaque);
VnWctlCall *vn_wctl_call_async(const char *path, const char *name, unsigned timeout_ms,
                               size_t max_reply, VnWctlDone done, void *opaque, GError **error);
void vn_wctl_call_cancel(VnWctlCall *c);

#endif /* VN_WCTL_H */
