/*
 * The `shm` fabric backend: every node is a process (or a thread) on one
 * machine.  A fabric directory holds each node's UNIX socket, DIR/NODE.sock;
 * segments are memfds and mapping a window passes the segment's fd; an
 * interrupt route is an eventfd passed the same way (capability
 * VN_FABRIC_CAP_DIRECT_ROUTES: the device signals the VM's irqfd, which is
 * what an MSI write through a window into the borrower's host amounts to).
 * Those fds pass between the two backends only: fabric messages carry bytes.
 *
 * Parameters: "dir" (required; created 0700 when missing; refused when not
 * ours or writable by group or others) and the window limits as decimal
 * strings: "max-windows" (1..VN_SHM_MAX_WINDOWS), "max-window-size",
 * "window-align", "xlat-granularity" (powers of two from a page to
 * VN_SHM_MAX_WINDOW_SIZE, the last two at most max-window-size), and
 * "doorbells" (the node's doorbell bits, 1..VN_FABRIC_MAX_DOORBELLS, default
 * 32), "max-segments" (its inbound windows: segments exported at once,
 * 1..VN_FABRIC_MAX_SEGMENTS, default 64), and "crossing-delay-ns" (0..VN_SHM_MAX_CROSSING_DELAY_NS, default 0): a model
 * of an NTB crossing for benches.  The sending node busy-waits that long
 * before each record it sends -- every fabric message (request, reply,
 * event, segment map) and every doorbell -- so a request-reply costs two
 * crossings, as a posted write and its answer over a real NTB would (Device
 * Lending measured 350-370 ns per crossing).  Memory through windows is not
 * delayed: mapped loads and stores do not go through the backend.
 *
 * Wire: on a node socket every record is a u32 little-endian length, then
 * that many bytes.  A connecting node's first record is a VnShmHello naming
 * it; every later record is one fabric frame (fabric/frame.h), with no fds:
 * a record that brings one drops the link.  Or the first record is a
 * VnShmFetch: the connection carries no link but asks for one segment's or
 * route's fd, and gets one VnShmFetchReply record with the fd (SCM_RIGHTS,
 * on its first byte) when the answer is yes; then it is closed.  A fetch is
 * answered only to a node whose link is up and to which the segment or
 * route was exported.
 *
 * One connection carries a link.  If two nodes connect to each other at
 * once, both ends keep the connection opened by the node whose name sorts
 * first; the other is half-closed by the node that opened it once it has
 * learnt so, and read to its EOF by both (no frame is lost, no link flaps).
 * A second connection from a peer whose first is still alive is refused:
 * the established one stays (a restarted peer's old connection has reached
 * EOF by then; an impostor gets nothing).  Node identity is not
 * authenticated beyond the directory's permissions and SO_PEERCRED (same
 * user or root).
 *
 * Threads: all of it runs in the fabric's GMainContext.
 */
#ifndef VN_SHM_H
#define VN_SHM_H

#include "fabric.h"

#include <stdint.h>

/* The backend's table; vn_fabric_open() registers it as "shm". */
extern const VnFabricOps vn_shm_ops;

#define VN_SHM_HELLO_MAGIC 0x4c484e56u /* "VNHL" on the wire */
#define VN_SHM_FETCH_MAGIC 0x54464e56u /* "VNFT" */
#define VN_SHM_HELLO_VERSION 2u

typedef struct VnShmHello {
    uint32_t magic;
    uint32_t version;
    char node[VN_MAX_NODE_NAME + 1]; /* NUL-terminated */
} VnShmHello;

typedef enum VnShmFetchKind {
    VN_SHM_FETCH_SEGMENT = 1,
    VN_SHM_FETCH_ROUTE = 2,
} VnShmFetchKind;

/* A VnShmHello (magic VN_SHM_FETCH_MAGIC) and what it asks for. */
typedef struct VnShmFetch {
    VnShmHello hello;
    uint32_t kind;     /* VnShmFetchKind */
    uint32_t reserved; /* 0 */
    uint64_t id;
} VnShmFetch;

typedef struct VnShmFetchReply {
    uint32_t magic;  /* VN_SHM_FETCH_MAGIC */
    int32_t status;  /* 0, or the positive errno of a refusal */
    uint64_t size;   /* a segment's bytes */
    uint64_t offset; /* where they start in the fd */
} VnShmFetchReply;

/* What a record may be: the first of an accepted connection (a VnShmHello
 * or a VnShmFetch), a frame of a link, a fetch's answer. */
typedef enum VnShmRecordKind {
    VN_SHM_RECORD_FIRST,
    VN_SHM_RECORD_FRAME,
    VN_SHM_RECORD_FETCH_REPLY,
} VnShmRecordKind;

/* The longest record (fabric/record.h) @kind may be; its exact size is
 * checked once it is in (vn_shm_hello_check(), the fetch's answer). */
uint32_t vn_shm_record_max(VnShmRecordKind kind);

/*
 * Check the first record of a connection accepted by node @self (a HELLO or
 * a FETCH); NULL with the node's name in @peer, or what is wrong with it
 * (newly allocated).  For a FETCH, @fetch gets it (else its magic is 0).
 */
char *vn_shm_hello_check(const uint8_t *buf, size_t len, unsigned nfds, bool overflow,
                         const char *self, char peer[VN_MAX_NODE_NAME + 1], VnShmFetch *fetch);

/* The parameters of shm.h's list into @l (the limits) and @delay_ns
 * ("crossing-delay-ns"); false with @error naming the parameter, and *@bad
 * (@bad may be NULL) pointing to its name. */
bool vn_shm_params_parse(GHashTable *params, VnFabricLimits *l, uint64_t *delay_ns,
                         const char **bad, GError **error);
/* VnFabricOps.check_params: the above, and "dir" given; touches nothing. */
bool vn_shm_params_check(GHashTable *params, const char **bad, GError **error);
/* @dir exists (made 0700 if not), is a directory of ours, and group and
 * others cannot write it: other users must not plant or replace node
 * sockets. */
bool vn_shm_dir_ok(const char *dir, GError **error);

/* A connection that has not said HELLO by then is closed. */
#define VN_SHM_HELLO_TIMEOUT_MS 2000
/* Accepted connections not yet named: a flood of them is refused. */
#define VN_SHM_MAX_UNNAMED 16
/* Connections the kernel holds for us to accept: every other node of a cluster may dial a
 * host that joins in the same instant (their heartbeats are whole-second timers), and a
 * dial finding the backlog full waits (up to VN_SHM_SEND_TIMEOUT_S). */
#define VN_SHM_BACKLOG VN_FABRIC_MAX_PEERS
/* A peer that does not drain its socket for this long loses its link. */
#define VN_SHM_SEND_TIMEOUT_S 5
/* What may wait for a peer's socket to take it: 16 of the largest frames (a megabyte each),
 * far past what a peer that reads leaves waiting. */
#define VN_SHM_MAX_QUEUED (16u * VN_FABRIC_MAX_FRAME)
/* Records read per wake-up, so one busy peer cannot starve the others. */
#define VN_SHM_RECORDS_PER_WAKEUP 64
/* Bounds of the limits: real adapters have 2..64 windows of at most a few
 * hundred GiB; a page is the smallest thing mmap maps. */
#define VN_SHM_MAX_WINDOWS 256
#define VN_SHM_MIN_WINDOW_SIZE 4096u
#define VN_SHM_MAX_WINDOW_SIZE (UINT64_C(1) << 40)
/* A modelled crossing longer than this is a typo: 1 ms is three orders of
 * magnitude above any NTB's, and the sender spins for it. */
#define VN_SHM_MAX_CROSSING_DELAY_NS 1000000u

#endif /* VN_SHM_H */
