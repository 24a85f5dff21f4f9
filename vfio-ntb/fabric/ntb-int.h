/*
 * Inside the `ntb` backend (ntb.h): the node and its links, shared by ntb.c
 * (sessions, rings, links), ntb-map.c (segments through windows), ntb-route.c (interrupt
 * routes through doorbells) and ntb-resume.c (sessions taken over after a restart).
 *
 * Threads: all of it belongs to the fabric's GMainContext thread.
 */
#ifndef VN_NTB_INT_H
#define VN_NTB_INT_H

#include "ntb-auth.h"
#include "ntb.h"
#include "ntbport.h"

/* Maps and route opens one link may have waiting for the peer's answer: one SET_IRQS's
 * routes (VN_MAX_MSG_FDS, 16) with room for the maps and routes of other devices beside. */
#define VN_NTB_MAX_MAPS_PENDING 48u

typedef enum VnNtbLinkState {
    VN_NTB_LINK_DOWN,    /* no buffer of ours announced */
    VN_NTB_LINK_WAITING, /* our buffer announced; no session (or a broken one) */
    VN_NTB_LINK_OPEN,    /* a session: we can write into the peer's ring */
} VnNtbLinkState;

typedef struct VnNtb VnNtb;

/* A link's fds (vn_ntb_link_fds()) and the events they stand for. */
enum {
    VN_NTB_EV_LINK = 1u << 0,  /* the port's link changed */
    VN_NTB_EV_MSG = 1u << 1,   /* VN_NTB_DB_MSG: records in our ring */
    VN_NTB_EV_SPACE = 1u << 2, /* VN_NTB_DB_SPACE: room in the peer's */
    VN_NTB_EV_CTRL = 1u << 3,  /* VN_NTB_DB_CTRL: the peer announced a buffer */
    VN_NTB_EV_ALL = (1u << 4) - 1,
};
#define VN_NTB_LINK_FDS 4

typedef struct VnNtbLink {
    VnNtb *ntb;
    VnNtbPort *port;
    char expected[VN_MAX_NODE_NAME + 1]; /* the spec's "=NODE", or "" */
    char peer[VN_MAX_NODE_NAME + 1];     /* expected, or the HELLO's; "": not known yet */
    bool reported;                       /* link up told to the fabric */
    bool port_up;                        /* the port's link as last seen */
    VnNtbLinkState state;
    GSource *sources[VN_NTB_LINK_FDS]; /* one per fd of vn_ntb_link_fds() */
    GSource *retry;                    /* a full ring: try again soon */

    uint16_t epoch, peer_epoch, tag;
    uint8_t *in;       /* our buffer (the port's mapping): VN_NTB_RING_DATA + the node's ring */
    uint8_t *out;      /* the peer's buffer through window 0 */
    uint64_t ring_out; /* data bytes of the peer's ring */
    uint64_t rx_cons, tx_prod;
    uint64_t rx_told; /* rx_cons as last written into the peer's buffer */
    GByteArray *txq;  /* encoded records not yet in the peer's ring */
    gint64 stalled_since;
    GByteArray *reasm; /* a fragmented frame */
    uint8_t *payload;  /* one record's payload, vn_ntb_rec_max(ring) */
    uint64_t frames_in;

    /* Link keys (ntb-auth.h), this session's: the key (NULL: the link has none), our nonce,
     * the peer's HELLO and CHALLENGE as they came. */
    const uint8_t *key;
    size_t key_len;
    uint8_t nonce[VN_NTB_AUTH_NONCE_LEN], peer_nonce[VN_NTB_AUTH_NONCE_LEN];
    bool hello_seen, challenged;
    /* Sessions refused or broken by the peer since its link was last up (from the second,
     * the next announcement waits, so that a peer refused cannot keep us busy). */
    unsigned broken_run;
    GSource *reannounce;

    /* Windows 1..N-1: segment ids exported through ours, mapped through
     * the peer's (0: free). */
    uint64_t exported[VN_NTBPORT_MAX_WINDOWS];
    uint64_t mapped[VN_NTBPORT_MAX_WINDOWS];
    /* An exported window whose translation is cleared while its segment is
     * withheld (vn_fabric_segment_withhold). */
    bool withheld[VN_NTBPORT_MAX_WINDOWS];
    uint64_t map_seq;
    /* Doorbell bits VN_NTB_DB_FIRST_ROUTE.. that carry interrupt routes: the id of the route
     * of ours that our bit signals (route_in), of the peer's that we ring its bit for
     * (route_out); 0: none. */
    uint64_t route_in[VN_NTBPORT_MAX_DOORBELLS];
    uint64_t route_out[VN_NTBPORT_MAX_DOORBELLS];
    uint32_t peer_features; /* its HELLO's VN_NTB_FEATURE_* */
    /* ntb-resume.c: how long the port keeps the session past our end (0: not); a failed
     * save said once; the rest of a frame cut short by the last daemon's end, skipped. */
    uint32_t keep_ms;
    bool stash_failed;
    bool skip_frame;
    /* Ids of the exports taken over (by window, by route bit) that no worker adopted yet
     * (vn_fabric_adopt); those still there at vn_fabric_adopt_end are withdrawn. */
    uint64_t orphan_window[VN_NTBPORT_MAX_WINDOWS];
    uint64_t orphan_route[VN_NTBPORT_MAX_DOORBELLS];
    uint64_t orphan_mapped[VN_NTBPORT_MAX_WINDOWS];
} VnNtbLink;

struct VnNtb {
    VnFabric *fab;
    char *node;
    GMainContext *ctx;
    uint64_t ring;
    GPtrArray *links; /* VnNtbLink */
    VnNtbKeys *keys;  /* [fabric] key-file, or NULL */
    GSource *report;  /* link downs not told from inside a call */
    GQueue downs;     /* peer names to report down */
    GQueue lost;      /* and whose windows and routes went with their session (after) */
    uint64_t reports; /* link changes told to the fabric */
    GQueue maps;      /* VnNtbMapping (ntb-map.c): waiting for MAPPED, or to be told */
    bool receiving;   /* a ring is being read: nothing may read one again meanwhile */
    int64_t keep_ms;  /* "keep-ms" (ntb-resume.c) */
};

/* ntb.c */
VnNtbLink *vn_ntb_link_of(VnNtb *ntb, const char *peer);
/* Queue a record for the peer's ring (-ENOBUFS past VN_NTB_MAX_QUEUED);
 * vn_ntb_flush() moves what fits. */
int vn_ntb_queue(VnNtbLink *l, uint16_t kind, uint16_t flags, const void *payload, uint32_t len);
void vn_ntb_flush(VnNtbLink *l);
/* The peer broke the protocol: its session ends. */
void vn_ntb_session_broken(VnNtbLink *l, const char *why);
/* Report the link downs queued so far (from a call the fabric defers). */
void vn_ntb_report_downs(VnNtb *ntb);
/* The session is up (told to the fabric once), or over (told from the loop). */
void vn_ntb_link_up(VnNtbLink *l);
void vn_ntb_link_lost(VnNtbLink *l, const char *why);
/* Map the peer's buffer of @bytes through outbound window 0 (l->out, l->ring_out): 0,
 * -EAGAIN when the peer set no target there yet, -EMSGSIZE when it does not fit, -errno. */
int vn_ntb_peer_ring_map(VnNtbLink *l, uint64_t bytes);
/* Forget the session without touching the port (which is reset after). */
void vn_ntb_session_forget(VnNtbLink *l);

/* ntb-map.c */
/*
 * A request of ours waiting for the peer's answer (a map; a route's open, ntb-route.c):
 * vn_ntb_ask sends @kind (a VnNtbMap of @id) to @l; @done is told once (the answer's fd or
 * -errno, from the loop), or -ETIMEDOUT after @timeout_ms, or -ECANCELED as the node closes.
 * vn_ntb_asked: the request of @l the answer @seq is to, or NULL; vn_ntb_ask_finish: its
 * answer.
 */
typedef struct VnNtbMapping VnNtbMapping;
typedef void (*VnNtbMapDone)(void *opaque, int fd, uint64_t size, uint64_t offset);
VnNtbMapping *vn_ntb_ask(VnNtb *ntb, VnNtbLink *l, uint16_t kind, uint64_t id, int timeout_ms,
                         VnNtbMapDone done, void *opaque);
VnNtbMapping *vn_ntb_asked(VnNtbLink *l, uint16_t kind, uint64_t seq);
uint64_t vn_ntb_asked_id(const VnNtbMapping *m);
void vn_ntb_ask_finish(VnNtbMapping *m, int fd, uint64_t size, uint64_t offset);
void vn_ntb_on_map(VnNtbLink *l, const uint8_t *payload, uint32_t len);
void vn_ntb_on_mapped(VnNtbLink *l, const uint8_t *payload, uint32_t len);
void vn_ntb_on_unmap(VnNtbLink *l, const uint8_t *payload, uint32_t len);
/* @l's session ended (@err), or the node closes (-ECANCELED; @l NULL: every
 * link's): maps waiting fail, told from the loop (closing: at once). */
void vn_ntb_maps_end(VnNtb *ntb, VnNtbLink *l, int err);
void vn_ntb_map_segment_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                              void (*done)(void *opaque, int fd, uint64_t size, uint64_t offset),
                              void *opaque);
void vn_ntb_unmap_segment(void *backend, const char *peer, uint64_t id);
void vn_ntb_unexport(void *backend, bool route, uint64_t id);
int vn_ntb_withhold(void *backend, uint64_t id, bool withhold);
int vn_ntb_join(void *backend, const char *peer, const uint64_t *ids, uint32_t n, uint64_t chunk,
                bool device, uint64_t *offset);

/* ntb-route.c */
void vn_ntb_on_route(VnNtbLink *l, const uint8_t *payload, uint32_t len);
void vn_ntb_on_routed(VnNtbLink *l, const uint8_t *payload, uint32_t len);
void vn_ntb_on_unroute(VnNtbLink *l, const uint8_t *payload, uint32_t len);
/* Every route of @l goes, both ways (its session ended). */
void vn_ntb_routes_clear(VnNtbLink *l);
void vn_ntb_open_route_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                             void (*done)(void *opaque, int fd), void *opaque);
/* Our route @id is withdrawn: every bit that signals it is given back, and its opener told. */
void vn_ntb_route_unexport(VnNtb *ntb, uint64_t id);

/* ntb-resume.c */
/* The session's state into the port's stash (at each change of it, cheap). */
void vn_ntb_stash_save(VnNtbLink *l);
/* How far we read, before the record is handled. */
void vn_ntb_note_rx(VnNtbLink *l, bool in_frame);
/* At the port's open: ask it to keep; at the link's close: whether it keeps (the stash is
 * saved; the port is then closed without undoing anything). */
void vn_ntb_keep_at_open(VnNtbLink *l);
bool vn_ntb_keep_at_close(VnNtbLink *l);
/* Take over the session the last daemon kept, at open: true when the link is open again;
 * false when there was none to take (the port is as new). */
bool vn_ntb_resume(VnNtbLink *l);
void vn_ntb_on_resumed(VnNtbLink *l, const uint8_t *payload, uint32_t len);
bool vn_ntb_adopt(void *backend, VnFabricHeld kind, uint64_t id, const char *peer);
void vn_ntb_adopt_end(void *backend);

#endif /* VN_NTB_INT_H */
