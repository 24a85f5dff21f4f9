/*
 * Small helpers shared by every vfio-ntb module.
 */
#ifndef VN_UTIL_H
#define VN_UTIL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Close *fd if it is open and set it to -1, so a second call is harmless. */
void vn_util_close_fd(int *fd);

/* Close every fd in fds[0..n) that is >= 0 and set it to -1. */
void vn_util_close_fds(int *fds, size_t n);
/* A source for @fd's @cond (g_unix_fd_source_new's), not attached yet, that may be dispatched
 * while its own callback runs.  GLib takes a source that may not recurse out of the poll set
 * for each dispatch and puts it back after, and each of the two wakes the loop through its
 * eventfd: an empty iteration more (a poll over every fd) per message handled.  Nothing of ours
 * runs a nested loop, so a source never does recurse; every fd on the data path uses this. */
GSource *vn_util_fd_source_new(int fd, GIOCondition cond);

/* Run @loop (the default context's) until SIGTERM or SIGINT: a worker's
 * life between its start and its clean end. */
void vn_util_run_until_signalled(GMainLoop *loop);
/* Its first half: SIGTERM and SIGINT quit @loop from now on (@ids: the sources, for
 * g_source_remove()).  GLib starts its worker thread for them here: a process that will not
 * be allowed to start threads (borrower/sandbox.h) calls this first. */
void vn_util_quit_on_signals(GMainLoop *loop, guint ids[2]);

/* A stats file: @json(@opaque) (a new string) written to @path (atomically) at each SIGUSR1
 * and when vn_util_stats_file_stop() writes it a last time.  @path NULL: no file. */
typedef char *(*VnUtilStatsFn)(void *opaque);
typedef struct VnUtilStatsFile {
    const char *path;
    VnUtilStatsFn json;
    void *opaque;
    guint usr1;
} VnUtilStatsFile;
void vn_util_stats_file_start(VnUtilStatsFile *f, const char *path, VnUtilStatsFn json,
                              void *opaque);
void vn_util_stats_file_stop(VnUtilStatsFile *f);

/* True when [off, off + len) lies inside [0, size) without overflow. */
static inline bool vn_util_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

/*
 * Member @name of @o (which may be NULL) if it is a string; NULL when it is
 * absent, null or of another type.  For JSON from peers: json-glib's own
 * json_object_get_string_member_with_default() emits a critical when the
 * member is an array or an object.
 */
static inline const char *vn_util_json_string(JsonObject *o, const char *name)
{
    JsonNode *n = o != NULL ? json_object_get_member(o, name) : NULL;

    return n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING
               ? json_node_get_string(n)
               : NULL;
}

/* Member @name of @o (which may be NULL) if it is a boolean, else false. */
static inline bool vn_util_json_bool(JsonObject *o, const char *name)
{
    JsonNode *n = o != NULL ? json_object_get_member(o, name) : NULL;

    return n != NULL && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN &&
           json_node_get_boolean(n);
}

/*
 * A counter a peer wrote (a worker's stats): the member at @path, "key" or
 * "outer.key" (one level), of @o (which may be NULL), if it is a
 * non-negative integer, or with @booleans true/false as 1/0.  False when it
 * is absent or of another type.
 */
bool vn_util_json_counter(JsonObject *o, const char *path, bool booleans, uint64_t *v);

/* @bytes as a person reads it ("256.0 MiB": GLib's IEC units with a plain
 * space, so that logs and messages stay ASCII).  Free with g_free(). */
char *vn_util_size_text(uint64_t bytes);

/* Monotonic time in nanoseconds. */
uint64_t vn_util_now_ns(void);

/* Whether @a and @b (@len bytes each) are equal, every byte compared: how long it takes
 * tells someone guessing a secret nothing. */
bool vn_util_equal_secret(const uint8_t *a, const uint8_t *b, size_t len);

/* What is at @path, for a server about to bind a UNIX socket there. */
typedef enum VnUtilSocketPath {
    VN_UTIL_SOCKET_FREE,       /* nothing, or a socket nobody listens on (removed) */
    VN_UTIL_SOCKET_LIVE,       /* a listener answers: another server runs there */
    VN_UTIL_SOCKET_NOT_SOCKET, /* a file that is not a socket: left alone */
} VnUtilSocketPath;
/* A connection to the UNIX stream socket at @path, never waiting: the fd (non-blocking), or
 * -errno (-EAGAIN: a listener whose backlog is full, a stopped server, say; -ENAMETOOLONG). */
int vn_util_dial_unix(const char *path);
/* Probe @path (connect, never waiting): a dead server's socket is unlinked so
 * that a restarted one can bind; a live one or another file is left.  A path
 * too long for a socket counts as free (bind says why). */
VnUtilSocketPath vn_util_socket_path_claim(const char *path);

/*
 * Replace @path with @text by writing PATH.tmp and renaming it, so a reader
 * sees the old or the new file, never half of one.  For counters snapshots:
 * unlike g_file_set_contents() there is no fsync, which under heavy disk I/O
 * stalled the writer's main loop for seconds, and a lost snapshot is harmless.
 */
bool vn_util_write_snapshot(const char *path, const char *text, GError **error);
/* The same with the file's @mode (e.g. 0600), for state that must not be
 * readable by others. */
bool vn_util_write_replace(const char *path, const char *text, int mode, GError **error);

#endif /* VN_UTIL_H */
