/*
 * The NTB fabric: how vfio-ntb nodes (hosts) reach each other's memory and
 * talk, in Linux NTB's vocabulary.
 *
 * - A node attaches to a fabric under a unique name and sees its peers come
 *   and go (link up / link down events).
 * - A node exports fd-backed local memory as a *segment* (an id), to named
 *   peers only.  A peer maps a segment through one of its scarce *memory
 *   windows*; the window gives it a local fd and offset (what QEMU or VFIO
 *   mmap) and a mapping of that memory.
 * - Nodes exchange *messages*: framed requests with replies, and events.
 *   Messages carry bytes only, never a file descriptor: no NTB can.
 * - *Doorbells*: a peer rings bit N of a node's doorbell register; the node's
 *   handler runs with the bit.  A node's bits are its host's scarce budget
 *   (VnFabricLimits.doorbells): the layers above take blocks of them with
 *   vn_fabric_doorbells_alloc() and tell the peer which to ring.
 * - *Interrupt routes* (with VN_FABRIC_CAP_DIRECT_ROUTES): a node exports an
 *   eventfd of its own (a VM's irqfd) as a route; the peer opens it and gets
 *   a local fd that its device signals, as an MSI write through a window
 *   into the node's host would (Linux's ntb_msi).  Without the capability,
 *   interrupts travel as doorbells.
 * - What a backend can do is said by capability flags (vn_fabric_caps()),
 *   never by its name.
 *
 * Backends sit behind a const VnFabricOps table checked once at
 * registration.  The `shm` backend (the embedded default) runs every node as
 * a process on one machine: a fabric directory holds each node's UNIX
 * socket; mapping a window (or opening a route) passes the segment's memfd
 * (the route's eventfd) between the two backends, below this API, which is
 * how shm emulates a window onto a peer's memory.  It enforces NTB-like
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
/* Segments one node may export, whatever its limits say. */
#define VN_FABRIC_MAX_SEGMENTS 1024
/* One message's payload (JSON part + binary part); a 1 MiB region access
 * plus its header fits. */
#define VN_FABRIC_MAX_PAYLOAD (1024u * 1024u + 4096u)
/* Interrupt routes one node exports (every MSI-X vector of a few devices). */
#define VN_FABRIC_MAX_ROUTES 8192
/* Doorbell bits a node may have (Intel NTBs have 16, IDT 32, Switchtec 64);
 * how many it has is VnFabricLimits.doorbells. */
#define VN_FABRIC_MAX_DOORBELLS 64u
/* What one peer may have queued for us while we cannot dispatch (inside a
 * backend's call: a send, a connect, an open): a few of the
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
    uint32_t max_windows;      /* memory windows per node (default 8) */
    uint64_t max_window_size;  /* bytes (default 4 GiB) */
    uint64_t window_align;     /* window base/offset alignment (default 4 KiB) */
    uint64_t xlat_granularity; /* translation granularity (default 4 KiB) */
    uint32_t doorbells;        /* doorbell bits, 1..VN_FABRIC_MAX_DOORBELLS (default 32) */
    uint32_t max_segments;     /* inbound windows: segments exported at once,
                                  * 1..VN_FABRIC_MAX_SEGMENTS (default 64) */
    /* window sizes are powers of two, at least xlat_granularity */
} VnFabricLimits;

void vn_fabric_limits_default(VnFabricLimits *l);

/* A mapped window onto a peer's segment. */
typedef struct VnFabricWindow {
    char peer[VN_MAX_NODE_NAME + 1];
    uint64_t segment;
    uint64_t size;        /* the segment's size (window rounded up to 2^n) */
    uint64_t window_size; /* the window it occupies: 2^n >= size and
                                  * >= xlat_granularity */
    int fd;               /* owned by the fabric; valid until unmapped */
    uint64_t offset;      /* where the segment's bytes start in @fd */
    /* Mapping of [0, size) of memory; NULL for a device's memory (@device),
     * which is handed on (to QEMU) and never touched here: a device may
     * make an access fault (vn_peerfd_device_memory()). */
    uint8_t *host;
    bool device;
    /* One of this node's own segments (shared with itself: vn_fabric_segment_share), mapped
     * without a window: its memory is here, nothing crosses the fabric. */
    bool local;
} VnFabricWindow;

/* A received message: bytes only. */
typedef struct VnFabricMsg {
    const char *peer;    /* sender */
    uint32_t type;       /* user-defined, below VN_FABRIC_TYPE_RESERVED */
    const char *json;    /* NUL-terminated JSON object text, or NULL */
    const uint8_t *data; /* binary part */
    size_t data_len;
} VnFabricMsg;

/* Types at or above this are the fabric's own (doorbells). */
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
    /* The backend let go of every window and route it had with @peer, after that link's
     * down: what they carried cannot come back (an NTB session ended other than by a
     * restart that took it over: the peer's link lost, a new session of its).  A link
     * whose windows outlive it (shm: files) never says so. */
    void (*on_paths_lost)(void *opaque, const char *peer);
} VnFabricHandlers;

/*
 * Capability flags (VnFabricOps.caps, vn_fabric_caps()).
 * DIRECT_ROUTES: a peer's device can signal an eventfd of ours with no
 * software in between (an MSI write through a window into our host, as
 * Linux's ntb_msi sets up); the backend has open_route.
 */
#define VN_FABRIC_CAP_DIRECT_ROUTES 0x1u
#define VN_FABRIC_CAPS_KNOWN VN_FABRIC_CAP_DIRECT_ROUTES

/* A backend. */
/* What a worker holds through its daemon (vn_fabric_adopt, after the daemon's restart). */
typedef enum VnFabricHeld {
    VN_FABRIC_HELD_SEGMENT, /* a segment it exported */
    VN_FABRIC_HELD_ROUTE,   /* a route it exported */
    VN_FABRIC_HELD_WINDOW,  /* a window onto a peer's segment it mapped */
    VN_FABRIC_HELD_LAST
} VnFabricHeld;

/* A backend's answer to an op asked without waiting: 0 or -errno, the op's value(s), an fd
 * (the callee's to close) or -1. */
typedef void (*VnFabricBackendDone)(void *opaque, int status, uint64_t value, int fd);

typedef struct VnFabricOps {
    const char *name;
    uint32_t caps; /* VN_FABRIC_CAP_*, within VN_FABRIC_CAPS_KNOWN */
    /* Optional: check @params as open would, touching nothing (no file,
     * socket or device is opened or made), for a config check before the
     * node joins (vfio-ntbd --check-config, a reload).  False with @error,
     * and *@bad (never NULL) set to the parameter at fault, or NULL when
     * the fault is none's alone (one missing). */
    bool (*check_params)(GHashTable *params, const char **bad, GError **error);
    /* Required. */
    void *(*open)(VnFabric *fab, const char *node, GHashTable *params, GError **error);
    void (*close)(void *backend);
    /* Never waits: 0 when the link is up now (reported by vn_fabric_backend_link), -EINPROGRESS
     * when it is on its way (reported once up), or -errno. */
    int (*connect)(void *backend, const char *peer);
    int (*send)(void *backend, const char *peer, const void *buf, size_t len);
    /* End the link to @peer (a peer that broke a bound).  Its link down is
     * reported later, from the backend's own source, never from inside this
     * call; what it sent meanwhile may still arrive. */
    void (*disconnect)(void *backend, const char *peer);
    /*
     * Required.  Map @peer's segment @id through an outbound window, without waiting:
     * @done runs once, from the backend's sources (at once when it cannot be asked; from
     * close with -ECANCELED), with a new fd of ours (or -errno) whose bytes from @offset
     * are the segment, and its @size.  The peer's backend checks the segment with
     * vn_fabric_backend_segment(); at most @timeout_ms.
     */
    void (*map_segment_async)(void *backend, const char *peer, uint64_t id, int timeout_ms,
                              void (*done)(void *opaque, int fd, uint64_t size, uint64_t offset),
                              void *opaque);
    /* With VN_FABRIC_CAP_DIRECT_ROUTES: a new fd of ours that signals @peer's route @id
     * (checked there by vn_fabric_backend_route()), or -errno, told to @done as for
     * map_segment_async. */
    void (*open_route_async)(void *backend, const char *peer, uint64_t id, int timeout_ms,
                             void (*done)(void *opaque, int fd), void *opaque);
    /*
     * Optional, for a backend whose node's resources someone else keeps (a worker's, kept
     * by its daemon; fabric/host.h), each asked without waiting and answered once to @done
     * (from the backend's sources; from close with -ECANCELED) with 0 or -errno, a value
     * and maybe an fd (the callee's):
     * export_async: publish @size bytes of @fd (borrowed) from @offset as a segment (a
     * route when @size is 0) for @peer; the value is its id.  unexport withdraws it.
     * withhold_async: as withhold below; the value is how many windows changed.
     * join_windows_async: as join_windows below; the fd, the value its offset.
     * doorbells_alloc_async: the host's budget (vn_fabric_doorbells_alloc_async); the
     * value is the first bit.  doorbells_free gives bits back.
     * unmap_segment: a window onto @peer's segment @id is gone.
     * Without them the fabric does all of it itself.
     */
    void (*export_async)(void *backend, int fd, uint64_t offset, uint64_t size, const char *peer,
                         VnFabricBackendDone done, void *opaque);
    void (*unexport)(void *backend, bool route, uint64_t id);
    void (*withhold_async)(void *backend, uint64_t id, bool withhold, VnFabricBackendDone done,
                           void *opaque);
    void (*join_windows_async)(void *backend, const char *peer, const uint64_t *ids, uint32_t n,
                               uint64_t chunk, bool device, VnFabricBackendDone done, void *opaque);
    void (*doorbells_alloc_async)(void *backend, uint32_t count, VnFabricBackendDone done,
                                  void *opaque);
    void (*doorbells_free)(void *backend, uint32_t first, uint32_t count);
    void (*unmap_segment)(void *backend, const char *peer, uint64_t id);
    /* Optional: segment @id's windows reach nothing (@withhold) or it again;
     * once that holds (an NTB's translations cleared or set again), how many
     * windows it changed, or -errno.  Without it the backend's peers map the segment's fd itself,
     * whose owner guards it (VFIO revokes its own mappings of a BAR). */
    int (*withhold)(void *backend, uint64_t id, bool withhold);
    /* Optional, for a backend that keeps what a node set up past the node's end (an NTB's
     * session taken over, fabric/ntb-resume.c): adopt: whether it holds @kind @id for
     * @peer from before (a window: onto @peer's segment @id), taken over and not adopted
     * yet; adopt_end: what it took over and nobody adopted is undone (no worker holds it). */
    bool (*adopt)(void *backend, VnFabricHeld kind, uint64_t id, const char *peer);
    void (*adopt_end)(void *backend);
    /* Optional, for a backend whose windows are files of their own (an NTB
     * module's): a new fd whose bytes from *@offset are the windows onto
     * @peer's segments @ids (@n of them, mapped here), @chunk bytes each, in
     * order, or -errno; a revoke of any of those windows revokes it too.
     * @device: they reach a device's registers (mapped uncached), not memory. */
    int (*join_windows)(void *backend, const char *peer, const uint64_t *ids, uint32_t n,
                        uint64_t chunk, bool device, uint64_t *offset);
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
 * by VN_FABRIC_MAX_FRAME); @buf is borrowed.  A peer's link is reported up
 * before its first frame.  Neither call may come from ops->close.
 */
void vn_fabric_backend_received(VnFabric *fab, const char *peer, const uint8_t *buf, size_t len);
void vn_fabric_backend_link(VnFabric *fab, const char *peer, bool up);
/* After @peer's link down: the windows and routes with it are gone for good (on_paths_lost). */
void vn_fabric_backend_paths_lost(VnFabric *fab, const char *peer);
/* Bytes no frame owns were refused (a bad handshake, an impossible length):
 * counted in stats.bad_messages.  @what names the connection and the fault. */
void vn_fabric_backend_rejected(VnFabric *fab, const char *what);
/* For ops->open: the context to attach sources to, and the backend's window
 * limits (vn_fabric_limits_default() unless set). */
GMainContext *vn_fabric_backend_context(VnFabric *fab);
void vn_fabric_backend_set_limits(VnFabric *fab, const VnFabricLimits *limits);
/* For ops->open: this node can do less than the backend's ops->caps say
 * (a worker's, what its host's fabric does): @caps within them. */
void vn_fabric_backend_set_caps(VnFabric *fab, uint32_t caps);
/* For ops->open: a peer takes at most @n of our requests at once (default
 * VN_FABRIC_MAX_INFLIGHT, what a fabric node takes); vn_fabric_request() holds back the
 * rest, in order, until it answers. */
void vn_fabric_backend_set_max_asked(VnFabric *fab, unsigned n);
/*
 * For a backend answering @peer's map of segment @id (or open of route @id):
 * the fd to give (borrowed) and, for a segment, its size and where it starts
 * in the fd, and in *@device (may be NULL) whether it is a device's region
 * (registers) rather than memory, as its export found; -ENOENT for no such id, -EACCES when it is not exported to
 * @peer.  Refusals are counted and logged here.
 */
int vn_fabric_backend_segment(VnFabric *fab, const char *peer, uint64_t id, uint64_t *size,
                              uint64_t *offset, bool *device);
int vn_fabric_backend_route(VnFabric *fab, const char *peer, uint64_t id);

/*
 * The checks vn_fabric_open() makes of @backend's name and its @params (the
 * fabric's own and the backend's check_params), without opening anything:
 * false with @error and *@bad (may be NULL) the parameter at fault, or NULL.
 */
bool vn_fabric_params_check(const char *backend, GHashTable *params, const char **bad,
                            GError **error);

/*
 * Attach node @node to the fabric of backend @backend ("shm") with its
 * parameters (for shm: "dir", and the limits "max-windows",
 * "max-window-size", "window-align", "xlat-granularity", and the modelled
 * "crossing-delay-ns" of shm.h).  The fabric itself
 * takes "request-timeout-ms" (default VN_FABRIC_REQUEST_TIMEOUT_MS) and "doorbell-rate"
 * (per peer and second, VN_FABRIC_MIN_DOORBELL_RATE..VN_FABRIC_MAX_DOORBELL_RATE, default
 * VN_FABRIC_DOORBELL_RATE).
 */
VnFabric *vn_fabric_open(const char *backend, const char *node, GHashTable *params,
                         const VnFabricHandlers *handlers, void *opaque, GMainContext *ctx,
                         GError **error);
/* Outstanding requests complete with -ECANCELED (their callbacks run in
 * here), windows are unmapped, segments withdrawn.  Not from inside one of
 * the fabric's own callbacks. */
void vn_fabric_close(VnFabric *fab);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnFabric, vn_fabric_close)

const char *vn_fabric_node(VnFabric *fab);
const VnFabricLimits *vn_fabric_limits(VnFabric *fab);
uint32_t vn_fabric_caps(VnFabric *fab);

/* The nodes the backend can see now (empty when it cannot tell); owned. */
GPtrArray *vn_fabric_discover(VnFabric *fab);

/* Open the link to @peer (idempotent) without waiting: true when it is up now.  A link on
 * its way (an NTB session being set up) is false with G_IO_ERROR_PENDING, and on_link reports
 * it up later. */
bool vn_fabric_connect(VnFabric *fab, const char *peer, GError **error);

/* A connect whose caller waits for the link (vn_fabric_connect_async). */
typedef struct VnFabricConnect VnFabricConnect;
typedef void (*VnFabricConnected)(void *opaque, int err);
/* How long vn_fabric_connect_async waits for a link on its way, and how many connects may
 * be under way at once (past it, one is answered -EAGAIN). */
#define VN_FABRIC_CONNECT_WAIT_MS 1000
#define VN_FABRIC_MAX_CONNECTS 1024
/*
 * Open the link to @peer and be called back, never waiting: @done runs once, from the loop
 * (never inside this call), with 0 once the link is up, or -errno: the connect's own error,
 * -EHOSTUNREACH when the link did not come within VN_FABRIC_CONNECT_WAIT_MS, -EAGAIN past
 * VN_FABRIC_MAX_CONNECTS under way, -ECANCELED when the fabric closed first.  Returns the connect, to cancel with vn_fabric_connect_cancel()
 * (then @done never runs) until @done ran; NULL, and @done never runs, when the fabric is
 * closing.
 */
VnFabricConnect *vn_fabric_connect_async(VnFabric *fab, const char *peer, VnFabricConnected done,
                                         void *opaque);
void vn_fabric_connect_cancel(VnFabricConnect *c);
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
/*
 * The same for @size bytes from @offset of @fd, which may also be a device's
 * memory: a VFIO device fd's mappable region (a BAR), as an NTB's inbound
 * window translated to the BAR's bus address would give it.  The mapper's
 * window then reaches the device (VnFabricWindow.device).
 *
 * What shm cannot do that an NTB does: the mapper gets the device fd itself
 * (a window onto a BAR must be an fd of the device on one machine), so the
 * process it hands the window to (the borrower's QEMU) holds the device's
 * VFIO fd, ioctls and all, and a withdrawn segment is not revoked from it.
 * The emulated fabric is one machine's test bed; an NTB hands only the
 * window's mapping.
 */
uint64_t vn_fabric_segment_export_at(VnFabric *fab, int fd, uint64_t offset, uint64_t size,
                                     const char *peer, GError **error);
/*
 * The calls a node whose resources its daemon keeps (a worker's: fabric/host.h) makes
 * without waiting, and every other node may make too: @done runs once, with the answer,
 * either at once (refused here, or a backend that answers itself) or later from the loop
 * (after vn_fabric_close() with -ECANCELED, so an @opaque it frees must outlive the
 * close).  The waiting forms above and below (vn_fabric_segment_export_at,
 * vn_fabric_route_export, vn_fabric_segment_withhold, vn_fabric_windows_join,
 * vn_fabric_doorbells_alloc) refuse such a node (-EOPNOTSUPP: no loop waits on another
 * process).  Export: the id (> 0), or 0 with @error.
 */
typedef void (*VnFabricExportFn)(void *opaque, uint64_t id, const GError *error);
void vn_fabric_segment_export_async(VnFabric *fab, int fd, uint64_t offset, uint64_t size,
                                    const char *peer, VnFabricExportFn done, void *opaque);
void vn_fabric_route_export_async(VnFabric *fab, int eventfd, const char *peer,
                                  VnFabricExportFn done, void *opaque);
/* vn_fabric_segment_withhold's answer (windows changed, or -errno), told to @done. */
void vn_fabric_segment_withhold_async(VnFabric *fab, uint64_t id, bool withhold,
                                      void (*done)(void *opaque, int ret), void *opaque);
/* vn_fabric_windows_join's answer (an fd and its offset, or -errno with @error). */
typedef void (*VnFabricJoinFn)(void *opaque, int fd, uint64_t offset, const GError *error);
void vn_fabric_windows_join_async(VnFabric *fab, VnFabricWindow *const *w, uint32_t n,
                                  VnFabricJoinFn done, void *opaque);
/* vn_fabric_doorbells_alloc's answer (the first bit, or -errno with @error). */
typedef void (*VnFabricBitsFn)(void *opaque, int first, const GError *error);
void vn_fabric_doorbells_alloc_async(VnFabric *fab, uint32_t count, VnFabricBitsFn done,
                                     void *opaque);
/* Withdraw a segment, with its shares: peers cannot map it any more (existing shm
 * mappings of a memfd cannot be revoked by this backend; see the lender's fencing). */
void vn_fabric_segment_unexport(VnFabric *fab, uint64_t id);
/*
 * Share segment @id, which this node exports to one peer, with @peer as well: a new
 * segment of the same memory that only @peer may map, withdrawn with @id (docs/p2p.md: the
 * holder of a lent device lets another device of its VM reach the device's BAR).  @peer may
 * be this node itself (another of its workers maps it: vn_fabric_window_map_async maps
 * the node's own segments without a link).  Returns the share's id, the one there is when
 * @id is shared with @peer already, or @id itself when @peer is the one it is exported to;
 * 0 with @error (no such segment, one adopted without its fd, a share of a share, no
 * inbound window left).  The daemon's node only: a worker's node refuses (-EOPNOTSUPP).
 */
uint64_t vn_fabric_segment_share(VnFabric *fab, uint64_t id, const char *peer, GError **error);
/* The peer segment @id is exported to, or NULL when it is not ours. */
const char *vn_fabric_segment_peer(VnFabric *fab, uint64_t id);
/*
 * Withhold segment @id (@withhold: every window onto it reaches nothing, as
 * on a device whose memory decode is off) or give it back: once that holds,
 * how many windows onto it changed (0: none, or a backend whose peers map its
 * fd itself), -ENOENT for a segment we do not export, or the backend's -errno.  The
 * segment stays exported and mapped meanwhile.  A lender withholds a
 * device's BARs before its memory is disabled or it is reset.
 */
int vn_fabric_segment_withhold(VnFabric *fab, uint64_t id, bool withhold);

/*
 * Map @peer's segment @id through a memory window, without waiting: @done gets the window
 * or an error, once, later (at once when the arguments or the budget refuse it), at most
 * the request timeout after.  The window's slot is taken meanwhile.  It fails for an
 * unknown or not-exported-to-us segment, or when no window is free or the segment exceeds
 * the window limits, and for a window whose fd is not a memfd sealed against shrinking
 * that holds the size claimed: anything else could shrink under the mapping.
 */
typedef void (*VnFabricMapFn)(void *opaque, VnFabricWindow *w, const GError *error);
void vn_fabric_window_map_async(VnFabric *fab, const char *peer, uint64_t id, VnFabricMapFn done,
                                void *opaque);
void vn_fabric_window_unmap(VnFabric *fab, VnFabricWindow *w);
uint32_t vn_fabric_windows_in_use(VnFabric *fab);
/* Windows one join may take: the segments of one BAR (lending/proto.h). */
#define VN_FABRIC_MAX_JOIN 16u
/*
 * One fd for @n (2..VN_FABRIC_MAX_JOIN) windows of ours onto one peer, each
 * w[0]->size bytes but the last (no larger), as one memory: a BAR larger
 * than a window, which QEMU maps with one mmap.  Where the windows are
 * slices of one open file at consecutive offsets (shm: the lender cut them
 * from one fd) that file serves and nothing is joined; an NTB's windows are
 * files of their own, which its backend joins (join_windows).  Returns a new
 * fd, the caller's to close, whose bytes from *@offset are the windows in
 * order, or -errno with @error (-ENOTSUP: this backend cannot).  The windows
 * stay mapped; once one is unmapped, the joined fd reaches nothing either.
 */
int vn_fabric_windows_join(VnFabric *fab, VnFabricWindow *const *w, uint32_t n, uint64_t *offset,
                           GError **error);

/*
 * Interrupt routes (VN_FABRIC_CAP_DIRECT_ROUTES; -ENOTSUP without).
 * Export: @eventfd (borrowed; the fabric keeps a dup) may be signalled by
 * @peer's devices; returns the route's id (> 0), or 0 with @error.  Ids are
 * never reused.  Unexport: the peer cannot open it any more (what it opened
 * already cannot be revoked by shm; see the lender's fencing).
 */
uint64_t vn_fabric_route_export(VnFabric *fab, int eventfd, const char *peer, GError **error);
void vn_fabric_route_unexport(VnFabric *fab, uint64_t id);

/*
 * After a restart: what the node before us set up for a worker that still holds it is ours
 * again.  A segment or route @id exported for @peer: ours to unexport (and withhold) again;
 * its fd stayed with the worker, so the peer cannot map it anew (-ESTALE).  A window onto
 * @peer's segment @id: ours to unmap again (vn_fabric_adopted_unmap).  False when the id is
 * known already, the tables are full, or the backend does not hold it for @peer.  Once every
 * worker had its chance, vn_fabric_adopt_end(): the backend undoes what it took over that
 * no worker adopted.
 */
bool vn_fabric_adopt(VnFabric *fab, VnFabricHeld kind, uint64_t id, const char *peer);
void vn_fabric_adopted_unmap(VnFabric *fab, const char *peer, uint64_t id);
void vn_fabric_adopt_end(VnFabric *fab);
/*
 * Open @peer's route @id without waiting (no loop may wait on a peer that may never
 * answer): @done gets a new eventfd of ours that signals it (the callee's to close) or
 * -errno with @error, once, later -- at once when the arguments refuse it.  After
 * vn_fabric_close() it is called with -ECANCELED, so an @opaque it frees must not be freed
 * elsewhere meanwhile.
 */
typedef void (*VnFabricRouteFn)(void *opaque, int fd, const GError *error);
void vn_fabric_route_open_async(VnFabric *fab, const char *peer, uint64_t id, VnFabricRouteFn done,
                                void *opaque);

/*
 * Messages.  @json may be NULL; @data/@len a binary part.
 * vn_fabric_request() calls @done(opaque, reply or NULL, -errno) once when
 * it returned 0 (never when it returned -errno).  The reply is borrowed for
 * the call; an error reply is passed too (its JSON {"error": "..."}).
 */
typedef void (*VnFabricReplyFn)(void *opaque, VnFabricMsg *reply, int err);
int vn_fabric_request(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                      const void *data, size_t len, VnFabricReplyFn done, void *opaque);
int vn_fabric_reply(VnFabric *fab, uint64_t token, const char *json, const void *data, size_t len);
int vn_fabric_reply_error(VnFabric *fab, uint64_t token, int err, const char *message);
/* vn_fabric_reply_error() with the message made of @fmt. */
int vn_fabric_reply_errorf(VnFabric *fab, uint64_t token, int err, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
int vn_fabric_event(VnFabric *fab, const char *peer, uint32_t type, const char *json,
                    const void *data, size_t len);
void vn_fabric_msg_free(VnFabricMsg *msg);
/* A copy of @msg that outlives its handler (one kept to be handled later); free with
 * vn_fabric_msg_free(). */
VnFabricMsg *vn_fabric_msg_dup(const VnFabricMsg *msg);
/* The peer's explanation in an error reply ("error" member), or NULL. */
char *vn_fabric_error_message(const VnFabricMsg *reply);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnFabricMsg, vn_fabric_msg_free)

/* Doorbells one peer may have delivered per second ("doorbell-rate"), and in a burst (at
 * most the rate).  Beyond, each bit rung meanwhile is delivered once when the budget has
 * room again, at least VN_FABRIC_DOORBELL_TICK_MS later (an interrupt is an edge: one
 * delivery stands for them all), so a peer's flood costs a wake-up per bit and budget
 * tick, not one per ring; counted in doorbells_coalesced. */
#define VN_FABRIC_DOORBELL_RATE 200000u
#define VN_FABRIC_MIN_DOORBELL_RATE 100u
#define VN_FABRIC_MAX_DOORBELL_RATE 10000000u
#define VN_FABRIC_DOORBELL_BURST 512u
#define VN_FABRIC_DOORBELL_TICK_MS 1u

/* Ring doorbell @bit (< VN_FABRIC_MAX_DOORBELLS) of @peer; a bit beyond the
 * peer's register is refused there. */
int vn_fabric_doorbell(VnFabric *fab, const char *peer, uint32_t bit);

/*
 * Take @count (1..limits.doorbells) consecutive doorbell bits of this node
 * for the layer above: returns the first, or -ENOSPC (all taken: @error
 * says how many the host has) / -EINVAL.  Give them back with
 * vn_fabric_doorbells_free(); bits not taken are never handed out twice.
 */
int vn_fabric_doorbells_alloc(VnFabric *fab, uint32_t count, GError **error);
void vn_fabric_doorbells_free(VnFabric *fab, uint32_t first, uint32_t count);
/* Take exactly bits [first, first + count) (a restarted daemon's worker
 * claiming back what it had): 0, or -EBUSY / -EINVAL. */
int vn_fabric_doorbells_claim(VnFabric *fab, uint32_t first, uint32_t count);
uint32_t vn_fabric_doorbells_in_use(VnFabric *fab);

/* Counters: messages sent/received, doorbells, windows mapped. */
typedef struct VnFabricStats {
    uint64_t msgs_sent;
    uint64_t msgs_received;
    uint64_t doorbells_sent;
    uint64_t doorbells_received;
    uint64_t doorbells_coalesced; /* beyond a peer's rate: folded into one delivery per bit */
    uint64_t windows_mapped;
    uint64_t routes_opened;
    uint64_t bad_messages;
    uint64_t requests_held; /* sent later: the peer had as many of ours as it takes */
} VnFabricStats;
void vn_fabric_stats(VnFabric *fab, VnFabricStats *out);

#endif /* VN_FABRIC_H */
