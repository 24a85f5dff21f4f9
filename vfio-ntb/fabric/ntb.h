/*
 * The `ntb` fabric backend: a node's links are NTB ports (fabric/ntbport.h),
 * one peer each, driven through Linux's NTB API by our kernel module on real
 * adapters, or emulated in-process for tests.  Nothing but what an NTB
 * carries crosses: memory through windows, doorbells, scratchpads, the link.
 *
 * Parameters: "ports" (required): comma-separated port specs, each
 * optionally followed by "=NODE", the node cabled to it (a peer naming
 * itself otherwise is refused);
 * "ring-size" (bytes of each message ring, a power of two from
 * VN_NTB_MIN_RING to VN_NTB_MAX_RING, default VN_NTB_DEFAULT_RING);
 * "key-file" (the link keys, ntb-auth.h: every port must then say =NODE and
 * the file hold that node's key);
 * "keep-ms" (how long a port keeps a session past this node's end for the
 * next node on it to take over, ntb-resume.c; 0 to VN_NTB_MAX_KEEP_MS,
 * default 0; vfio-ntbd's is VN_NTB_DEFAULT_KEEP_MS): whoever opens a node
 * with it calls vn_fabric_adopt_end() once its workers claimed theirs.
 *
 * Window budget: inbound window 0 of every port holds the message ring the
 * peer writes into; windows 1..N-1 carry segments, one mapping each, so an
 * adapter with N windows per direction lends N-1 segments to its peer at a
 * time (the limit is the adapter's: ntbport's windows); with one window, a
 * port carries messages only.  A map takes the
 * exporter's next free window and the mapper's window of the same number.
 *
 * Session (per port, each time its link comes up): each side allocates its
 * ring buffer as its inbound window 0's target, picks a new nonzero epoch
 * and writes (VN_NTB_SPAD_MAGIC << 16 | epoch) and the buffer's pages into
 * the peer's scratchpads VN_NTB_SPAD_HELLO and VN_NTB_SPAD_PAGES, then rings
 * VN_NTB_DB_CTRL.  A side that reads a new epoch there starts a session: it
 * maps its outbound window 0 (the peer's buffer), starts both directions
 * at 0 and sends a HELLO record naming itself; the link is up once the
 * peer's HELLO of the same session arrives (with link keys: after its HELLO
 * each side sends a CHALLENGE and answers the peer's with a PROOF, and the
 * link is up once the peer's PROOF is right; ntb-auth.h) (a peer that restarts may still be
 * in a session with our last epoch until our announcement reaches it: what we
 * sent before its HELLO would be lost).  Every index word written
 * across is tagged with the session (both epochs), so words of a session
 * that ended -- a restarted peer's, or ours in flight -- are ignored.
 *
 * Ring: the peer's buffer starts with a VnNtbRingHdr; data follow at
 * VN_NTB_RING_DATA.  The writer copies records into data (wrapping), then
 * stores prod and rings VN_NTB_DB_MSG; the reader reads its own memory
 * only, and stores how much it consumed into the writer's buffer (cons),
 * ringing VN_NTB_DB_SPACE when it freed more than half.  All remote
 * accesses are writes (reads through an NTB are slow and can stall).
 * A record is a VnNtbRec and its payload padded to 8 bytes; frames longer
 * than a quarter of the ring travel as fragments.  A peer's malformed
 * record ends its session (it must start a new one).
 *
 * Restarts: a session outlives its node where the port keeps what the node
 * set up ("keep-ms"); the next node on that port takes it over where it was
 * (ntb-resume.c) and tells the peer (RESUMED), whose link then goes down and
 * up again for its fabric but keeps every window and route.  Only with a peer
 * whose HELLO says it can (VN_NTB_FEATURE_RESUME); else a new session.
 *
 * Doorbells of the fabric travel as messages; the adapter's bits 0-2 are the
 * backend's.  The others carry interrupt routes (VN_FABRIC_CAP_DIRECT_ROUTES,
 * where every port has info.doorbell_routes): the opener asks the exporter
 * for route id (ROUTE); the exporter takes a free bit of the link, has it
 * signal the route's eventfd (a VM's irqfd) and answers which (ROUTED); the
 * opener gets an eventfd of its port that rings that bit of the peer's.  A
 * device signalling it then interrupts the VM with no process of either host
 * on the way.  A route withdrawn is told (UNROUTE) so that the opener stops
 * ringing its bit; a session's end clears every route of the link both
 * ways.  A peer's HELLO says whether it knows routes (VN_NTB_FEATURE_ROUTES).
 *
 * Threads: all of it runs in the fabric's GMainContext.
 */
#ifndef VN_NTB_H
#define VN_NTB_H

#include "fabric.h"

#include <stdint.h>

/* The backend's table; vn_fabric_open() registers it as "ntb". */
extern const VnFabricOps vn_ntb_ops;

/* Ports one node drives (adapters a host holds, with headroom). */
#define VN_NTB_MAX_PORTS 16u
#define VN_NTB_MIN_RING (64u * 1024u)
#define VN_NTB_MAX_RING (16u * 1024u * 1024u)
#define VN_NTB_DEFAULT_RING (512u * 1024u)
/* Largest window offered: 1 TiB, above any adapter's. */
#define VN_NTB_MAX_WINDOW_SIZE (UINT64_C(1) << 40)
/* Bytes queued for one peer whose ring is full (what shm's socket queue holds); past it the
 * link drops: a send does not wait for room. */
#define VN_NTB_MAX_QUEUED (16u * VN_FABRIC_MAX_FRAME)
/* A peer that takes nothing from its ring for this long loses its link. */
#define VN_NTB_SEND_TIMEOUT_MS 5000
/* How long vfio-ntbd's ports keep a session for the next daemon unless its config says
 * ("keep-ms"): above a restart's time (systemd restarts a crashed daemon after 1 s); also
 * what a peer waits before it sees the link of a node that stopped for good go down. */
#define VN_NTB_DEFAULT_KEEP_MS 15000u
#define VN_NTB_MAX_KEEP_MS 600000u
/* A peer whose sessions keep breaking gets a new one at most this often. */
#define VN_NTB_BROKEN_RETRY_MS 1000
/* Records handled per wake-up, so one busy peer cannot starve the others. */
#define VN_NTB_RECORDS_PER_WAKEUP 64

#define VN_NTB_SPAD_HELLO 0u
#define VN_NTB_SPAD_PAGES 1u
#define VN_NTB_SPAD_MAGIC 0x564eu /* "VN" */
#define VN_NTB_DB_MSG 0u
#define VN_NTB_DB_SPACE 1u
#define VN_NTB_DB_CTRL 2u
/* The first bit that carries an interrupt route. */
#define VN_NTB_DB_FIRST_ROUTE 3u
/* It answers ROUTE (HELLO's features). */
#define VN_NTB_FEATURE_ROUTES 0x1u
/* It takes RESUMED (a session taken over by the next daemon of its peer). */
#define VN_NTB_FEATURE_RESUME 0x2u
#define VN_NTB_VERSION 1u

/* Where the ring's data start in a buffer. */
#define VN_NTB_RING_DATA 4096u

/* The head of a ring buffer.  Index words are (tag << 48 | byte count mod
 * 2^48), the tag being the session's (vn_ntb_tag()). */
typedef struct VnNtbRingHdr {
    uint64_t prod; /* written by the peer: bytes it put into data */
    uint64_t pad0[7];
    uint64_t cons; /* written by the peer: bytes it took from *its* ring */
    uint64_t pad1[7];
} VnNtbRingHdr;

#define VN_NTB_COUNT_MASK ((UINT64_C(1) << 48) - 1)

/* Words of our own in our buffer's head, which the peer does not read: how far we read its
 * ring (tagged as an index word), written before each record is handled, and whether that
 * was inside a frame cut into records; what the next daemon resumes from (ntb-resume.c). */
#define VN_NTB_RESUME_OFFSET 2048u
typedef struct VnNtbResumeWords {
    uint64_t rx_cons;
    uint64_t in_frame;
} VnNtbResumeWords;

typedef enum VnNtbRecKind {
    VN_NTB_REC_HELLO = 1, /* VnNtbHello */
    VN_NTB_REC_FRAME,     /* a fabric frame, or a piece (VN_NTB_REC_MORE) */
    VN_NTB_REC_MAP,       /* VnNtbMap: map segment id through a window */
    VN_NTB_REC_MAPPED,    /* VnNtbMapped: the answer */
    VN_NTB_REC_UNMAP,     /* VnNtbMap (seq: the window): that mapping is gone */
    VN_NTB_REC_CHALLENGE, /* VnNtbChallenge (link keys only) */
    VN_NTB_REC_PROOF,     /* VnNtbProof: the answer to the peer's CHALLENGE */
    VN_NTB_REC_ROUTE,     /* VnNtbMap: open interrupt route id */
    VN_NTB_REC_ROUTED,    /* VnNtbMapped (window: the doorbell bit, size 0): the answer */
    VN_NTB_REC_UNROUTE,   /* VnNtbMap (seq: the bit): that route is gone */
    VN_NTB_REC_RESUMED,   /* a u64, 0: the sender's next daemon took the session over */
    VN_NTB_REC_LAST
} VnNtbRecKind;

#define VN_NTB_REC_MORE 0x1u /* a frame continues in the next record */

typedef struct VnNtbRec {
    uint32_t len; /* payload bytes */
    uint16_t kind;
    uint16_t flags;
} VnNtbRec;

typedef struct VnNtbHello {
    uint32_t version;
    uint32_t features;               /* VN_NTB_FEATURE_*; 0 from a peer older than them */
    char node[VN_MAX_NODE_NAME + 1]; /* NUL-terminated */
} VnNtbHello;

typedef struct VnNtbChallenge {
    uint8_t nonce[16]; /* VN_NTB_AUTH_NONCE_LEN */
} VnNtbChallenge;

typedef struct VnNtbProof {
    uint8_t mac[32]; /* VN_NTB_AUTH_PROOF_LEN */
} VnNtbProof;

typedef struct VnNtbMap {
    uint64_t seq; /* the mapper's number, echoed */
    uint64_t id;
} VnNtbMap;

typedef struct VnNtbMapped {
    uint64_t seq;
    int32_t status; /* 0, or the positive errno of a refusal */
    uint32_t window;
    uint64_t size;
    uint32_t flags; /* VN_NTB_MAPPED_* */
    uint32_t reserved;
} VnNtbMapped;

/* The segment is a device's registers (its BAR), not memory: mapped uncached. */
#define VN_NTB_MAPPED_DEVICE 0x1u

/* The session tag of two epochs (nonzero, the same on both sides). */
uint16_t vn_ntb_tag(uint16_t a, uint16_t b);
/* Largest payload of one record in a ring of @ring bytes. */
uint32_t vn_ntb_rec_max(uint64_t ring);

/*
 * Ring access over plain memory (ntb-ring.c), for the backend, the fuzzer
 * and the unit suite.  @data is the ring (@ring bytes, a power of two).
 * put: copy @len bytes to position @pos (wrapping).  take: read the record
 * at @pos of the @avail bytes written: returns its size in the ring (header
 * and padding) with its header in @rec and payload copied to @payload (at
 * least vn_ntb_rec_max() bytes), or -EBADMSG for a record that cannot be
 * (too long for the ring or for what was written, an unknown kind).
 */
void vn_ntb_ring_put(uint8_t *data, uint64_t ring, uint64_t pos, const void *src, size_t len);
int64_t vn_ntb_ring_take(const uint8_t *data, uint64_t ring, uint64_t pos, uint64_t avail,
                         VnNtbRec *rec, uint8_t *payload);
/* The ring size of a buffer of @bytes: the largest power of two that fits
 * after the header, or 0 when under VN_NTB_MIN_RING. */
uint64_t vn_ntb_ring_of(uint64_t bytes);

#endif /* VN_NTB_H */
