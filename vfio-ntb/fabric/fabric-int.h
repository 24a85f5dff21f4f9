/*
 * Inside the fabric layer: the VnFabric struct and the calls between
 * fabric.c (the registry, a node's life), link.c (links, the receive path),
 * msg.c (requests, replies, events, doorbells), window.c (windows onto
 * peers' segments), route.c (interrupt routes) and segment.c (what a node
 * exports, routes' bookkeeping too); each calls only those after it in that
 * order.  Not for other layers.
 *
 * Threads: everything here belongs to the fabric's GMainContext thread.
 */
#ifndef VN_FABRIC_INT_H
#define VN_FABRIC_INT_H

#include "fabric.h"
#include "frame.h"

/* Requests one peer may have waiting for our handler's answer; beyond it a
 * request gets -EBUSY, so a flooding peer cannot grow the token table. */
#define VN_FABRIC_MAX_INFLIGHT 256
/* Requests of ours one link may hold back (vn_fabric_request: the peer has as many of ours
 * as it takes), and their bytes; past either, a request gets -EBUSY at once. */
#define VN_FABRIC_MAX_HELD 4096u
#define VN_FABRIC_MAX_HELD_BYTES (16u * 1024u * 1024u)
/* Largest segment exported: 1 TiB, above any window a supported adapter
 * (or the shm backend's max-window-size) offers. */
#define VN_FABRIC_MAX_SEGMENT_SIZE (UINT64_C(1) << 40)
/* Bound of "request-timeout-ms" (10 minutes). */
#define VN_FABRIC_MAX_TIMEOUT_MS 600000
/* Queued frames and link changes handled per idle dispatch, so a burst
 * that queued up during a backend's call cannot starve the loop. */
#define VN_FABRIC_DEFERRED_BATCH 64

/* A peer whose link is up.  @gen is unique per link-up in this fabric, so
 * anything recorded against an earlier link of the same name is told apart. */
typedef struct VnFabricPeer {
    char *name;
    uint64_t gen;
    unsigned inflight; /* tokens of this link not yet answered */
    unsigned asked;    /* our requests on this link not yet answered */
    GQueue held;       /* VnFabricPending not sent yet: @asked was at fab->max_asked */
    size_t held_bytes;
    unsigned deferred_frames; /* queued while deferring (VN_FABRIC_MAX_DEFERRED_*) */
    size_t deferred_bytes;
    bool dropping; /* broke a bound: its frames are dropped until link down */
    /* Its doorbells' budget (VN_FABRIC_DOORBELL_RATE, msg.c): tokens left as of when, and
     * the bits rung beyond it, delivered once each by db_flush. */
    VnFabric *fab;
    double db_tokens;
    gint64 db_refilled;
    uint64_t db_pending;
    GSource *db_flush;
} VnFabricPeer;

/* A request we sent and wait for (async). */
typedef struct VnFabricPending {
    uint64_t id; /* key */
    VnFabric *fab;
    char *peer;
    uint64_t gen;
    uint32_t type;
    VnFabricReplyFn done;
    void *opaque;
    GSource *timeout;
    /* Held back (VnFabricPeer.held) until the peer answers one of the others: what to
     * send then.  A request that was sent has none of it. */
    bool held;
    bool sent; /* counted in its link's @asked until answered */
    char *json;
    void *data;
    size_t len;
} VnFabricPending;

/* A request we received and owe a reply to. */
typedef struct VnFabricToken {
    uint64_t token; /* key */
    char *peer;
    uint64_t gen;
    uint64_t id;
    uint32_t type;
} VnFabricToken;

/* An exported segment or route. */
typedef struct VnFabricSegment {
    uint64_t id;     /* key */
    int fd;          /* our dup */
    uint64_t offset; /* where the segment starts in @fd */
    uint64_t size;   /* 0 for a route */
    bool device;     /* a device's region (its registers), not memory */
    char *peer;      /* the one peer allowed to map it */
    uint64_t parent; /* a share of segment @parent (vn_fabric_segment_share), or 0 */
} VnFabricSegment;

struct VnFabric {
    char *node;
    const VnFabricOps *ops;
    void *backend; /* NULL once closing */
    VnFabricHandlers handlers;
    void *opaque;
    GMainContext *ctx;
    VnFabricLimits limits;
    uint32_t caps; /* ops->caps, or fewer (vn_fabric_backend_set_caps()) */
    int request_timeout_ms;
    unsigned
        max_asked; /* requests a peer takes from us at once (vn_fabric_backend_set_max_asked) */
    uint32_t doorbell_rate; /* per peer and second ("doorbell-rate") */

    GHashTable *peers; /* name -> VnFabricPeer, links that are up */
    uint64_t last_gen;
    GHashTable *pending; /* &id -> VnFabricPending */
    uint64_t last_id;
    GHashTable *tokens; /* &token -> VnFabricToken */
    uint64_t last_token;

    /*
     * Deferral: while > 0 (inside a backend call made from our API: a send, a
     * connect, an open) or while the queue is not empty
     * (to keep order), what the backend reports is queued and handled from
     * an idle source, never inside the caller's call.
     */
    int defer;
    bool opening;    /* inside ops->open: reports are deferred too */
    GQueue deferred; /* VnFabricDeferred */
    GSource *deferred_src;

    GHashTable *segments; /* &id -> VnFabricSegment */
    uint64_t last_segment;
    VnFabricWindow **windows; /* limits.max_windows slots */
    uint32_t windows_in_use;
    GHashTable *routes;       /* &id -> VnFabricSegment (size 0) */
    uint64_t doorbells_taken; /* bit i: doorbell i handed out */
    uint64_t last_route;

    GByteArray *out; /* frame being sent */
    VnFabricStats stats;
    GPtrArray *connects; /* VnFabricConnect under way (connect.c); NULL once closing */
};

/* connect.c: a connect under way, on @list (the fabric's connects).  @now is what the
 * backend's connect said: -EINPROGRESS waits for vn_fabric_connects_link_up() until
 * VN_FABRIC_CONNECT_WAIT_MS; anything else is @done's answer, from an idle source. */
VnFabricConnect *vn_fabric_connects_add(GPtrArray *list, GMainContext *ctx, const char *peer,
                                        int now, VnFabricConnected done, void *opaque);
/* @peer's link is up: every connect waiting for it is answered 0. */
void vn_fabric_connects_link_up(GPtrArray *list, const char *peer);
/* Closing: every connect is answered -ECANCELED, and @list freed. */
void vn_fabric_connects_close(GPtrArray *list);

/* The link to @name while it is up, or NULL (inline: every part of the fabric asks it, and
 * none of them need call up into another for it). */
static inline VnFabricPeer *vn_fabric_peer(VnFabric *fab, const char *name)
{
    return (VnFabricPeer *)g_hash_table_lookup(fab->peers, name);
}

/* link.c */
/* The peer table's value destructor. */
void vn_fabric_peer_free(gpointer data);
/* Closing: what the backend reported and was not handled yet is dropped. */
void vn_fabric_links_close(VnFabric *fab);

/* msg.c */
/* Count and log a bad frame, answer it when it was a request. */
void vn_fabric_bad_frame(VnFabric *fab, const char *peer, const VnFabricFrame *f, int err,
                         const char *why);
/* A borrowed view of a received frame for a handler. */
void vn_fabric_msg_view(VnFabricMsg *msg, const char *peer, const VnFabricFrame *f);
int vn_fabric_send_frame(VnFabric *fab, const char *peer, uint16_t flags, uint32_t type,
                         uint64_t id, int32_t error, const char *json, const void *data,
                         size_t len);
/* Answer request @id of @peer with an error (@message may be NULL). */
int vn_fabric_send_error(VnFabric *fab, const char *peer, uint64_t id, uint32_t type, int err,
                         const char *message);
/* An owned copy of a received frame. */
VnFabricMsg *vn_fabric_msg_copy(const char *peer, const VnFabricFrame *f);
/* A frame of @peer's link @gen (which may be gone by now). */
void vn_fabric_reply_received(VnFabric *fab, const char *peer, uint64_t gen,
                              const VnFabricFrame *f);
void vn_fabric_request_received(VnFabric *fab, const char *peer, uint64_t gen,
                                const VnFabricFrame *f);
void vn_fabric_event_received(VnFabric *fab, const char *peer, const VnFabricFrame *f);
/* A link went down: its requests fail with -ECONNRESET, its tokens go. */
void vn_fabric_link_lost(VnFabric *fab, uint64_t gen);
void vn_fabric_msgs_close(VnFabric *fab);

/* window.c */
void vn_fabric_windows_init(VnFabric *fab);
void vn_fabric_windows_close(VnFabric *fab);
/* Whether window slot @w holds a window (not empty, not reserved for a map under way). */
bool vn_fabric_window_slot_used(const VnFabricWindow *w);

/* segment.c */
/* Closing: every segment's entry goes (its fd closed). */
void vn_fabric_segments_close(VnFabric *fab);
/* An exported segment's or route's entry. */
void vn_fabric_segment_free(VnFabricSegment *seg);
/* An entry with no fd for @id (a route's when @route) in @table: what someone else holds
 * (the daemon's port, a worker); false when @id is 0 or there already. */
bool vn_fabric_export_entry_adopt(GHashTable *table, uint64_t id, const char *peer, bool route);
/* Segment (or route, @size 0) @id of @copy (taken) for @peer, in its table: its id, or 0
 * with @error. */
uint64_t vn_fabric_export_insert(VnFabric *fab, uint64_t id, int copy, uint64_t offset,
                                 uint64_t size, bool device, const char *peer, GError **error);
/* The async exports' common half: @copy (checked, taken) exported here, or asked of the
 * backend (ops->export_async), and @done told (at once, or once it answers). */
void vn_fabric_export_start(VnFabric *fab, int copy, uint64_t offset, uint64_t size, bool device,
                            const char *peer, VnFabricExportFn done, void *opaque);
/* True, with @error, when @asks (the backend answers @what later): a waiting form is
 * refused there. */
bool vn_fabric_waits_refused(VnFabric *fab, bool asks, const char *what, GError **error);
/* The entry of @table (segments or routes) @peer may take, counting and
 * logging a refusal; @what names the table's kind. */
VnFabricSegment *vn_fabric_exported(VnFabric *fab, GHashTable *table, const char *what,
                                    const char *peer, uint64_t id, int *err);

/* route.c */
void vn_fabric_routes_init(VnFabric *fab);
void vn_fabric_routes_close(VnFabric *fab);

#endif /* VN_FABRIC_INT_H */
