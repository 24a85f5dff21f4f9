/*
 * The daemon-to-daemon protocol's messages, typed and bounded: what hosts'
 * vfio-ntbd say to each other over the fabric (cluster.c sends and handles
 * them).  Pure encode/decode, no I/O, as lending/proto.c is for a device.
 *
 *   message     kind      JSON
 *   ANNOUNCE    event     {"node", "devices": [{"name", "state": "lent"|"available",
 *                          "borrower": node|null, "lease": n|null,
 *                          "server": {"up", "generation"} (optional)}],
 *                          "holds": [{"lender", "name", "lease"}]}
 *   BORROW      request   {"device"}                       -> {"lease"}
 *   RETURN      request   {"device", "lease"}              -> {}
 *   REVOKE      event     {"device", "lease", "grace_ms"}
 *   P2P_SHARE   request   {"device", "lease", "node",       -> {"segments"}
 *                          "segments"}
 *   P2P_ALLOW   request   {"device", "lease", "node",       -> {}
 *                          "segments"}
 *
 * Peer-to-peer targets (docs/p2p.md): the holder of a device asks its lender to share the
 * segments of the device's BAR it exported to the holder with "node" (the lender of another
 * device of the holder's VM), and that device's lender to let its worker map them ("node":
 * whose segments they are).  Each lender checks the lease is the sender's.
 *
 * A lease is the host's: the lender lets the holder's node (its one fabric
 * identity) reach the device, whichever of its workers speaks.
 *
 * Peers are untrusted: a decoder checks every member (names by the one name
 * rule, leases > 0, at most VN_CONF_MAX_DEVICES devices and holds, a lent
 * device has its borrower and lease) and refuses the whole message, saying
 * why, when one is wrong; nothing is read in part.
 */
#ifndef VN_PEERS_H
#define VN_PEERS_H

#include "common/name.h"
#include "conf.h"
#include "identity.h"

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Fabric message types (the lending protocol, lending/proto.h, uses
 * 1..VN_PROTO_LAST). */
typedef enum VnPeersType {
    VN_PEERS_ANNOUNCE = 0x100,
    VN_PEERS_BORROW,
    VN_PEERS_RETURN,
    VN_PEERS_REVOKE,
    VN_PEERS_P2P_SHARE,
    VN_PEERS_P2P_ALLOW,
    VN_PEERS_TYPE_LAST
} VnPeersType;

/* A revoke's grace period is at most this (10 minutes). */
#define VN_PEERS_MAX_GRACE_MS 600000

typedef struct VnPeersDevice {
    char name[VN_MAX_DEVICE_NAME + 1];
    bool lent;
    char borrower[VN_MAX_NODE_NAME + 1]; /* "" when available */
    uint64_t lease;                      /* 0 when available */
    VnIdentity id;                       /* optional in an announcement ("id") */
    bool denied; /* the node this announcement goes to is not on its access list */
    /* Its device server (optional in an announcement: "server": {"up", "generation"}):
     * whether one answers, and how many times a lost one came back.  A holder presents
     * the device anew to its VM when the generation changes. */
    bool server_down;
    uint32_t server_gen;
} VnPeersDevice;

typedef struct VnPeersHold {
    char lender[VN_MAX_NODE_NAME + 1];
    char name[VN_MAX_DEVICE_NAME + 1];
    uint64_t lease;
    char domain[VN_MAX_DOMAIN_NAME + 1]; /* the VM it is served to; "" when not attached */
} VnPeersHold;

/* An announcement's "version": the daemon's release, shown by `ntbctl
 * nodes`; longer is not a version. */
#define VN_PEERS_MAX_VERSION 32

/* What a host lends and holds (some 20 KiB: allocate it). */
typedef struct VnPeersAnnounce {
    char node[VN_MAX_NODE_NAME + 1];
    char version[VN_PEERS_MAX_VERSION + 1]; /* "" from a daemon that sends none */
    unsigned n_devices;
    VnPeersDevice devices[VN_CONF_MAX_DEVICES];
    unsigned n_holds;
    VnPeersHold holds[VN_CONF_MAX_DEVICES];
    /* The sender's link to us went and came back while ours stayed (one side of a link can
     * see it flap alone): what we announced meanwhile may be lost, ours is wanted now. */
    bool answer;
} VnPeersAnnounce;

/* Segments one P2P request names: a BAR's (lending/proto.h cuts one into at most 16). */
#define VN_PEERS_MAX_SEGMENTS 16u

/* One request or REVOKE: the fields its type uses (0 / "" otherwise). */
typedef struct VnPeersRequest {
    char device[VN_MAX_DEVICE_NAME + 1]; /* the lender's local name */
    uint64_t lease;                      /* RETURN, REVOKE, P2P_* */
    uint32_t grace_ms;                   /* REVOKE */
    char node[VN_MAX_NODE_NAME + 1];     /* P2P_SHARE: with whom; P2P_ALLOW: whose */
    uint32_t nr_segments;                /* P2P_*: 1..VN_PEERS_MAX_SEGMENTS */
    uint64_t segments[VN_PEERS_MAX_SEGMENTS];
} VnPeersRequest;

const char *vn_peers_type_to_string(uint32_t type);

/* Encoders take what our own code built (valid by construction); they
 * return new JSON text. */
char *vn_peers_announce_to_json(const VnPeersAnnounce *a);
/* A device's "id" member (also in control answers). */
void vn_peers_identity_add(JsonBuilder *b, const VnIdentity *id);
char *vn_peers_request_to_json(VnPeersType type, const VnPeersRequest *r);
char *vn_peers_lease_to_json(uint64_t lease);

/*
 * Decoders.  @from is the sending node: an announcement must be its own.
 * False with @error (G_IO_ERROR_INVALID_DATA, naming the member) and @out
 * unspecified when anything is wrong.
 */
bool vn_peers_announce_from_json(const char *json, const char *from, VnPeersAnnounce *out,
                                 GError **error);
bool vn_peers_request_from_json(VnPeersType type, const char *json, VnPeersRequest *out,
                                GError **error);
/* BORROW's reply. */
bool vn_peers_lease_from_json(const char *json, uint64_t *lease, GError **error);
/* P2P_SHARE's reply: @n segments (as many as asked for). */
char *vn_peers_segments_to_json(const uint64_t *segments, uint32_t n);
bool vn_peers_segments_from_json(const char *json, uint64_t *segments, uint32_t n, GError **error);

/* Does @a claim lease @lease on @lender's device @name? */
bool vn_peers_announce_holds(const VnPeersAnnounce *a, const char *lender, const char *name,
                             uint64_t lease);

#endif /* VN_PEERS_H */
