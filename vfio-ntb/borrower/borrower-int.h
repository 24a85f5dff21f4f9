/*
 * Borrower internals shared by borrower.c and mediate.c.
 */
#ifndef VN_BORROWER_INT_H
#define VN_BORROWER_INT_H

#include "borrower.h"
#include "vfio-user/server.h"
#include "fabric/host.h"

#include <json-glib/json-glib.h>

/* Where the device keeps its MSI-X table and PBA (from its capability). */
typedef struct VnMsixLayout {
    bool present;
    uint32_t vectors;
    uint32_t table_bar;
    uint64_t table_offset;
    uint32_t pba_bar;
    uint64_t pba_offset;
} VnMsixLayout;

/* Config-space mediation state (mediate.c). */
typedef struct VnMediate {
    /* What the guest wrote to the BAR registers and Command (the device's own BARs are the
     * lender's: kept here to know where the guest put ours, p2p.c), and each BAR's type bits
     * (the device's, read once). */
    uint32_t bar[6];
    uint8_t bar_type[6];
    uint16_t command;
    uint8_t exp_cap;  /* PCI Express capability offset, 0 if none */
    uint8_t int_line; /* virtualized Interrupt Line */
    VnMsixLayout msix;
    /* The expansion ROM BAR, kept here: its size (the lender's ROM region,
     * a power of two; 0: none) and what was written to it. */
    uint64_t rom_size;
    uint32_t rom_bar;
} VnMediate;

/* A guest-memory fd exported to the lender: one per memory backend. */
typedef struct VnBorrowerSegment {
    dev_t dev;
    ino_t ino;
    uint64_t id;
    unsigned refs; /* forwarded DMA mappings into it */
} VnBorrowerSegment;

/* A DMA mapping forwarded to the lender. */
typedef struct VnBorrowerMapping {
    uint64_t iova;
    uint64_t size;
    uint64_t offset; /* in its segment (0 after a takeover: for messages only) */
    uint32_t prot;
    bool confirmed; /* the lender answered its map */
    /* QEMU unmapped it, the lender not yet (it lingers: dma.c); since when (monotonic us) */
    bool lingering;
    gint64 unmapped_at;
    GList link; /* in VnBorrower.lingering, oldest first */
    VnBorrowerSegment *seg;
    /* Its rows in the kept state (VnBorrower.kept_mappings, .kept_lingering; NULL: none),
     * so that a DMA message changes the state by a row, not by writing it all again. */
    JsonNode *kept_row, *kept_linger;
} VnBorrowerMapping;

/* The indexes relay mode carries: INTx, MSI, MSI-X. */
#define VN_BORROWER_RELAY_INDEXES (VFIO_PCI_MSIX_IRQ_INDEX + 1)

/*
 * A forwarded BAR write is posted, as PCIe posts MMIO writes: QEMU is answered at once and
 * the write goes to the lender as a request nobody waits for.  Requests on the link arrive
 * in order, so the next forwarded read (or anything else the borrower asks) reaches the
 * device after it.  At most VN_BORROWER_MAX_POSTED are in flight; the next waits for its
 * answer (and so for all before it).  A write that fails is counted and logged, as a
 * device's failed posted write is not reported to the CPU that made it.  Shared with the
 * answers, which may come after the borrower is gone.
 */
#define VN_BORROWER_MAX_POSTED 32
/* A posted write of at most this many bytes (a register's) waits in the borrower until QEMU
 * has its answer; a larger one goes at once. */
#define VN_BORROWER_DEFER_MAX 8
typedef struct VnBorrowerPosted {
    gint refs; /* the borrower's, and one per write in flight */
    guint in_flight;
    uint64_t writes;   /* posted */
    uint64_t failures; /* answered with an error */
    char device[VN_MAX_DEVICE_NAME + VN_MAX_NODE_NAME + 2];
} VnBorrowerPosted;

struct VnBorrower {
    VnFabric *fab;     /* borrowed */
    uint64_t corr_seq; /* the last correlation id's number (traced requests) */
    char *lender;
    char *device;
    VnIrqMode mode;
    bool attached;
    VnDeviceInfo info;
    /* Mapped BARs (bars.c): the windows of each region, in order. */
    VnFabricWindow *windows[VN_MAX_REGIONS][VN_PROTO_MAX_REGION_SEGMENTS];
    uint32_t nr_windows[VN_MAX_REGIONS];
    /* A BAR the device server sized other than a power of two: its own size (QEMU is told
     * the next power of two; bars.c), 0 for the others. */
    uint64_t bar_size[VN_MAX_REGIONS];
    /* A region's windows joined into one fd for QEMU (ours; -1: one window). */
    int joined_fd[VN_MAX_REGIONS];
    uint64_t joined_offset[VN_MAX_REGIONS];
    VnServer *server;
    /* relay mode: the doorbell bit of each relayed vector of INTx, MSI and
     * MSI-X (bit + 1; 0: none), and what each of our bits stands for. */
    uint8_t relay_bit[VN_BORROWER_RELAY_INDEXES][VN_PROTO_RELAY_VECTORS];
    struct {
        bool used;
        uint8_t index;
        uint8_t vector;
    } doorbell_of[VN_FABRIC_MAX_DOORBELLS];
    /* fd mode: the interrupt route of each vector given to the lender (0:
     * none), per index, allocated when first used (irq_count entries). */
    uint64_t *routes[VN_MAX_IRQ_INDEXES];
    GList *segments;                /* VnBorrowerSegment: guest memory exported */
    GList *mappings;                /* VnBorrowerMapping: DMA forwarded (confirmed or on its way) */
    GQueue lingering;               /* of those, the ones QEMU unmapped, oldest first (dma.c) */
    GSource *linger_src;            /* unmaps the oldest when its time is up */
    unsigned linger_ms, linger_max; /* vn_borrower_set_dma_linger() */
    unsigned unmaps_posted;         /* unmaps of lingering mappings on their way */
    GList *asked;                   /* requests QEMU's replies wait for (requests.c) */
    GList *pending;                 /* VnBorrowerPending: asked of the fabric (requests.c) */
    VnMediate med;
    bool client_leaving; /* QEMU went: its device is quiesced without waiting */
    VnBorrowerStats stats;
    VnBorrowerPosted *posted; /* forwarded writes not answered yet (borrower.c) */
    /* Posted writes not sent yet: QEMU is answered first, they go right after (flush_src),
     * and before anything else the borrower asks (requests.c). */
    GQueue deferred;
    GSource *flush_src;
    bool flushing;
    GMainContext *ctx; /* the borrower's (NULL: the default) */
    GBytes *kept;      /* the state the daemon keeps for our successor, as last sent */
    /* Peer-to-peer targets (p2p.c): what QEMU mapped without memory (offers), the targets
     * mapped at the lender, and our BARs where the guest put them, as last said. */
    GArray *p2p_offers, *p2p_targets;
    VnHostBar p2p_placed[VN_HOST_MAX_BARS];
    unsigned p2p_nplaced;
    /* Its "mappings" and "lingering" rows, kept as they change (takeover.c; NULL: none). */
    JsonArray *kept_mappings, *kept_lingering;
};

/* A lending request to our lender, answered later: @done as for vn_fabric_request() (called
 * once when this returned 0).  In order with every other request of ours: the lender takes
 * them so.  On an error the reply (when one came) says why. */
int vn_borrower_call_async(VnBorrower *b, uint32_t type, const char *json, const void *data,
                           size_t len, VnFabricReplyFn done, void *opaque);

/*
 * A request whose answer is QEMU's reply to the command being handled (requests.c):
 * vn_server_later(), the request sent, and when the lender answers, @done (NULL: none)
 * says what QEMU gets (0 or -errno; it may look at the reply, NULL when none came; or
 * VN_BORROWER_ANSWERED: it answered QEMU itself), or for a REGION_READ (@read_count
 * bytes) the lender's bytes go.  @destroy (NULL: none)
 * frees @opaque after that, or when the borrower goes first.  With no command being
 * handled (QEMU's client going) there is no reply to give: @done alone is told, and what
 * is returned is whether it was sent (0 or -errno); otherwise 0 (QEMU gets an error in
 * its reply when sending fails).
 */
typedef int (*VnBorrowerAnswerFn)(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque);
/* What a VnBorrowerAnswerFn returns when it answered QEMU itself (vn_server_complete*()). */
#define VN_BORROWER_ANSWERED 1
int vn_borrower_ask_later(VnBorrower *b, uint32_t type, const char *json, const void *data,
                          size_t len, uint32_t read_count, VnBorrowerAnswerFn done, void *opaque,
                          GDestroyNotify destroy);
/* @opaque is gone: requests on their way give their @done NULL instead. */
void vn_borrower_asks_forget(VnBorrower *b, const void *opaque);
/* The borrower goes: answers still on their way find nobody. */
void vn_borrower_asks_orphan(VnBorrower *b);
/* vn_borrower_ask_later() for QEMU's reply @reply_id, owed since a command handled before. */
int vn_borrower_ask_answering(VnBorrower *b, uint64_t reply_id, uint32_t type, const char *json,
                              const void *data, size_t len, VnBorrowerAnswerFn done, void *opaque,
                              GDestroyNotify destroy);
/*
 * Something the borrower asked of its fabric (a segment's or a route's export, doorbell
 * bits, windows joined: its daemon's to give, for a worker), answered later.  begin: it is
 * listed (its @fab set).  end, in the answer: unlisted, and the borrower, or NULL when it
 * went meanwhile (vn_borrower_pending_orphan, at its end): then the answer undoes what came
 * alone, through @fab.
 */
typedef struct VnBorrowerPending {
    VnBorrower *b;
    VnFabric *fab;
} VnBorrowerPending;
void vn_borrower_pending_begin(VnBorrower *b, VnBorrowerPending *p);
VnBorrower *vn_borrower_pending_end(VnBorrowerPending *p);
void vn_borrower_pending_orphan(VnBorrower *b);
/* A request nobody's reply waits for: @done (its return ignored) is told the answer, or
 * the error when it could not be sent, which is returned too. */
int vn_borrower_ask_posted(VnBorrower *b, uint32_t type, const char *json, VnBorrowerAnswerFn done,
                           void *opaque, GDestroyNotify destroy);
/* The borrower's reference to its posted-write counters (answers on their way keep theirs). */
void vn_borrower_posted_release(VnBorrowerPosted *p);

/* QEMU's DMA_MAP and DMA_UNMAP, answered when the lender has, or here when a mapping
 * lingers (dma.c); everything forgotten when the borrower goes (the segments unexported). */
int vn_borrower_dma_mapped(VnBorrower *b, const VnDmaMapping *m);
void vn_borrower_dma_unmapping(VnBorrower *b, uint64_t iova, uint64_t size, bool all);
void vn_borrower_dma_forget(VnBorrower *b);
/* Taken over from a worker that died: the mappings it restored lingering (QEMU had
 * unmapped them) linger from now on. */
void vn_borrower_dma_taken_over(VnBorrower *b);
/* The lender is back: the mappings that lingered while it was away go now (an unmap that
 * cannot reach it would leave the device dead: they wait). */
void vn_borrower_dma_lender_back(VnBorrower *b);

/* A forwarded BAR write, posted (VnBorrowerPosted above); the deferred ones sent now, in
 * order. */
void vn_borrower_posted_flush(VnBorrower *b);
/* A forwarded BAR write, posted (VnBorrowerPosted above). */
int vn_borrower_region_write_posted(VnBorrower *b, uint32_t index, uint64_t offset, const void *buf,
                                    uint32_t count);

/* borrower.c: a borrower not attached yet (start.c attaches it); what QEMU is told of the
 * device @d besides its regions; the ops its server calls. */
VnBorrower *vn_borrower_alloc(VnFabric *fab, const char *lender, const char *device,
                              VnIrqMode mode);
void vn_borrower_describe(VnBorrower *b, const VnProtoDevice *d);
extern const VnDeviceOps vn_borrower_ops;

/* BARs (bars.c).  Map the windows of the regions @d describes into b->info.regions, all
 * asked at once; @done is told once every window answered (maybe before this returns), with
 * NULL or why not (taken: a BAR larger than the window budget names the budget).  Unmap
 * them all. */
typedef void (*VnBorrowerBarsFn)(VnBorrower *b, GError *error, void *opaque);
void vn_borrower_bars_map(VnBorrower *b, const VnProtoDevice *d, VnBorrowerBarsFn done,
                          void *opaque);
void vn_borrower_bars_unmap(VnBorrower *b);
/* QEMU emulates the MSI-X table and PBA: take them out of the mapped areas. */
void vn_borrower_bars_carve_msix(VnBorrower *b);
/* Where a trapped access of @count bytes at @offset of region @index lies
 * in our own mapping of the BAR's memory, or NULL (no window there, a
 * device's window, or an access across two windows: the lender serves it). */
uint8_t *vn_borrower_bar_memory(VnBorrower *b, uint32_t index, uint64_t offset, uint32_t count);

/* Takeover (takeover.c).  What the daemon keeps for the worker after us: the state
 * (sent when it changed, or always with @force), the sockets and the eventfds the server
 * holds of [start, start + count) of @index (count 0: all of them). */
void vn_borrower_keep_state(VnBorrower *b, bool force);
void vn_borrower_keep_sockets(VnBorrower *b);
void vn_borrower_keep_irqs(VnBorrower *b, uint32_t index, uint32_t start, uint32_t count);
/* All of it again: for a daemon that restarted (fabric/host.h's greeted callback); and each
 * relayed vector signalled once, for the doorbells lost while it was away. */
void vn_borrower_kept_again(void *opaque);
/* QEMU went: its connection and eventfds are nobody's to keep. */
void vn_borrower_keep_client_gone(VnBorrower *b);
/* The state's rows of @m: listed as a mapping (and as lingering when it does), unlisted,
 * lingering or not any more; cleared when every mapping goes.  The state is sent at the
 * next vn_borrower_keep_state(). */
void vn_borrower_state_listed(VnBorrower *b, VnBorrowerMapping *m);
void vn_borrower_state_unlisted(VnBorrower *b, VnBorrowerMapping *m);
void vn_borrower_state_lingers(VnBorrower *b, VnBorrowerMapping *m, bool lingers);
void vn_borrower_state_clear(VnBorrower *b);
/* What the daemon hands the worker that takes over: the dead one's state and QEMU's caps
 * in it, its sockets (-1: none), and its other fds (key -> fd, closed when freed). */
typedef struct VnBorrowerHandoff {
    JsonObject *state;
    VnWireCaps caps;
    int listen_fd, client_fd;
    GHashTable *fds;
} VnBorrowerHandoff;
/* Read from @fd (taken); false with @error naming what is wrong (@h is to be cleared
 * either way). */
bool vn_borrower_handoff_read(int fd, const char *device, VnBorrowerHandoff *h, GError **error);
void vn_borrower_handoff_clear(VnBorrowerHandoff *h);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VnBorrowerHandoff, vn_borrower_handoff_clear)
/* Put back what @state (the dead worker's) and @fds (key -> fd, taken) say into @b, whose
 * server took over the sockets. */
bool vn_borrower_restore(VnBorrower *b, JsonObject *state, GHashTable *fds, GError **error);

/* Peer-to-peer targets (p2p.c; docs/p2p.md).  start: heard from the daemon; stop: no more.
 * place: our BARs where the guest put them, said to the daemon when they changed (@again:
 * anyway, for a daemon that restarted, with the offers).  offer: QEMU mapped [@iova, +@size)
 * without memory.  unmapping: QEMU's DMA_UNMAP; whether a target was inside (then the lender
 * must unmap the range). */
#define VN_BORROWER_MAX_OFFERS 64u
void vn_borrower_p2p_start(VnBorrower *b);
void vn_borrower_p2p_stop(VnBorrower *b);
void vn_borrower_p2p_place(VnBorrower *b, bool again);
void vn_borrower_p2p_again(VnBorrower *b);
void vn_borrower_p2p_offer(VnBorrower *b, uint64_t iova, uint64_t size);
bool vn_borrower_p2p_unmapping(VnBorrower *b, uint64_t iova, uint64_t size, bool all);

/* The device's capabilities, from its config space @cfg (PCI_CFG_SPACE_SIZE bytes, read
 * after ATTACH). */
void vn_mediate_init(VnBorrower *b, const uint8_t *cfg);
/* Config-space accesses from QEMU, in range of the config region. */
int vn_mediate_read(VnBorrower *b, uint64_t offset, void *buf, uint32_t count);
int vn_mediate_write(VnBorrower *b, uint64_t offset, const void *buf, uint32_t count);

#endif /* VN_BORROWER_INT_H */
