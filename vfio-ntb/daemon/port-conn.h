/*
 * A worker's port's insides (see port.h) and its connection to the worker (port-conn.c):
 * what port.c (relaying frames, the peer's requests, life) and port-ops.c (what the worker
 * maps, exports, keeps and rings) share.  Not for other files.
 */
#ifndef VN_PORT_CONN_H
#define VN_PORT_CONN_H

#include "keep.h"
#include "fabric/fabric.h"
#include "fabric/host.h"
#include "fabric/record.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Requests one worker may have relayed and unanswered (what its fabric holds itself to). */
#define VN_PORT_MAX_INFLIGHT VN_HOST_MAX_RELAYED
/* Ids the daemon withdrew that the worker may still unexport (vn_port_withdraw): a lender
 * worker exports a few per region, VN_MAX_REGIONS regions. */
#define VN_PORT_MAX_WITHDRAWN 256u
/* Windows, segments and routes one worker may hold through its port. */
#define VN_PORT_MAX_WINDOWS 16u
#define VN_PORT_MAX_EXPORTS 256u
/* A worker's secret (port.h: vn_port_pair): what a reconnecting worker says in its HELLO. */
#define VN_PORT_SECRET_LEN VN_HOST_SECRET_LEN

typedef struct VnPort VnPort;

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

/* What may wait for a worker to read it: 16 of the largest records.  A worker that would
 * have more waiting, or reads nothing for VN_PORT_STALL_MS (port.h), loses its connection:
 * the daemon's loop never waits for it. */
#define VN_PORT_MAX_QUEUED (16u * VN_HOST_MAX_RECORD)

/* A window the worker held before our start, onto @peer's segment @id (vn_fabric_adopt). */
typedef struct VnPortHeld {
    uint64_t id;
    char peer[VN_MAX_NODE_NAME + 1];
} VnPortHeld;

struct VnPort {
    VnFabric *fab;
    char *path;
    char *peer; /* the one node the worker speaks with, or NULL */
    char *device;
    int listen_fd;
    GSource *listen_src;
    int fd; /* the worker's connection, or -1 */
    /* Who may connect (port.h: vn_port_pair): only the process @worker, and only with
     * @secret in its first record, a HELLO, before which the connection is not @authed. */
    GPid worker;
    uint8_t secret[VN_PORT_SECRET_LEN];
    bool has_secret;
    bool authed;
    GSource *src;
    VnRecordReader rx;
    VnRecordOut *to_worker; /* what goes to the worker, without waiting for it */
    GPtrArray *windows;     /* VnFabricWindow *, mapped for the worker */
    GPtrArray *maps;        /* VnPortMap *, maps and route opens under way */
    GArray *segments;       /* uint64_t ids exported for it */
    GArray *routes;
    GArray *withdrawn;        /* uint64_t ids of those the daemon withdrew (vn_port_withdraw) */
    GArray *adopted_windows;  /* VnPortHeld: its windows from before our start (a claim) */
    GArray *p2p_allowed;      /* VnPortHeld: other nodes' segments it may map (port.h) */
    uint64_t doorbells;       /* bit i: the worker's */
    GPtrArray *relays;        /* VnPortRelay *, in flight */
    VnFabricConnect *connect; /* the worker's CONNECT, answered once its peer's link is up */
    uint64_t connect_seq;     /* that CONNECT's */
    GPtrArray *ins;           /* VnPortIn *, the peer's requests at the worker */
    uint64_t last_in;
    GByteArray *out;
    uint64_t refused;
    GMainContext *ctx;
    bool inbound; /* a lender's worker: it answers the peer's requests */
    /* port.h's callbacks (VnPortDeviceRequestFn, ...) */
    void (*device_request)(void *opaque);
    void *device_request_opaque;
    void (*fenced)(void *opaque);
    void *fenced_opaque;
    void (*device_server)(void *opaque, bool up, uint32_t gen);
    void *device_server_opaque;
    void (*gone)(void *opaque);
    void *gone_opaque;
    void (*p2p)(void *opaque, uint32_t op, uint64_t iova, uint64_t size, const VnHostBar *bars,
                unsigned n);
    void *p2p_opaque;
    VnKeep *keep;    /* a borrower's worker's fds and state (keep.h); NULL for a lender's */
    char *dial_path; /* a lender's device server's socket (vn_port_set_dial), its PCI
                      * function (vn_port_set_dial_vfio), or NULL */
    bool dial_vfio;  /* dial_path is a PCI function, whose IOMMU group a dial opens */
    gint64 dial_at;  /* when it last dialled it for the worker (monotonic) */
    int dial_errno;  /* how that dial failed; 0: it connected */
    int dialled;     /* our copy of the last connection handed over, or -1: the next dial
                      * shuts it down, so a worker holds one live connection at most */
};

/* The worker's connection goes (it reconnects, or it is gone). */
void vn_port_conn_close(VnPort *p);
/* Whether a reconnecting worker's HELLO (@data, @len) is its secret; in constant time. */
bool vn_port_secret_ok(VnPort *p, const uint8_t *data, size_t len);
/* A record to the worker; one it cannot take closes its connection. */
void vn_port_to_worker(VnPort *p, uint32_t op, uint64_t seq, int status, const char *peer,
                       uint64_t arg, uint64_t arg2, const void *data, size_t len, int fd);
/* What the worker sent that is refused: counted, logged. */
void vn_port_refuse(VnPort *p, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* The REPLY to the worker's op @h. */
void vn_port_reply(VnPort *p, const VnHostHdr *h, int err, uint64_t arg, uint64_t arg2, int fd);

/* The peer's requests the worker has not answered: they fail now (with @err, @why). */
void vn_port_ins_fail(VnPort *p, int err, const char *why);

#endif /* VN_PORT_CONN_H */
