/*
 * Interrupt routes through doorbells on the `ntb` backend (ntb.h): a route we
 * export is a doorbell bit of ours that signals its eventfd (a VM's irqfd)
 * in the kernel; a route of the peer's we open is an eventfd of our port
 * whose signals ring that bit of the peer's, in the kernel too.  Between a
 * lent device's interrupt and its VM, no process of either host wakes up.
 *
 * The exporter picks the bit, lowest free first, and keeps it for the
 * route until the route is withdrawn (then it tells the opener, which stops
 * ringing it) or the session ends (then both sides let go of every route of
 * the link; the opener's eventfds ring nothing more).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntb-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

/* The bits of @l that may carry routes: [VN_NTB_DB_FIRST_ROUTE, end). */
static uint32_t routes_end(VnNtbLink *l)
{
    return MIN(l->port->info.doorbells, VN_NTBPORT_MAX_DOORBELLS);
}

/* ---- the exporter's side ------------------------------------------------- */

void vn_ntb_on_route(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbMapped ans = { .status = EINVAL };
    VnNtbMap req;
    uint32_t bit, free_bit = 0;
    int fd, ret;

    if (len != sizeof(req) || !l->reported) {
        vn_ntb_session_broken(l, "a bad ROUTE");
        return;
    }
    memcpy(&req, payload, sizeof(req));
    ans.seq = req.seq;
    fd = vn_fabric_backend_route(l->ntb->fab, l->peer, req.id);
    for (bit = VN_NTB_DB_FIRST_ROUTE; bit < routes_end(l) && l->route_in[bit] != req.id; bit++) {
        if (free_bit == 0 && l->route_in[bit] == 0) {
            free_bit = bit;
        }
    }
    if (fd < 0) {
        ans.status = -fd;
    } else if (!l->port->info.doorbell_routes) {
        ans.status = EOPNOTSUPP;
    } else if (bit < routes_end(l)) {
        ans = (VnNtbMapped){ .seq = req.seq, .window = bit }; /* asked again: the same bit */
    } else if (free_bit == 0) {
        ans.status = ENOSPC;
        g_info("node %s: ntb port %s: %s's open of route %" PRIu64 " refused: all %u doorbells "
               "for routes in use",
               l->ntb->node, l->port->spec, l->peer, req.id,
               routes_end(l) > VN_NTB_DB_FIRST_ROUTE ? routes_end(l) - VN_NTB_DB_FIRST_ROUTE : 0);
    } else if ((ret = l->port->ops->doorbell_route(l->port, free_bit, fd)) < 0) {
        ans.status = -ret;
    } else {
        l->route_in[free_bit] = req.id;
        vn_ntb_stash_save(l);
        ans = (VnNtbMapped){ .seq = req.seq, .window = free_bit };
    }
    vn_ntb_queue(l, VN_NTB_REC_ROUTED, 0, &ans, sizeof(ans));
    vn_ntb_flush(l);
}

void vn_ntb_route_unexport(VnNtb *ntb, uint64_t id)
{
    for (guint i = 0; i < ntb->links->len; i++) {
        VnNtbLink *l = ntb->links->pdata[i];

        for (uint32_t bit = VN_NTB_DB_FIRST_ROUTE; bit < routes_end(l); bit++) {
            if (l->route_in[bit] == id) {
                VnNtbMap gone = { .seq = bit, .id = id };

                l->port->ops->doorbell_route(l->port, bit, -1);
                l->route_in[bit] = 0;
                vn_ntb_stash_save(l);
                if (l->state == VN_NTB_LINK_OPEN) {
                    vn_ntb_queue(l, VN_NTB_REC_UNROUTE, 0, &gone, sizeof(gone));
                    vn_ntb_flush(l);
                }
            }
        }
    }
}

/* ---- the opener's side --------------------------------------------------- */

typedef struct VnNtbRouting {
    void (*done)(void *opaque, int fd);
    void *opaque;
} VnNtbRouting;

static void route_told(void *opaque, int fd, uint64_t size, uint64_t offset)
{
    VnNtbRouting *r = opaque;

    r->done(r->opaque, fd);
    g_free(r);
}

void vn_ntb_open_route_async(void *backend, const char *peer, uint64_t id, int timeout_ms,
                             void (*done)(void *opaque, int fd), void *opaque)
{
    VnNtb *ntb = backend;
    VnNtbLink *l = vn_ntb_link_of(ntb, peer);
    VnNtbRouting *r = g_new0(VnNtbRouting, 1);

    *r = (VnNtbRouting){ .done = done, .opaque = opaque };
    /* A peer that does not know routes would end the session at our ROUTE. */
    if (l != NULL && l->reported && !(l->peer_features & VN_NTB_FEATURE_ROUTES)) {
        g_info("node %s: %s's route %" PRIu64 " not opened: it offers none (an older vfio-ntbd, "
               "or a module without VN_NTB_PEER_DB_EVENTFD)",
               ntb->node, peer, id);
        vn_ntb_ask_finish(vn_ntb_ask(ntb, NULL, VN_NTB_REC_ROUTE, id, timeout_ms, route_told, r),
                          -EOPNOTSUPP, 0, 0);
        return;
    }
    vn_ntb_ask(ntb, l, VN_NTB_REC_ROUTE, id, timeout_ms, route_told, r);
}

void vn_ntb_on_routed(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbMapping *m;
    VnNtbMapped a;
    int fd;

    if (len != sizeof(a)) {
        vn_ntb_session_broken(l, "a bad ROUTED");
        return;
    }
    memcpy(&a, payload, sizeof(a));
    if (a.status == 0 && (a.window < VN_NTB_DB_FIRST_ROUTE || a.window >= routes_end(l) ||
                          a.size != 0 || a.flags != 0 || a.reserved != 0)) {
        vn_ntb_session_broken(l, "a ROUTED naming a doorbell we cannot ring");
        return;
    }
    m = vn_ntb_asked(l, VN_NTB_REC_ROUTE, a.seq);
    if (m == NULL) {
        return; /* given up on: the bit stays the peer's route until it withdraws it */
    }
    if (a.status != 0) {
        vn_ntb_ask_finish(m, a.status > 0 && a.status < 4096 ? -a.status : -EIO, 0, 0);
        return;
    }
    /* A bit that rang another route of the peer's rings this one now. */
    fd = l->port->info.doorbell_routes ? l->port->ops->peer_doorbell_fd(l->port, a.window)
                                       : -EOPNOTSUPP;
    if (fd >= 0) {
        l->route_out[a.window] = vn_ntb_asked_id(m);
        vn_ntb_stash_save(l);
    }
    vn_ntb_ask_finish(m, fd, 0, 0);
}

void vn_ntb_on_unroute(VnNtbLink *l, const uint8_t *payload, uint32_t len)
{
    VnNtbMap gone;

    if (len != sizeof(gone)) {
        vn_ntb_session_broken(l, "a bad UNROUTE");
        return;
    }
    memcpy(&gone, payload, sizeof(gone));
    /* Only a bit we ring for that route: the eventfds handed out for it ring nothing now. */
    if (gone.seq >= VN_NTB_DB_FIRST_ROUTE && gone.seq < routes_end(l) &&
        l->route_out[gone.seq] != 0 && l->route_out[gone.seq] == gone.id) {
        l->port->ops->peer_doorbell_drop(l->port, (uint32_t)gone.seq);
        l->route_out[gone.seq] = 0;
        vn_ntb_stash_save(l);
    }
}

void vn_ntb_routes_clear(VnNtbLink *l)
{
    for (uint32_t bit = VN_NTB_DB_FIRST_ROUTE; bit < routes_end(l); bit++) {
        if (l->route_in[bit] != 0) {
            l->port->ops->doorbell_route(l->port, bit, -1);
            l->route_in[bit] = 0;
        }
        if (l->route_out[bit] != 0) {
            l->port->ops->peer_doorbell_drop(l->port, bit);
            l->route_out[bit] = 0;
        }
    }
}
