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

/* A fabric window onto one of the borrower's segments, shared by every DMA
 * mapping into that segment. */
typedef struct VnLenderWindow {
    VnFabricWindow *w;
    uint32_t refs; /* mappings using it */
} VnLenderWindow;

/* A DMA mapping the device holds for the borrower. */
typedef struct VnLenderMap {
    uint64_t iova;
    uint64_t size;
    uint64_t segment;
} VnLenderMap;

struct VnLender {
    VnFabric *fab;
    const char *corr;  /* the correlation id of the request being handled, or NULL */
    GMainContext *ctx; /* the fabric's: relay watches go there */
    char *name;
    const VnBackendOps *ops; /* how the device is reached (backend.h) */
    char *where;             /* what the backend opens: a socket path, ... */

    /* While lent (borrower != NULL). */
    char *borrower;
    VnIrqMode irq_mode;
    void *device;       /* the backend's, while attached */
    VnProtoDevice dev;  /* as described to the borrower */
    GPtrArray *windows; /* VnLenderWindow, owned */
    GArray *maps;       /* VnLenderMap */
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

    VnLenderStats stats;
    /* The device's last stall and its outcome ("" if none), set by the
     * backend's stall callback; whether it answers now is ops->stalled. */
    char last_stall[VN_LENDER_STALL_TEXT];
};

/* lender.c: answer @token with @err (either sign) and a message that
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
 * before_write: withhold the paths onto the BARs when a config write of @count bytes at
 * @offset may stop the device decoding its memory; withhold: do so now (before a reset).
 * Both 0 once withheld (or nothing to do), else -errno: then the write must not be made.
 * settle: after each config write or reset, give them back if the device decodes its
 * memory again.
 */
void vn_lender_guard_probe(VnLender *l);
/* @count bytes of the device's config space at @offset: 0, or -errno (a short read: -EIO). */
int vn_lender_cfg_read(VnLender *l, uint32_t offset, void *buf, uint32_t count);
int vn_lender_guard_before_write(VnLender *l, uint64_t offset, const void *data, uint32_t count);
int vn_lender_guard_withhold(VnLender *l, const char *why);
void vn_lender_guard_settle(VnLender *l);
/* lender.c: take the device back now. */
void vn_lender_fence(VnLender *l, const char *why);

#endif /* VN_LENDER_INT_H */
