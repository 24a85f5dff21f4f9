/*
 * A worker's port's insides (see port.h), shared by port.c (the connection, relaying frames,
 * the peer's requests, life) and port-ops.c (what the worker maps, exports, keeps and rings,
 * and the daemon's fence).  Not for other files.
 */
#ifndef VN_PORT_INT_H
#define VN_PORT_INT_H

#include "port.h"

#include "keep.h"
#include "fabric/host.h"
#include "fabric/record.h"

/* A request relayed for the worker, until its answer comes. */
typedef struct VnPortRelay {
    VnPort *port; /* NULL once the port is gone */
    uint64_t id;  /* the worker's frame id */
    uint32_t type;
} VnPortRelay;

/* A request of the peer's, passed to the worker, until it answers. */
typedef struct VnPortIn {
    uint64_t id;       /* the frame id the worker sees */
    uint64_t token;    /* ours, for vn_fabric_reply() */
    GByteArray *frame; /* not sent yet (the worker is away), else NULL */
} VnPortIn;

struct VnPort {
    VnFabric *fab;
    char *path;
    char *peer; /* the one node the worker speaks with, or NULL */
    char *device;
    int listen_fd;
    GSource *listen_src;
    int fd; /* the worker's connection, or -1 */
    GSource *src;
    VnRecordReader rx;
    GPtrArray *windows; /* VnFabricWindow *, mapped for the worker */
    GPtrArray *maps;    /* VnPortMap *, maps under way */
    GArray *segments;   /* uint64_t ids exported for it */
    GArray *routes;
    GArray *withdrawn;  /* uint64_t ids of those the daemon withdrew (vn_port_withdraw) */
    uint64_t doorbells; /* bit i: the worker's */
    GPtrArray *relays;  /* VnPortRelay *, in flight */
    GPtrArray *ins;     /* VnPortIn *, the peer's requests at the worker */
    uint64_t last_in;
    GByteArray *out;
    uint64_t refused;
    GMainContext *ctx;
    bool inbound; /* a lender's worker: it answers the peer's requests */
    VnPortDeviceRequestFn device_request;
    void *device_request_opaque;
    VnPortFencedFn fenced;
    void *fenced_opaque;
    VnPortDeviceServerFn device_server;
    void *device_server_opaque;
    VnPortGoneFn gone;
    void *gone_opaque;
    VnKeep *keep; /* a borrower's worker's fds and state (keep.h); NULL for a lender's */
};

/* What the worker sent that is refused: counted, logged. */
void vn_port_refuse(VnPort *p, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* The REPLY to the worker's op @h. */
void vn_port_reply(VnPort *p, const VnHostHdr *h, int err, uint64_t arg, uint64_t arg2, int fd);

/* The peer's requests the worker has not answered: they fail now (with @err, @why). */
void vn_port_ins_fail(VnPort *p, int err, const char *why);

/* The worker's ops (port-ops.c), checked as any peer's input. */
bool vn_port_array_take(GArray *a, uint64_t id);
void vn_port_op_withhold(VnPort *p, const VnHostHdr *h);
void vn_port_op_export(VnPort *p, const VnHostHdr *h, int fd);
void vn_port_op_map(VnPort *p, const VnHostHdr *h);
void vn_port_op_unmap(VnPort *p, const VnHostHdr *h);
void vn_port_op_join(VnPort *p, const VnHostHdr *h, const uint8_t *ids, size_t len);
void vn_port_op_doorbells(VnPort *p, const VnHostHdr *h);
void vn_port_op_open_route(VnPort *p, const VnHostHdr *h);
void vn_port_op_keep(VnPort *p, const VnHostHdr *h, int *fd, const uint8_t *data, size_t len);

#endif /* VN_PORT_INT_H */
