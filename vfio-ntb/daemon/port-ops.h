/*
 * What a worker maps, exports, keeps and rings through its port (port-ops.c), each op
 * checked as any peer's input.  For port.c.
 */
#ifndef VN_PORT_OPS_H
#define VN_PORT_OPS_H

#include "port-conn.h"

/* A map or route open for the worker, until the peer's backend answered. */
typedef struct VnPortMap {
    VnPort *port; /* NULL once the port is gone */
    VnFabric *fab;
    VnHostHdr h;
} VnPortMap;

bool vn_port_array_take(GArray *a, uint64_t id);
void vn_port_op_withhold(VnPort *p, const VnHostHdr *h);
void vn_port_op_export(VnPort *p, const VnHostHdr *h, int fd);
void vn_port_op_claim(VnPort *p, const VnHostHdr *h);
/* The window from before our start onto segment @id (0: every one) is given back. */
void vn_port_adopted_unmap(VnPort *p, uint64_t id);
void vn_port_op_map(VnPort *p, const VnHostHdr *h);
void vn_port_op_unmap(VnPort *p, const VnHostHdr *h);
void vn_port_op_join(VnPort *p, const VnHostHdr *h, const uint8_t *ids, size_t len);
void vn_port_op_doorbells(VnPort *p, const VnHostHdr *h);
void vn_port_op_open_route(VnPort *p, const VnHostHdr *h);
void vn_port_op_keep(VnPort *p, const VnHostHdr *h, int *fd, const uint8_t *data, size_t len);

/* P2P_PLACE, _OFFER, _WITHDRAW: checked, told to the daemon (port.h: vn_port_on_p2p). */
void vn_port_op_p2p(VnPort *p, const VnHostHdr *h, const uint8_t *data, size_t len);

/* DIAL_DEVICE: a new connection to the lender's device server, handed over (port.h). */
void vn_port_op_dial(VnPort *p, const VnHostHdr *h);

#endif /* VN_PORT_OPS_H */
