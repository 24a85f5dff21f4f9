/*
 * The `host` fabric backend: a worker's view of its host's fabric node.
 *
 * A host has one fabric identity, its daemon's node (an NTB adapter is one
 * endpoint with one budget of windows and doorbell bits).  A worker (the
 * vfio-user server of one borrowed device) is not a node: it opens a
 * VnFabric on this backend, which speaks for it through its daemon's
 * *port*, a UNIX socket of its own that the daemon listens on
 * (daemon/port.h).  Its frames go out as the daemon's, its windows are the
 * daemon's windows (the fd comes over the port), its segments and routes
 * are exported by the daemon, its doorbell bits are the daemon's.  Within a
 * host fds may pass (SCM_RIGHTS); nothing here crosses a host.
 *
 * Parameters: "port" (required), the socket's path; "fd", the connection
 * the daemon made for the worker (an inherited socket: the port takes a
 * connection to its socket only from a worker that already had one, see
 * daemon/port.h); "reconnect-ms", the bound below (default
 * VN_HOST_RECONNECT_MS; tests shorten it).  The answer to the first HELLO
 * carries the worker's secret (VN_HOST_SECRET_LEN bytes); every later HELLO,
 * on a connection to the socket, carries it back.
 *
 * A daemon that restarts closes the port; the backend reconnects, without
 * reporting any link down for up to VN_HOST_RECONNECT_MS (the data path --
 * mapped windows, routes -- does not go through the port), claims its
 * doorbell bits back, and asks for its links again.  Requests sent while it
 * is away fail (-ENOTCONN).  Past the bound every link is reported down,
 * and it goes on dialling: a daemon started later adopts it.  Each time the
 * daemon goes, the bound starts again.
 *
 * Wire: records (fabric/record.h) of a VnHostHdr, then for SEND and RECV
 * one fabric frame (fabric/frame.h), for JOIN_WINDOWS its segment ids.  Ops a worker sends that get an answer
 * carry a sequence number the REPLY echoes; the daemon answers them in
 * order.  The daemon checks everything a worker sends (it is a peer like
 * any other): only its lender, only its device, only its own segments,
 * routes and bits.
 *
 * Threads: all of it runs in the fabric's GMainContext.
 */
#ifndef VN_HOST_H
#define VN_HOST_H

#include "fabric.h"

#include <stdint.h>

/* The backend's table; vn_fabric_open() registers it as "host". */
extern const VnFabricOps vn_host_ops;

/*
 * For a lender worker on this backend: tell the daemon that the host wants
 * its device back (VFIO's device request), so that it revokes the lease.
 * False when @fab is not a `host` node or its daemon is away.
 */
bool vn_host_device_request(VnFabric *fab);
/* For a lender worker: its device is fenced (or had nothing to fence) after its holder
 * went; the daemon may lend it again.  False as above. */
bool vn_host_fenced(VnFabric *fab);
/* For a lender worker: whether its device server answers (@up) and how many times a lost
 * one came back (@gen).  Kept and said again to each daemon that greets the worker, so a
 * restarted daemon knows it too.  False when the daemon is away (it hears at the greeting)
 * or @fab is not a `host` node. */
bool vn_host_device_server(VnFabric *fab, bool up, uint32_t gen);
/* For a lender worker that cannot reach its device server's socket itself (it gave up its
 * privileges): the daemon dials the one its config names and hands the connection over.
 * Asked without waiting: @done gets a connected fd (the callee's), or -1 with @error (the
 * daemon away, the server refusing, the daemon refusing a worker that dials too often), at
 * once when it cannot be asked, else from the loop (-ECANCELED's error at the node's close). */
typedef void (*VnHostDialedFn)(void *opaque, int fd, const GError *error);
void vn_host_dial_device_async(VnFabric *fab, VnHostDialedFn done, void *opaque);

/*
 * For a borrower worker: the daemon keeps, for whoever serves the device after it, the fds
 * QEMU reaches it by and what it set up (systemd's fd store is the model), so that a worker
 * that dies is replaced without QEMU seeing its socket close (daemon/takeover.c).  @fd is
 * sent as is (the daemon gets its own copy); key 0 is the state, @data of @len bytes.
 * Said again by the caller from its greeted callback, since a restarted daemon has none of
 * it.  False when the daemon is away or @fab is not a `host` node.
 */
#define VN_HOST_MAX_KEPT_STATE (64u * 1024u)
/* The keys a borrower worker keeps its fds under (its state is key 0): its listening socket,
 * QEMU's connection, and from VN_HOST_KEEP_IRQ_FIRST the eventfd of each vector
 * (VN_HOST_KEEP_IRQ(index, vector)). */
#define VN_HOST_KEEP_LISTEN 1u
#define VN_HOST_KEEP_CLIENT 2u
#define VN_HOST_KEEP_IRQ_FIRST 0x100u
#define VN_HOST_KEEP_IRQ(index, vector) \
    (VN_HOST_KEEP_IRQ_FIRST + ((uint64_t)(index) << 12) + (vector))
bool vn_host_keep(VnFabric *fab, uint64_t key, int fd, const void *data, size_t len);
/* Forget what is kept under [@first, @last]. */
bool vn_host_forget(VnFabric *fab, uint64_t first, uint64_t last);
/* @fn runs after each greeting by a daemon but the first (the worker's daemon restarted). */
typedef void (*VnHostGreetedFn)(void *opaque);
void vn_host_on_greeted(VnFabric *fab, VnHostGreetedFn fn, void *opaque);
/*
 * For the worker that takes over a dead one's port: the segments and routes it exported
 * (to @peer) and its doorbell bits are ours now, so that we may give them back.  The daemon
 * checks each against what the port holds, as it always does.  False when an id is given
 * twice, or doorbell bits to a node that is not a `host` one (which took over nothing: the
 * unit tests' borrower on shm).
 */
bool vn_host_take_over(VnFabric *fab, const char *peer, const uint64_t *segments, unsigned nseg,
                       const uint64_t *routes, unsigned nroutes, uint64_t doorbells);

/*
 * Peer-to-peer targets (docs/p2p.md).  A borrower worker says where its guest put its
 * device's mapped BARs (a BAR: its guest-physical range and the lender's segments that make
 * it, each @chunk bytes but the last), and which ranges QEMU mapped for its device without
 * memory (offers).  Its daemon, which knows every device of the VM, matches the two: an
 * offer inside another device's BAR becomes a target, that device's lender's segments
 * shared with our lender, which the worker maps for its device (a DMA_MAP naming @peer).
 */
#define VN_HOST_MAX_BARS 6u
#define VN_HOST_BAR_SEGMENTS 16u
/* A BAR's region index: one of a PCI function's six BARs (VFIO_PCI_BAR0..5_REGION_INDEX). */
#define VN_HOST_BAR_MAX_REGION 5u
typedef struct VnHostBar {
    uint64_t gpa;
    uint64_t size;
    uint64_t chunk;
    uint32_t region;
    uint32_t nr_segments; /* 1..VN_HOST_BAR_SEGMENTS */
    uint64_t segments[VN_HOST_BAR_SEGMENTS];
} VnHostBar;
typedef struct VnHostP2pTarget {
    uint64_t offset; /* where the offer's first byte lies in segments[0] */
    uint64_t chunk;  /* each segment's size (the last may be smaller) */
    uint32_t nr_segments;
    uint32_t reserved;
    uint64_t segments[VN_HOST_BAR_SEGMENTS]; /* @peer's, shared with our lender */
} VnHostP2pTarget;
/* A borrower worker says where its guest put its BARs (@n of them, 0: none), and what QEMU
 * mapped without memory (@withdraw: unmapped).  False when the daemon is away (said again
 * from the greeted callback) or @fab is no `host` node. */
bool vn_host_p2p_place(VnFabric *fab, const VnHostBar *bars, unsigned n);
bool vn_host_p2p_offer(VnFabric *fab, uint64_t iova, uint64_t size, bool withdraw);
/* Its daemon found a target for an offer (@t), or one went (@t NULL): @fn runs from the
 * loop.  @peer and @t are the daemon's word, checked only for their form. */
typedef void (*VnHostP2pFn)(void *opaque, uint64_t iova, uint64_t size, const char *peer,
                            const VnHostP2pTarget *t);
void vn_host_on_p2p(VnFabric *fab, VnHostP2pFn fn, void *opaque);

/* HELLO's arg: the caps in bits 0-31; in bits 32-39 the log2 of the
 * node's largest window (its max-window-size rounded down to a power of
 * two), 0 from a daemon that predates it (the default then). */
#define VN_HOST_HELLO_WINDOW_SHIFT 32
#define VN_HOST_HELLO_WINDOW_MASK 0xffu

typedef enum VnHostOp {
    VN_HOST_INVALID = 0,
    /* worker -> daemon; the ones marked "->" get a REPLY */
    VN_HOST_HELLO = 1,        /* -> arg: the node's caps | VN_HOST_HELLO_WINDOW,
                                  * arg2: its windows */
    VN_HOST_CONNECT,          /* peer -> status: 0 once the link is up */
    VN_HOST_SEND,             /* peer; data: one fabric frame (request or event) */
    VN_HOST_MAP,              /* peer, arg: segment -> arg: size, arg2: offset, 1 fd */
    VN_HOST_UNMAP,            /* peer, arg: segment */
    VN_HOST_EXPORT_SEGMENT,   /* peer, arg: size, arg2: offset, 1 fd -> arg: id */
    VN_HOST_EXPORT_ROUTE,     /* peer, 1 fd -> arg: id */
    VN_HOST_UNEXPORT_SEGMENT, /* arg: id */
    VN_HOST_UNEXPORT_ROUTE,   /* arg: id */
    VN_HOST_OPEN_ROUTE,       /* peer, arg: id -> 1 fd */
    VN_HOST_DOORBELLS_ALLOC,  /* arg: count -> arg: first bit */
    VN_HOST_DOORBELLS_CLAIM,  /* arg: first, arg2: count -> (back after a restart) */
    VN_HOST_DOORBELLS_FREE,   /* arg: first, arg2: count */
    /* daemon -> worker */
    VN_HOST_REPLY, /* seq: the op's; status; arg, arg2; maybe 1 fd */
    VN_HOST_LINK,  /* peer, arg: 1 up, 0 down */
    VN_HOST_RECV,  /* peer; data: one fabric frame */
    /* worker -> daemon, appended so that the numbers above never change */
    VN_HOST_DEVICE_REQUEST,   /* a lender's: the host wants the device back */
    VN_HOST_WITHHOLD_SEGMENT, /* arg: id, arg2: 1 withhold, 0 give back -> arg: windows */
    VN_HOST_FENCED,           /* a lender's: its device fenced after its holder went */
    VN_HOST_JOIN_WINDOWS,     /* peer, arg: chunk, arg2: 1 a device's; data: the segments'
                               * ids (uint64_t, 2..VN_FABRIC_MAX_JOIN) -> arg: offset, 1 fd */
    VN_HOST_DEVICE_SERVER,    /* a lender's: arg: 1 its device server answers, 0 it is lost;
                               * arg2: how many times a lost one came back */
    VN_HOST_KEEP,             /* a borrower's: arg: key; 1 fd (key > 0), or data: its state
                               * (key 0, at most VN_HOST_MAX_KEPT_STATE bytes) */
    VN_HOST_FORGET,           /* a borrower's: arg: first key, arg2: last key */
    VN_HOST_DIAL_DEVICE,      /* a lender's -> 1 fd: a new connection to its device server */
    VN_HOST_CLAIM,            /* peer, arg: id, arg2: VnFabricHeld; no answer: what the
                               * daemon before this one set up for us, still ours */
    /* peer-to-peer targets (docs/p2p.md); a borrower's, no answer */
    VN_HOST_P2P_PLACE,    /* data: VnHostBar[] (0..VN_HOST_MAX_BARS): where its guest put its
                           * device's mapped BARs, all of them, replacing what it said before */
    VN_HOST_P2P_OFFER,    /* arg: iova, arg2: size: QEMU mapped [iova, +size) of its VM for
                           * the device without memory (another device's BAR, maybe) */
    VN_HOST_P2P_WITHDRAW, /* arg: iova, arg2: size: QEMU unmapped it (the offers inside go) */
    /* daemon -> borrower worker */
    VN_HOST_P2P_TARGET, /* peer, arg: iova, arg2: size; data: VnHostP2pTarget: an offer is
                         * another device's BAR, which @peer shared with our lender */
    VN_HOST_P2P_GONE,   /* arg: iova, arg2: size: that target is gone */
    VN_HOST_OP_LAST
} VnHostOp;

typedef struct VnHostHdr {
    uint32_t op;    /* VnHostOp */
    int32_t status; /* REPLY: 0 or the positive errno of a refusal */
    uint64_t seq;   /* ops with a REPLY: the worker's number, echoed */
    uint64_t arg;
    uint64_t arg2;
    char peer[VN_MAX_NODE_NAME + 1]; /* NUL-terminated, or "" */
} VnHostHdr;

/* The longest record on a port: a header and the largest frame. */
#define VN_HOST_MAX_RECORD ((uint32_t)sizeof(VnHostHdr) + VN_FABRIC_MAX_FRAME)
/* Requests a worker may have relayed by its daemon and unanswered: the daemon refuses more
 * (EBUSY), and the worker's fabric holds back the rest until one is answered. */
#define VN_HOST_MAX_RELAYED 64u
/* A worker's secret: what it proves itself with when it reconnects. */
#define VN_HOST_SECRET_LEN 32u
/* How long a worker waits for a restarted daemon. */
#define VN_HOST_RECONNECT_MS 30000
/* An op that gets a REPLY waits at most this long (the daemon answers at
 * once; a map waits on the peer, bounded by the request timeout). */
#define VN_HOST_REPLY_TIMEOUT_MS (VN_FABRIC_REQUEST_TIMEOUT_MS + 1000)

const char *vn_host_op_to_string(uint32_t op);

/* One record's bytes (a header and @len bytes of frame; its length in *@out_len), for a
 * sender that queues it (VnRecordOut); free with g_free(). */
uint8_t *vn_host_record_new(uint32_t op, uint64_t seq, int status, const char *peer, uint64_t arg,
                            uint64_t arg2, const void *data, size_t len, size_t *out_len);
/* Send one record (a header and @len bytes of frame, maybe @fd) on @sock:
 * 0 or -errno, as vn_record_send(). */
int vn_host_send(int sock, uint32_t op, uint64_t seq, int status, const char *peer, uint64_t arg,
                 uint64_t arg2, const void *data, size_t len, int fd);

/*
 * Check a record's header as its receiver: its length, the op (one a
 * worker sends when @from_worker, else one a daemon sends), a NUL-terminated
 * peer name that is a node name where the op needs one (or empty), and the
 * fd count the op carries (1 or 0; @nfds, @overflow as read).  NULL with
 * the header in @hdr and the frame's bytes in @frame / @frame_len, or what
 * is wrong (newly allocated).
 */
char *vn_host_record_check(const uint8_t *buf, size_t len, unsigned nfds, bool overflow,
                           bool from_worker, VnHostHdr *hdr, const uint8_t **frame,
                           size_t *frame_len);

#endif /* VN_HOST_H */
