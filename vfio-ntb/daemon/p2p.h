/*
 * Peer-to-peer targets, the daemon's part (docs/p2p.md).
 *
 * On the host that borrows: each borrowed device's worker says where its guest put the
 * device's mapped BARs and which ranges QEMU mapped for it without memory (offers: another
 * device's BAR, maybe).  An offer that lies inside a BAR of another device served to the same
 * VM (the same domain) becomes a target, the shortest path there: the BAR's lender shares
 * the BAR's segments with the offering device's lender (P2P_SHARE), that lender lets its
 * worker map them (P2P_ALLOW), and the offering worker is told (VN_HOST_P2P_TARGET), which
 * maps them for its device (a DMA_MAP naming the BAR's lender).  When the BAR moves or its
 * device goes, the target goes (VN_HOST_P2P_GONE).  Data never passes through this host.
 *
 * On a lender: P2P_SHARE and P2P_ALLOW from a device's holder, each checked against the
 * lease (the sender must hold it) and against what the device's worker exported.
 *
 * Threads: the daemon's main thread.
 */
#ifndef VN_P2P_H
#define VN_P2P_H

#include "daemon.h"
#include "devices.h"

/* Offers one borrowed device's worker may have (QEMU maps a few per BAR of each other
 * device of its VM: sparse areas around an MSI-X table). */
#define VN_P2P_MAX_OFFERS 64u

/* What the daemon keeps of one borrowed device (VnBorrowed.p2p_dev). */
typedef struct VnP2pDev VnP2pDev;
void vn_p2p_dev_free(VnP2pDev *p);

/* @b's worker got its port (started or adopted): what it says of its BARs and offers is
 * heard from now on. */
void vn_p2p_watch(VnDaemon *d, VnBorrowed *b);

/* Something the targets depend on changed (a device detached, its lender lost or back):
 * they are made again. */
void vn_p2p_changed(VnDaemon *d);

/* A lender's part: P2P_SHARE or P2P_ALLOW from @msg->peer about @ld, answered with @token. */
void vn_p2p_request(VnDaemon *d, VnLocalDevice *ld, VnFabricMsg *msg, uint64_t token);

/* For `ntbctl show` and tests: the targets of @b's offers, as JSON text ([] when none). */
char *vn_p2p_targets_json(VnBorrowed *b);

#endif /* VN_P2P_H */
