/*
 * A worker's port: the daemon's end of the `host` fabric backend
 * (fabric/host.h has the wire and the worker's end).
 *
 * A worker is not a fabric node: its frames go out as this host's, and
 * what it maps, exports and rings is this host's.  It speaks with one peer:
 * a borrower worker with its lender, a lender worker with its device's
 * lease holder (set by the daemon as leases change).  The port relays for
 * it without waiting on anyone (a request becomes an asynchronous request
 * of the daemon's, its reply is sent back when it comes; a window map an
 * asynchronous map, answered when the peer's backend is; for a lender
 * worker, the peer's requests go to the worker, queued while it is away,
 * and its answers back), and checks what the worker asks like any peer's
 * input: only its peer, only requests and events that name its device,
 * only its own segments, routes, windows and doorbell bits, a bounded
 * number in flight.  The worker learns its peer's link is gone only when
 * the daemon says so (the lease ended, the lender was lost), not when the
 * link flaps.  Freeing the port takes back everything the worker had
 * through it.
 *
 * One port per worker.  The worker gets its connection made (vn_port_pair: one
 * end of a socket pair, inherited), so no other process can speak as it.  A
 * worker that lost it (its daemon restarted, or the port gave up on it) dials
 * the port's socket again; that is accepted only while it has no connection,
 * only from the worker's own process (its pid, from the kernel) and only when
 * the first thing it says is its secret (32 random bytes the port gave it in
 * the answer to its first HELLO, kept in the daemon's state file for the
 * daemon after us).  A process that has the worker's pid but not its secret
 * (the worker died and its pid was reused) is refused, and after it nobody.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_PORT_H
#define VN_PORT_H

#include "fabric/fabric.h"
#include "fabric/host.h"

#include <glib.h>
#include <stdbool.h>

typedef struct VnPort VnPort;

/* A worker that reads nothing of what its daemon sends for this long is stuck: its port
 * drops the connection (it reconnects when it is not), and the daemon never waits for it. */
#define VN_PORT_STALL_MS 2000u

/*
 * Listen on @path for the worker serving device @device (its name on the
 * lender) with @peer (NULL: none yet); @inbound for a lender's worker,
 * which answers the peer's requests.  A file at @path is replaced.  Its
 * sources go to @ctx (NULL: the default, the daemon's).  NULL with @error.
 */
VnPort *vn_port_new(VnFabric *fab, const char *path, const char *peer, const char *device,
                    bool inbound, GMainContext *ctx, GError **error);
/* Unmaps, unexports, frees its bits, fails what it had in flight; unlinks
 * the socket when @unlink (not when a worker outlives this daemon). */
void vn_port_free(VnPort *p, bool unlink);
/* vn_port_free(@p, true): the worker is gone for good. */
void vn_port_free_unlinked(VnPort *p);
/* The daemon stops and its worker serves on: what the worker exported and mapped stays as it
 * is (on an adapter that keeps it, for the next daemon), only our side of the port goes. */
void vn_port_leave(VnPort *p);
/* Whether the worker holds anything through the fabric: segments or routes exported, windows
 * mapped (its device's data path crosses it). */
bool vn_port_holds_paths(const VnPort *p);
/* Handle what the worker sent and we have not read yet (it has exited:
 * its last words, its DETACH, are relayed). */
void vn_port_drain(VnPort *p);
const char *vn_port_path(VnPort *p);

/* A new connection for a worker about to be started, with a new secret: the port keeps one
 * end (an earlier connection goes); the other (-1 with @error) is the worker's, to inherit
 * (close-on-exec: the spawn passes it on).  vn_port_set_worker() once it runs. */
int vn_port_pair(VnPort *p, GError **error);
void vn_port_set_worker(VnPort *p, GPid pid);
/* The process that may reconnect: 0 for none (none yet, or an impostor was refused). */
GPid vn_port_worker(VnPort *p);
/* The secret, for the state file (hex; NULL: none yet); free it. */
char *vn_port_secret_hex(VnPort *p);
/* A worker that outlived the daemon before us: it may reconnect as process @pid with the
 * secret @secret_hex (the state file's).  False when @secret_hex is no secret. */
bool vn_port_adopt(VnPort *p, GPid pid, const char *secret_hex);

/* The peer changes (NULL: none): the worker is told the old one's link is
 * down (a lender fences, a borrower's device is lost), a lender's worker
 * that the new one's is up; the old peer's requests at the worker fail. */
void vn_port_set_peer(VnPort *p, const char *peer);
const char *vn_port_peer(VnPort *p);
/* Peer-to-peer targets one lender's worker may be allowed to map (vn_port_p2p_allow): a few
 * BARs of the other devices of its holder's VM, each a few segments. */
#define VN_PORT_MAX_P2P 64u
/*
 * A lender's worker may map @node's segment @segment too (a peer-to-peer target: another
 * device's BAR its holder's VM reaches, docs/p2p.md), besides its peer's memory; @node may
 * be this host.  Said by the daemon for the device's holder; forgotten when the peer
 * changes.  False when the port holds VN_PORT_MAX_P2P already (or is no lender's).
 */
bool vn_port_p2p_allow(VnPort *p, const char *node, uint64_t segment);
/* A request of the peer's for a lender's worker: false (not taken: answer
 * it yourself) when @msg is not from the peer or this is no lender's port. */
bool vn_port_request(VnPort *p, VnFabricMsg *msg, uint64_t token);
/* A doorbell that is the worker's (true) is passed on to it. */
bool vn_port_doorbell(VnPort *p, const char *peer, uint32_t bit);

/* A lender's worker says the host wants its device back (VFIO's device
 * request; the kernel repeats it until the device is let go): @fn runs,
 * from the port's context, each time. */
typedef void (*VnPortDeviceRequestFn)(void *opaque);
void vn_port_on_device_request(VnPort *p, VnPortDeviceRequestFn fn, void *opaque);

/* A lender's worker says its device is fenced after its holder went: @fn runs, from the
 * port's context. */
typedef void (*VnPortFencedFn)(void *opaque);
void vn_port_on_fenced(VnPort *p, VnPortFencedFn fn, void *opaque);

/* The worker's connection closed (it exited, or restarts its port): @fn runs, from the
 * port's context.  For a worker that is not the daemon's child, the one sign it died. */
typedef void (*VnPortGoneFn)(void *opaque);
void vn_port_on_gone(VnPort *p, VnPortGoneFn fn, void *opaque);

/* A lender's worker says whether its device server answers (@up) and how many times a lost
 * one came back (@gen): @fn runs, from the port's context, at each change and at each
 * greeting.  A peer's word: @gen is bounded by nothing but its type. */
typedef void (*VnPortDeviceServerFn)(void *opaque, bool up, uint32_t gen);
void vn_port_on_device_server(VnPort *p, VnPortDeviceServerFn fn, void *opaque);
/* A lender's worker may ask the daemon to dial its device server at @socket_path (it gave up
 * the rights to reach the socket itself): at most once every VN_PORT_DIAL_MIN_MS, each a new
 * connection handed over, which ends the one before (one live connection per worker); no
 * other path, whatever the worker says. */
#define VN_PORT_DIAL_MIN_MS 50
void vn_port_set_dial(VnPort *p, const char *socket_path);
/* The same for a PCI function's worker: a dial opens the function's IOMMU group
 * (/dev/vfio/N, root's) for it, once at a time (VFIO allows one open file of a group). */
void vn_port_set_dial_vfio(VnPort *p, const char *bdf);

/*
 * The daemon's part of a fence, without the worker's help: what the worker exported
 * through the port (segments: the paths onto its device's BARs; routes) is withdrawn now,
 * confirmed when this returns (an NTB's translations cleared).  With @everything, also
 * what was mapped for it (windows onto the holder's memory, which its device may reach
 * through its IOMMU: only once the worker is dead, its IOMMU mappings with it), its
 * doorbells and maps under way: for a worker that died.  Logged with @why.  The worker's
 * own later unexport of a withdrawn id is no refusal.
 */
void vn_port_withdraw(VnPort *p, bool everything, const char *why);

/*
 * A borrower's worker says where its guest put its device's BARs and what QEMU mapped for
 * it without memory (fabric/host.h: VN_HOST_P2P_PLACE, _OFFER, _WITHDRAW): @fn runs, from
 * the port's context, with the op, its range and, for a PLACE, the BARs (@n, each checked for
 * its form: a range that does not wrap, 1..VN_HOST_BAR_SEGMENTS segments of @chunk that make
 * it).  When the port goes for good (vn_port_free_unlinked), a PLACE of none and a WITHDRAW
 * of everything come last.  A lender's worker says none of it.
 */
typedef void (*VnPortP2pFn)(void *opaque, uint32_t op, uint64_t iova, uint64_t size,
                            const VnHostBar *bars, unsigned n);
void vn_port_on_p2p(VnPort *p, VnPortP2pFn fn, void *opaque);
/* Whether segment @id is one the worker exported (and the daemon has not withdrawn). */
bool vn_port_exported(VnPort *p, uint64_t id);
/* Tell a borrower's worker its offer [@iova, +@size) is @peer's memory (@t: docs/p2p.md), or
 * is not any more (@t NULL). */
void vn_port_p2p_target(VnPort *p, uint64_t iova, uint64_t size, const char *peer,
                        const VnHostP2pTarget *t);

/* What a borrower's worker keeps for the worker after it (keep.h); NULL for a lender's.
 * The port's: it goes with the port. */
typedef struct VnKeep VnKeep;
VnKeep *vn_port_keep(VnPort *p);

/* Whether its worker is connected now. */
bool vn_port_connected(VnPort *p);

/* What the port refused from its worker (counted, logged). */
uint64_t vn_port_refused(VnPort *p);

#endif /* VN_PORT_H */
