/*
 * The lending protocol: what a borrower and a lender say to each other over
 * the fabric (vfio-ntb/fabric/fabric.h messages) about one lent device.
 *
 * It mirrors vfio-user, but the device is named, memory travels as fabric
 * segments instead of fds of the borrower's process, and interrupts either
 * travel as fabric interrupt routes (fd mode, on fabrics with
 * VN_FABRIC_CAP_DIRECT_ROUTES: the device signals the VM's irqfd with no
 * hop) or are relayed by doorbells (relay mode: one hop through the lender).
 * No message carries a file descriptor.
 *
 *   request       JSON                                      binary
 *   ATTACH        {"device","irq_mode":"fd"|"relay",        -> reply: device description
 *                  "max_window"}
 *   DETACH        {}
 *   REGION_RW     {"region","offset","count","write"}       write data; reply: read data
 *   DMA_MAP       {"iova","size","segment","offset","prot", (segment: the borrower's export,
 *                  "peer"}                                  or "peer"'s when given: a P2P
 *                                                           target, docs/p2p.md)
 *   DMA_UNMAP     {"iova","size","all"}
 *   SET_IRQS      {"flags","index","start","count","relay",  DATA_BOOL: a byte per vector;
 *                  "doorbell"}
 *                                                           DATA_EVENTFD (fd mode): a route
 *                                                           id (u64 LE) per vector, at most
 *                                                           VN_MAX_MSG_FDS, or none
 *   RESET         {}
 * Relay mode: the borrower takes doorbell bits of its host for the vectors of
 * a relayed SET_IRQS (vectors below VN_PROTO_RELAY_VECTORS of INTx, MSI or
 * MSI-X), and the lender rings bit "doorbell" + (v - "start") for vector v.
 *
 * Every request's JSON also names the device ("device"), so a lender node
 * that lends several devices to one borrower routes each message.
 * Every field is checked on decode against the vfio-user limits (wire.h);
 * a message that fails gets an error reply and changes nothing.
 */
#ifndef VN_PROTO_H
#define VN_PROTO_H

#include "common/name.h"
#include "vfio-user/server.h"
#include "common/trace.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum VnProtoType {
    VN_PROTO_INVALID = 0,
    VN_PROTO_ATTACH = 1,
    VN_PROTO_DETACH,
    VN_PROTO_REGION_RW,
    VN_PROTO_DMA_MAP,
    VN_PROTO_DMA_UNMAP,
    VN_PROTO_SET_IRQS,
    VN_PROTO_RESET,
    VN_PROTO_LAST
} VnProtoType;

const char *vn_proto_type_to_string(uint32_t type);

typedef enum VnIrqMode { VN_IRQ_MODE_FD = 0, VN_IRQ_MODE_RELAY, VN_IRQ_MODE_LAST } VnIrqMode;

const char *vn_irq_mode_to_string(VnIrqMode mode);
/* Returns false for an unknown name. */
bool vn_irq_mode_from_string(const char *s, VnIrqMode *mode);

/* Relay mode carries vectors 0..31 of an index, each as a doorbell bit. */
#define VN_PROTO_RELAY_VECTORS 32u

/* A region larger than the borrower's largest window (a GPU's memory BAR)
 * is exported as this many segments at most, each one window. */
#define VN_PROTO_MAX_REGION_SEGMENTS 16u

/* One region as the lender describes it.  A mappable region is
 * @nr_segments segments, consecutive slices of one fd of the lender's
 * (JSON: "segment" the first, or 0; "segments" all of them when more than
 * one); every slice but the last is as large as the first. */
typedef struct VnProtoRegion {
    uint64_t size;
    uint32_t flags;       /* VFIO_REGION_INFO_FLAG_READ|WRITE|MMAP */
    uint32_t nr_segments; /* 0: trapped */
    uint64_t segments[VN_PROTO_MAX_REGION_SEGMENTS];
    uint32_t nr_sparse;
    VnSparseArea sparse[VN_MAX_SPARSE_AREAS];
} VnProtoRegion;

typedef struct VnProtoDevice {
    uint32_t flags;       /* VFIO_DEVICE_FLAGS_* */
    uint32_t num_regions; /* <= VN_MAX_REGIONS */
    VnProtoRegion regions[VN_MAX_REGIONS];
    uint32_t num_irqs; /* <= VN_MAX_IRQ_INDEXES */
    uint32_t irq_count[VN_MAX_IRQ_INDEXES];
    uint32_t irq_flags[VN_MAX_IRQ_INDEXES];
} VnProtoDevice;

char *vn_proto_device_to_json(const VnProtoDevice *d);
bool vn_proto_device_from_json(const char *json, VnProtoDevice *d, GError **error);

typedef struct VnProtoAttach {
    char device[VN_MAX_DEVICE_NAME + 1];
    VnIrqMode irq_mode;
    /* The borrower's largest window (its fabric's max-window-size), so the
     * lender cuts larger regions to fit; 0 (or absent): no limit. */
    uint64_t max_window;
    /* The holder's worker died and another took over its QEMU: the attachment goes on as
     * it is (no fence), and the answer describes it again. */
    bool resume;
} VnProtoAttach;

typedef struct VnProtoRegionRw {
    uint32_t region;
    uint64_t offset;
    uint32_t count; /* <= VN_MAX_DATA_XFER */
    bool write;
} VnProtoRegionRw;

typedef struct VnProtoDmaMap {
    uint64_t iova;
    uint64_t size;
    uint64_t segment;
    uint64_t offset; /* into the segment */
    uint32_t prot;
    /* The node that exported the segment: "" for the borrower (its guest memory); another
     * node for a peer-to-peer target, another device's BAR shared with us (docs/p2p.md). */
    char peer[VN_MAX_NODE_NAME + 1];
} VnProtoDmaMap;

typedef struct VnProtoDmaUnmap {
    uint64_t iova;
    uint64_t size;
    bool all;
} VnProtoDmaUnmap;

typedef struct VnProtoSetIrqs {
    uint32_t flags;
    uint32_t index;
    uint32_t start;
    uint32_t count;
    bool relay;        /* DATA_EVENTFD without routes: lender makes its own */
    uint32_t doorbell; /* relay: the borrower's bit for vector @start */
} VnProtoSetIrqs;

/* A request naming only the device (DETACH, RESET). */
char *vn_proto_device_only_to_json(const char *device);
/* The "device" member of any request, validated, into @out. */
bool vn_proto_device_name(const char *json, char out[VN_MAX_DEVICE_NAME + 1], GError **error);

/*
 * Correlation ids (common/trace.h): a borrower tracing its requests adds one to each
 * ("corr": "node:number"), so that the lender's trace of the request carries it too.
 * vn_proto_with_corr: @json (an object of ours) with the member added; g_free it.
 * vn_proto_device_and_corr: vn_proto_device_name(), and the request's id in @corr ("-" when
 * it has none, or one that is not [A-Za-z0-9._:-], at most VN_TRACE_MAX_CORR - 1 long: a
 * peer's).
 */
char *vn_proto_with_corr(const char *json, const char *corr);
bool vn_proto_device_and_corr(const char *json, char device[VN_MAX_DEVICE_NAME + 1],
                              char corr[VN_TRACE_MAX_CORR], GError **error);

char *vn_proto_attach_to_json(const VnProtoAttach *a);
bool vn_proto_attach_from_json(const char *json, VnProtoAttach *a, GError **error);
char *vn_proto_region_rw_to_json(const char *device, const VnProtoRegionRw *r);
bool vn_proto_region_rw_from_json(const char *json, VnProtoRegionRw *r, GError **error);
char *vn_proto_dma_map_to_json(const char *device, const VnProtoDmaMap *m);
bool vn_proto_dma_map_from_json(const char *json, VnProtoDmaMap *m, GError **error);
char *vn_proto_dma_unmap_to_json(const char *device, const VnProtoDmaUnmap *u);
bool vn_proto_dma_unmap_from_json(const char *json, VnProtoDmaUnmap *u, GError **error);
char *vn_proto_set_irqs_to_json(const char *device, const VnProtoSetIrqs *s);
bool vn_proto_set_irqs_from_json(const char *json, VnProtoSetIrqs *s, GError **error);

#endif /* VN_PROTO_H */
