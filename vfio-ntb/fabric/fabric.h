/*
 * The NTB fabric: how vfio-ntb nodes (hosts) reach each other's memory and
 * talk, in Linux NTB's vocabulary.
 *
 * - A node attaches to a fabric under a unique name and sees its peers come
 *   and go (link up / link down events).
 * - A node exports fd-backed local memory as a *segment* (an id), to named
 *   peers only.  A peer maps a segment through one of its scarce *memory
 *   windows*; the window gives it an fd and a mapping of that memory.
 * - Nodes exchange *messages*: framed requests with replies, and events;
 *   messages carry fds where the backend can (the shm backend can).
 * - *Doorbells*: a peer rings bit N of a node's doorbell register; the node's
 *   handler runs with the bit.
 *
 * Backends sit behind a const VnFabricOps table checked once at
 * registration.  The `shm` backend (the embedded default) runs every node as
 * a process on one machine: a fabric directory holds each node's UNIX
 * socket; mapping a window passes the segment's memfd.  It enforces NTB-like
 * limits (VnFabricLimits) so the layers above cope with what real adapters
 * force on them.
 *
 * Peers are untrusted: every message, size, id and count from another node
 * is checked; a bad message gets an error reply (or drops that link) and
 * changes nothing.
 *
 * Threads: a VnFabric lives in one GMainContext; all callbacks run there.
 */
#ifndef VN_FABRIC_H
#define VN_FABRIC_H

#include "common/name.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Nodes one node will talk to. */
#define VN_FABRIC_MAX_PEERS 256
/* Segments one node exports. */
#define VN_FABRIC_MAX_SEGMENTS 1024
/* One message's payload (JSON part + binary part); a 1 MiB region access
 * plus its header fits. */
#define VN_FABRIC_MAX_PAYLOAD (1024u * 1024u + 4096u)
/* fds carried by one message (an MSI-X vector set in chunks). */
#define VN_FABRIC_MAX_FDS 16
/* Doorbell bits per node (Intel NTBs have 16; IDT 32). */
#define VN_FABRIC_DOORBELLS 32
/* What one peer may have queued for us while we cannot dispatch (inside a
 * synchronous request, VN_FABRIC_REQUEST_TIMEOUT_MS at most): a few of the
 * largest frames, or many small ones.  A peer past either has its link
 * dropped -- else 300 frames of 1 MiB grow a daemon by 300 MiB. */
#define VN_FABRIC_MAX_DEFERRED_BYTES (4u * VN_FABRIC_MAX_PAYLOAD)
#define VN_FABRIC_MAX_DEFERRED_FRAMES 1024u
/* A request not answered in this time fails with -ETIMEDOUT (the default;
 * see "request-timeout-ms" at vn_fabric_open()).  Under QEMU's 5 s for a
 * vfio-user reply, over the lender's 3 s for its device (lending/lender-int.h):
 * a borrower answers QEMU before QEMU gives up. */
#define VN_FABRIC_REQUEST_TIMEOUT_MS 4000
/* The largest frame a backend carries: the payload plus the fabric's own
 * frame header (fabric/frame.h), rounded up.  Anything longer is a broken
 * or hostile stream. */
#define VN_FABRIC_MAX_FRAME (VN_FABRIC_MAX_PAYLOAD + 64u)

typedef struct VnFabric VnFabric;

/* NTB-like limits the backend enforces on windows (configurable). */
typedef struct VnFabricLimits {
    uint32_t max_windows;        /* memory windows per node (default 8) */
    uint64_t max_window_size;    /* bytes (default 4 GiB) */
    uint64_t window_align;       /* window base/offset alignment (default 4 KiB) */
    uint64_t xlat_granularity;   /* translation granularity (default 4 KiB) */
    /* window sizes are powers of two, at least xlat_granularity */
} VnFabricLimits;

void vn_fabric_limits_default(VnFabricLimits *l);

/* A mapped window onto a peer's segment. */
typedef struct VnFabricWindow {
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t segment;
    uint64_t size;               /* the segment's size (window rounded up to 2^n) */
    uint64_t window_size;        /* the window it occupies: 2^n >= size and
                                  * >= xlat_granularity */
    int fd;                      /* owned by the fabric; valid until unmapped */
    uint8_t *host;               /* mapping of [0, size) */
} VnFabricWindow;

/* A received message.  fds are owned by the message until taken (-1). */
typedef struct VnFabricMsg {
    const char *peer;            /* sender */
    uint32_t type;               /* user-defined, below VN_FABRIC_TYPE_RESERVED */
    const char *json;            /* NUL-terminated JSON object text, or NULL */
    const uint8_t *data;         /* binary part */
    size_t data_len;
    int fds[VN_FABRIC_MAX_FDS];
    unsigned nfds;
} VnFabricMsg;

/* Types at or above this are the fabric's own (segment maps, doorbells). */
#define VN_FABRIC_TYPE_RESERVED 0xff00u

/*
 * Callbacks of the layer above (lender, borrower, daemon).  All optional.
 * on_request must answer exactly once with vn_fabric_reply() (now or later,
 * using the token), or with vn_fabric_reply_error().
 */
typedef struct VnFabricHandlers {
    void (*on_link)(void *opaque, const char *peer, bool up);
    void (*on_request)(void *opaque, VnFabricMsg *msg, uint64_t token);
    void (*on_event)(void *opaque, VnFabricMsg *msg);
    void (*on_doorbell)(void *opaque, const char *peer, uint32_t bit);
} VnFabricHandlers;

/* A backend. */
typedef struct VnFabricOps {
    const char *name;
    /* Required. */
    void *(*open)(VnFabric *fab, const char *node, GHashTable *params, GError **error);
    void (*close)(void *backend);
    int (*connect)(void *backend, const char *peer);
    int (*send)(void *backend, const char *peer, const void *buf, size_t len,
                const int *fds, unsigned nfds);
    /* Block until bytes from @peer arrived and were passed to
     * vn_fabric_backend_received(), or @timeout_ms passed (-ETIMEDOUT). */
    int (*wait)(void *backend, const char *peer, int timeout_ms);
    /* End the link to @peer (a peer that broke a bound).  Its link down is
     * reported later, from the backend's own source, never from inside this
     * call; what it sent meanwhile may still arrive. */
    void (*disconnect)(void *backend, const char *peer);
    /* Optional: a peer's liveness check beyond the transport's own. */
    int (*ping)(void *backend, const char *peer);
    /* Optional: the names of the nodes attached now (not us), at most
     * VN_FABRIC_MAX_PEERS, as a new GPtrArray of strings. */
    GPtrArray *(*discover)(void *backend);
} VnFabricOps;

/* Checks a table, naming the missing required member. */
bool vn_fabric_ops_valid(const VnFabricOps *ops, GError **error);
/* Register a backend under ops->name (validated; the table must outlive it). */
bool vn_fabric_register(const VnFabricOps *ops, GError **error);

/*
 * Backends report received bytes and link changes here.
 *
 * received: one call per whole frame (the backend does the framing, bounded
 * by VN_FABRIC_MAX_FRAME); @buf is borrowed; the fabric takes the fds (closes
 * them unless consumed).  A backend that got more fds than VN_FABRIC_MAX_FDS
 * with a frame passes nfds = VN_FABRIC_MAX_FDS + 1 (entries may be -1) so
 * the frame is rejected.  A peer's link is reported up before its first
 * frame.  Neither call may come from ops->close.
 */
void vn_fabric_backend_received(VnFabric *fab, const char *peer, const uint8_t *buf,
                                size_t len, int *fds, unsigned nfds);
void vn_fabric_backend_link(VnFabric *fab, const char *peer, bool up);
/* Bytes no frame owns were refused (a bad handshake, an impossible length):
 * counted in stats.bad_messages.  @what names the connection and the fault. */
void vn_fabric_backend_rejected(VnFabric *fab, const char *what);
/* For ops->open: the context to attach sources to, and the backend's window
 * limits (vn_fabric_limits_default() unless set). */
GMainContext *vn_fabric_backend_context(VnFabric *fab);
void vn_fabric_backend_set_limits(VnFabric *fab, const VnFabricLimits *limits);

/*
 * Attach node @node to the fabric of backend @backend ("shm") with its
 * parameters (for shm: "dir", and the limits "max-windows",
 * "max-window-size", "window-align", "xlat-granularity", and the modelled
 * "crossing-delay-ns" of shm.h).  The fabric itself
 * takes "request-timeout-ms" (default VN_FABRIC_REQUEST_TIMEOUT_MS).
 */
VnFabric *vn_fabric_open(const char *backend, const char *node, GHashTable *params,
                         const VnFabricHandlers *handlers, void *opaque,
                         GMainContext *ctx, GError **error);
/* Outstanding requests complete with -ECANCELED (their callbacks run in
 * here), windows are unmapped, segments withdrawn.  Not from inside one of
 * the fabric's own callbacks. */
void vn_fabric_close(VnFabric *fab);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnFabric, vn_fabric_close)

const char *vn_fabric_node(VnFabric *fab);
const VnFabricLimits *vn_fabric_limits(VnFabric *fab);

/* The nodes the backend can see now (empty when it cannot tell); owned. */
GPtrArray *vn_fabric_discover(VnFabric *fab);

/* Open the link to @peer (idempotent); link up is reported by on_link. */
bool vn_fabric_connect(VnFabric *fab, const char *peer, GError **error);
bool vn_fabric_link_up(VnFabric *fab, const char *peer);

/*
 * Export @size bytes of @fd (borrowed; the fabric keeps its own dup) as a
 * segment that only @peer may map.  Returns the id (> 0), or 0 with @error.
 * @fd must be a memfd sealed against shrinking, at least @size bytes long
 * (vn_peerfd_memory()): what a mapper accepts, since a segment that could
 * shrink under a window would SIGBUS the mapper.
 */
uint64_t vn_fabric_segment_export(VnFabric *fab, int fd, uint64_t size, const char *peer,
                                  GError **error);
/* Withdraw a segment: peers cannot map it any more (existing shm mappings
 * of a memfd cannot be revoked by this backend; see the lender's fencing). */
void vn_fabric_segment_unexport(VnFabric *fab, uint64_t id);

/*
 * Map @peer's segment @id through a memory window (synchronous, see
 * vn_fabric_request_sync()).  Fails for an unknown or not-exported-to-us segment, or when no
 * window is free or the segment exceeds the window limits, and for a
 * segment whose fd (the peer's) is not a memfd sealed against shrinking that
 * holds the size it claims: anything else could shrink under the mapping.
 */
VnFabricWindow *vn_fabric_window_map(VnFabric *fab, const char *peer, uint64_t id,
                                     GError **error);
void vn_fabric_window_unmap(VnFabric *fab, VnFabricWindow *w);
uint32_t vn_fabric_windows_in_use(VnFabric *fab);

/*
 * Messages.  @json may be NULL; @data/@len a binary part; @fds borrowed.
 * vn_fabric_request() calls @done(opaque, reply or NULL, -errno) once when
 * it returned 0 (never when it returned -errno).  The reply is borrowed for
 * the call; an error reply is passed too (its JSON {"error": "..."}).
 */
typedef void (*VnFabricReplyFn)(void *opaque, VnFabricMsg *reply, int err);
int vn_fabric_request(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                      const void *data, size_t len, const int *fds, unsigned nfds,
                      VnFabricReplyFn done, void *opaque);
/*
 * Synchronous form.  It does not iterate the main context (that would let
 * other handlers run in the middle of the caller's): it waits on @peer's
 * link alone, at most VN_FABRIC_REQUEST_TIMEOUT_MS, and queues any other
 * message that arrives meanwhile for normal dispatch.  The reply (owned,
 * free with vn_fabric_msg_free) goes to *reply; an error reply gives its
 * -errno and leaves the error message in *reply when the peer sent one
 * (vn_fabric_error_message()).  MAP requests from peers are still answered while waiting (they
 * run no handler), so two nodes mapping each other's segments at once do
 * not deadlock.  A peer served by the calling thread cannot answer: the
 * call times out.
 */
int vn_fabric_request_sync(VnFabric *fab, const char *peer, uint32_t type,
                           const char *json, const void *data, size_t len,
                           const int *fds, unsigned nfds, VnFabricMsg **reply);
int vn_fabric_reply(VnFabric *fab, uint64_t token, const char *json, const void *data,
                    size_t len, const int *fds, unsigned nfds);
int vn_fabric_reply_error(VnFabric *fab, uint64_t token, int err, const char *message);
int vn_fabric_event(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                    const void *data, size_t len, const int *fds, unsigned nfds);
void vn_fabric_msg_free(VnFabricMsg *msg);
/* The peer's explanation in an error reply ("error" member), or NULL. */
char *vn_fabric_error_message(const VnFabricMsg *reply);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnFabricMsg, vn_fabric_msg_free)

/* Ring doorbell @bit (< VN_FABRIC_DOORBELLS) of @peer. */
int vn_fabric_doorbell(VnFabric *fab, const char *peer, uint32_t bit);

/* Counters: messages sent/received, doorbells, windows mapped. */
typedef struct VnFabricStats {
    uint64_t msgs_sent;
    uint64_t msgs_received;
    uint64_t doorbells_sent;
    uint64_t doorbells_received;
    uint64_t windows_mapped;
    uint64_t bad_messages;
} VnFabricStats;
void vn_fabric_stats(VnFabric *fab, VnFabricStats *out);

#endif /* VN_FABRIC_H */
