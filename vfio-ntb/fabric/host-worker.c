/*
 * What a worker tells and asks its daemon through the `host` backend besides fabric
 * traffic (fabric/host.h): a lender's device request, fence and device server, a dial of
 * its device server, the state kept for its successor, and a successor's take-over of what
 * the daemon exported for the worker before it.
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "host-int.h"

#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>

bool vn_host_device_request(VnFabric *fab)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        return false;
    }
    return vn_host_send_record(fab->backend, VN_HOST_DEVICE_REQUEST, 0, NULL, 0, 0, NULL, 0, -1) ==
           0;
}

bool vn_host_fenced(VnFabric *fab)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        return false;
    }
    return vn_host_send_record(fab->backend, VN_HOST_FENCED, 0, NULL, 0, 0, NULL, 0, -1) == 0;
}

bool vn_host_device_server(VnFabric *fab, bool up, uint32_t gen)
{
    VnHost *h;

    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        return false;
    }
    h = fab->backend;
    h->server_said = true;
    h->server_up = up;
    h->server_gen = gen;
    return h->fd >= 0 && vn_host_send_record(h, VN_HOST_DEVICE_SERVER, 0, NULL, up ? 1 : 0, gen,
                                             NULL, 0, -1) == 0;
}

/* A dial asked: whom to tell. */
typedef struct VnHostDialing {
    VnHostDialedFn done;
    void *opaque;
} VnHostDialing;

static void dial_answered(void *opaque, int status, const VnHostHdr *rep, int fd)
{
    VnHostDialing *d = opaque;
    g_autoptr(GError) error = NULL;

    if (status == 0 && fd < 0) {
        status = -EPROTO; /* an answer without the connection */
    }
    if (status < 0) {
        vn_util_close_fd(&fd);
        g_set_error(&error, G_IO_ERROR, g_io_error_from_errno(-status),
                    "the daemon could not reach it for us: %s", g_strerror(-status));
    }
    d->done(d->opaque, fd, error);
    g_free(d);
}

void vn_host_dial_device_async(VnFabric *fab, VnHostDialedFn done, void *opaque)
{
    VnHostDialing *d;

    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        g_autoptr(GError) error =
            g_error_new(G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "not a worker's fabric");

        done(opaque, -1, error);
        return;
    }
    d = g_new0(VnHostDialing, 1);
    *d = (VnHostDialing){ .done = done, .opaque = opaque };
    vn_host_ask(fab->backend, VN_HOST_DIAL_DEVICE, NULL, 0, 0, NULL, 0, -1, dial_answered, d);
}

bool vn_host_keep(VnFabric *fab, uint64_t key, int fd, const void *data, size_t len)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL || (key == 0) != (fd < 0) ||
        len > VN_HOST_MAX_KEPT_STATE || (fd >= 0 && len > 0)) {
        return false;
    }
    return vn_host_send_record(fab->backend, VN_HOST_KEEP, 0, NULL, key, 0, data, len, fd) == 0;
}

bool vn_host_forget(VnFabric *fab, uint64_t first, uint64_t last)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL || first > last) {
        return false;
    }
    return vn_host_send_record(fab->backend, VN_HOST_FORGET, 0, NULL, first, last, NULL, 0, -1) ==
           0;
}

bool vn_host_p2p_place(VnFabric *fab, const VnHostBar *bars, unsigned n)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL || n > VN_HOST_MAX_BARS) {
        return false;
    }
    return vn_host_send_record(fab->backend, VN_HOST_P2P_PLACE, 0, NULL, 0, 0, bars,
                               n * sizeof(*bars), -1) == 0;
}

bool vn_host_p2p_offer(VnFabric *fab, uint64_t iova, uint64_t size, bool withdraw)
{
    if (fab->ops != &vn_host_ops || fab->backend == NULL || size == 0) {
        return false;
    }
    return vn_host_send_record(fab->backend, withdraw ? VN_HOST_P2P_WITHDRAW : VN_HOST_P2P_OFFER, 0,
                               NULL, iova, size, NULL, 0, -1) == 0;
}

void vn_host_on_p2p(VnFabric *fab, VnHostP2pFn fn, void *opaque)
{
    VnHost *h;

    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        return;
    }
    h = fab->backend;
    h->p2p_fn = fn;
    h->p2p_opaque = opaque;
}

void vn_host_on_greeted(VnFabric *fab, VnHostGreetedFn fn, void *opaque)
{
    VnHost *h;

    if (fab->ops != &vn_host_ops || fab->backend == NULL) {
        return;
    }
    h = fab->backend;
    h->greeted_fn = fn;
    h->greeted_opaque = opaque;
}

bool vn_host_take_over(VnFabric *fab, const char *peer, const uint64_t *segments, unsigned nseg,
                       const uint64_t *routes, unsigned nroutes, uint64_t doorbells)
{
    bool ok = true;

    if (fab->backend == NULL) {
        return false;
    }
    for (unsigned i = 0; i < nseg; i++) {
        /* The daemon exported them for the worker before us: its port holds the fds, ours
         * is only to give them back. */
        ok &= vn_fabric_export_entry_adopt(fab->segments, segments[i], peer, false);
    }
    for (unsigned i = 0; i < nroutes; i++) {
        ok &= vn_fabric_export_entry_adopt(fab->routes, routes[i], peer, true);
    }
    /* Doorbell bits are a port's to give; another backend has none to take over. */
    if (fab->ops == &vn_host_ops) {
        ((VnHost *)fab->backend)->doorbells |= doorbells;
    } else if (doorbells != 0) {
        ok = false;
    }
    return ok;
}
