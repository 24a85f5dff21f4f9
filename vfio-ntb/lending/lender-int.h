/*
 * Inside the lender: the VnLender struct and the calls between lender.c
 * (attach, fence, dispatch, region access, DMA) and lender-irq.c (SET_IRQS
 * and the doorbell relay).  Not for other layers.
 *
 * Threads: everything here belongs to the lender's fabric's GMainContext.
 */
#ifndef VN_LENDER_INT_H
#define VN_LENDER_INT_H

#include "lender.h"

#include "common/trace.h"
#include "lending/backend.h"

/*
 * How long one command to the device server may take.  Shorter than the
 * borrower's wait for our answer (VN_FABRIC_REQUEST_TIMEOUT_MS), which is
 * shorter than QEMU's for the borrower's (vfio-user-pci x-msg-timeout, 5 s):
 * each layer answers before the one above gives up, so no answer ever comes
 * after its asker stopped waiting (QEMU 10.2 takes a reply it no longer
 * waits for as a broken stream).
 */
#define VN_LENDER_DEVICE_TIMEOUT_MS 3000
/* The last stall described, for ntbctl show. */
#define VN_LENDER_STALL_TEXT 160
/* A device server whose commands time out (stopped, swapping) for this long is taken for
 * lost: its lease's DMA is fenced and it is presented anew once it answers again.  Much
 * longer than one command's timeout, so that a stall of a few seconds stays a stall. */
#define VN_LENDER_WEDGED_MS 10000
/* How often a lost (or not yet found) device server is dialled: at once again after a
 * refused connection, less often after a handshake that timed out (a stopped server: each
 * try holds the worker's loop for the dial's timeout).  While nobody holds the device, the
 * wait doubles after each failure up to VN_LENDER_DIAL_IDLE_MAX_MS: a host that lends many
 * devices whose servers are away stays quiet (each dial is a round trip through vfio-ntbd),
 * and a borrow dials at once anyway. */
#define VN_LENDER_DIAL_MS 1000
#define VN_LENDER_DIAL_SLOW_MS 5000
#define VN_LENDER_DIAL_IDLE_MAX_MS 16000
#define VN_LENDER_DIAL_TIMEOUT_MS 1000
/* The device server's last loss described, for ntbctl show. */
#define VN_LENDER_LOSS_TEXT 200
/* What the requests waiting behind one still being answered may hold (lender-queue.c):
 * their number is the fabric's bound on a peer's requests in flight (256), but writes of a
 * megabyte each would make that a quarter of a gigabyte.  16 of the largest: far more than
 * a borrower sends while one of its requests waits. */
#define VN_LENDER_MAX_QUEUED_BYTES (16u * 1024u * 1024u)
/* Interrupt indexes that can be relayed: INTx, MSI, MSI-X (PCI order,
 * linux/vfio.h).  ERR and REQ have no doorbell meaning in proto.h. */
#define VN_LENDER_RELAY_INDEXES (VFIO_PCI_MSIX_IRQ_INDEX + 1)

/* One relayed vector: the lender's eventfd the device signals. */
typedef struct VnLenderRelay {
    VnLender *l;
    int fd;
    GSource *src;
    uint32_t index;
    uint32_t vector;
    uint32_t bit; /* doorbell bit (proto.h) */
} VnLenderRelay;

/* A fabric window onto one of the borrower's segments (or a peer-to-peer target's, another
 * node's: docs/p2p.md), shared by every DMA mapping into that segment. */
typedef struct VnLenderWindow {
    VnFabricWindow *w;
    uint32_t refs; /* mappings using it */
} VnLenderWindow;

/* A DMA mapping the device holds for the borrower, through @window. */
typedef struct VnLenderMap {
    uint64_t iova;
    uint64_t size;
    VnLenderWindow *window;
} VnLenderMap;

/*
 * A request whose handler waits on the fabric (lender-queue.c), embedded first in the
 * handler's own state.  l is NULL once the lender went; device_gen says whether the
 * attachment it was made for is still the one (vn_lender_wait_current()).
 */
typedef struct VnLenderWait {
    VnLender *l;
    VnFabric *fab;
    uint64_t token;
    uint64_t device_gen;
    char corr[VN_TRACE_MAX_CORR];
} VnLenderWait;

/* What the parts below lender.c ask of it, through this table (set by vn_lender_new) so
 * that they call down only: a request handled now (lender-queue.c decides when), the lease
 * fenced (lender-irq.c: the host asked for the device back), the device dropped
 * (lender-server.c: its server lost). */
typedef struct VnLenderUp {
    void (*handle)(VnLender *l, VnFabricMsg *msg, uint64_t token);
    void (*fence)(VnLender *l, const char *why);
    void (*drop_device)(VnLender *l, const char *why);
} VnLenderUp;

struct VnLender {
    VnFabric *fab;
    const VnLenderUp *up;
    const char *corr;  /* the correlation id of the request being handled, or NULL */
    GMainContext *ctx; /* the fabric's: relay watches go there */
    char *name;
    const VnBackendOps *ops; /* how the device is reached (backend.h) */
    char *where;             /* what the backend opens: a socket path, ... */

    /* The lease holder, as the link up from its port says (NULL: none); it is the one
     * that may attach, and its requests before it has are not someone else's. */
    char *holder;

    /* While lent (borrower != NULL). */
    char *borrower;
    VnIrqMode irq_mode;
    void *device;       /* the backend's, while attached */
    VnProtoDevice dev;  /* as described to the borrower */
    GPtrArray *windows; /* VnLenderWindow, owned */
    GArray *maps;       /* VnLenderMap */
    /* The device's IOMMU (VnBackendOps.iommu, checked at attach) and the object its calls
     * take: the borrower's memory is mapped and unmapped through them alone.  Set and
     * cleared with device. */
    const VnBackendIommuOps *iommu_ops;
    void *iommu;
    VnLenderRelay *relay[VN_LENDER_RELAY_INDEXES][VN_PROTO_RELAY_VECTORS];
    int request_fd; /* the device request's eventfd, or -1 */
    GSource *request_src;
    uint32_t requests; /* asked this lending */

    VnLenderRequestFn on_request;
    void *on_request_opaque;

    /* The BAR guard (lender-guard.c): where the device's power management and PCIe
     * capabilities are (0: none), and whether the paths onto its BARs are withheld. */
    uint8_t pm_cap, exp_cap;
    bool bars_withheld;

    /* The device server (lender-server.c), for a backend that can lose it
     * (VnBackendOps.hangup_fd); otherwise only server_up is used (always true). */
    void *spare;           /* a connection made while not attached: the next attach uses it */
    GSource *hangup_src;   /* watching the connection in use (device or spare) */
    GSource *dial_src;     /* dialling a lost or not yet found server */
    guint dial_idle_ms;    /* the last wait between failed dials while not lent; 0: none */
    GSource *wedge_src;    /* a stall that may be a wedge: look again when it fires */
    gint64 stall_since_us; /* the current stall's first timeout; 0: none */
    bool server_up;        /* a connection to the server is open (device or spare) */
    bool server_lost;      /* it went while lent: the holder's requests are refused until it
                           * attaches again (the device it had is gone) */
    uint32_t server_gen;   /* how many times a lost server came back */
    char server_loss[VN_LENDER_LOSS_TEXT]; /* "" or "HH:MM:SS: why" */
    VnLenderServerFn on_server;
    void *on_server_opaque;
    VnLenderDialFn dial; /* vn_lender_set_dialer(), or NULL: ops->open dials */
    void *dial_opaque;
    void *dialing; /* a background dial asked of it, not answered yet (lender-server.c) */

    /* lender-queue.c: the request waiting on the fabric (or NULL), those after it, and
     * whether they are being handled now. */
    VnLenderWait *wait;
    GQueue queued;
    size_t queued_bytes;
    bool draining;
    /* Grows each time an attachment ends: a wait for an older one finds its device gone. */
    uint64_t device_gen;

    VnLenderStats stats;
    /* The device's last stall and its outcome ("" if none), set by the
     * backend's stall callback; whether it answers now is ops->stalled. */
    char last_stall[VN_LENDER_STALL_TEXT];
};

/*
 * lender-queue.c.  wait_begin: the request @token's handler waits on the fabric with @w (its
 * own, until its answer ends it); what comes meanwhile is queued.  wait_end: in the answer,
 * the lender again (NULL: it went; the answer cleans up alone); current: whether the
 * device it was made for is still attached.  wait_next: after the answer, handle the
 * queued.  queue_close: at the lender's end.
 */
void vn_lender_wait_begin(VnLender *l, VnLenderWait *w, uint64_t token);
VnLender *vn_lender_wait_end(VnLenderWait *w);
bool vn_lender_wait_current(VnLender *l, const VnLenderWait *w);
void vn_lender_wait_next(VnLender *l);
void vn_lender_queue_close(VnLender *l);
/* lender-answer.c: answer @token with @err (either sign) and a message that
 * starts with the device's name. */
void vn_lender_fail(VnLender *l, uint64_t token, int err, const char *fmt, ...) G_GNUC_PRINTF(4, 5);

/* lender-irq.c */
void vn_lender_set_irqs(VnLender *l, VnFabricMsg *msg, uint64_t token);
/* Stop relaying @index's vectors [start, start + count); count 0: all. */
void vn_lender_relay_drop(VnLender *l, uint32_t index, uint32_t start, uint32_t count);
void vn_lender_relay_drop_all(VnLender *l);
/* Hear the device's REQ while lent (attach), and stop (release). */
void vn_lender_request_watch(VnLender *l);
void vn_lender_request_unwatch(VnLender *l);
/*
 * lender-guard.c.  probe: find the capabilities the guard reads (at attach).
 * write: a config write of @count bytes of @data at @offset (request @token) that may stop
 * the device decoding its memory, or made while the paths onto its BARs are withheld, is
 * the guard's to make and answer (true): the paths withheld first (confirmed, drained),
 * given back once the device decodes again.  false: an ordinary write, the caller's.
 * reset: a reset of the device (request @token), made and answered the same way.
 */
void vn_lender_guard_probe(VnLender *l);
/* @count bytes of the device's config space at @offset: 0, or -errno (a short read: -EIO). */
int vn_lender_cfg_read(VnLender *l, uint32_t offset, void *buf, uint32_t count);
bool vn_lender_guard_write(VnLender *l, uint64_t token, uint64_t offset, const void *data,
                           uint32_t count);
void vn_lender_guard_reset(VnLender *l, uint64_t token);
/*
 * lender-bars.c: the device's BARs exported for an ATTACH (token @token), asked without
 * waiting.  begin: the ATTACH waits (lender-queue.c) until @done, which answers it: told
 * whether the attachment it was made for is still there.  ask: region @i's BAR (@size bytes
 * of @fd from @offset) as one segment, or past @max_window (the borrower's largest window)
 * slices of the largest power of two that fits it; 0, or -1 with @error (too many slices).
 * asked: every region asked (then @done may run, at once or later); @answered: the ATTACH
 * was refused while asking, and @done is not told.  settle, in @done:
 * false with @error when a region of several slices lost one; a region whose one segment
 * was refused stays trapped.
 */
typedef struct VnLenderBars VnLenderBars;
typedef void (*VnLenderBarsDone)(VnLender *l, const VnLenderBars *bars, uint64_t token,
                                 bool current);
VnLenderBars *vn_lender_bars_begin(VnLender *l, uint64_t token, VnLenderBarsDone done);
int vn_lender_bars_ask(VnLenderBars *bars, VnLender *l, uint32_t i, int fd, uint64_t offset,
                       uint64_t size, const char *peer, uint64_t max_window, GError **error);
void vn_lender_bars_asked(VnLenderBars *bars, bool answered);
bool vn_lender_bars_settle(VnLender *l, const VnLenderBars *bars, GError **error);
/* lender.c: withdraw what an attach set up, without a command to the device (it is gone):
 * the borrower's windows onto it, our windows onto its memory, the relays; the connection
 * is closed.  The borrower stays (its lease does). */
void vn_lender_drop_device(VnLender *l, const char *why);
/*
 * lender-server.c.  start: find the server (a backend that can lose it), at once.
 * take: the connection an attach (request @token) uses, told to @then with the lender: the
 * spare, or a new one (dialled through the dialer without waiting: the request waits
 * meanwhile, lender-queue.c), or NULL with @error; not told when the lender went first.
 * attached / released: the attach's connection is in use / was closed or kept.  keep: the
 * fenced device's connection becomes the spare (false: close it), so a server that serves
 * one client for its lifetime (libvfio-user's samples) serves every lease (a stall of a
 * command on any connection is counted and looked at there too).  refuses: answer the holder's request with an error while
 * the device it had is gone (true: answered).  stop: at the lender's end.
 */
void vn_lender_server_start(VnLender *l);
typedef void (*VnLenderTakenFn)(VnLender *l, void *dev, const GError *error, void *opaque);
void vn_lender_server_take(VnLender *l, uint64_t token, VnLenderTakenFn then, void *opaque);
void vn_lender_server_attached(VnLender *l);
void vn_lender_server_released(VnLender *l);
bool vn_lender_server_keep(VnLender *l, void *dev);
bool vn_lender_server_refuses(VnLender *l, uint32_t type, uint64_t token);
void vn_lender_server_stop(VnLender *l);
/* lender.c: take the device back now. */
void vn_lender_fence(VnLender *l, const char *why);

#endif /* VN_LENDER_INT_H */
