/*
 * The lender's interrupts (see lender.h): SET_IRQS forwarded to the device,
 * in fd mode with the fds of the borrower's interrupt routes (the fabric's:
 * on shm the VM's own eventfds), or in relay mode with the lender's own
 * eventfds, each watched in the fabric's context and turned into a doorbell
 * of the borrower (proto.h: the bits the borrower named for the vectors).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"

#include "common/util.h"
#include "trace-lending.h"

#include <errno.h>
#include <glib-unix.h>
#include <inttypes.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- the host's device request ------------------------------------------ */

static gboolean request_ready(gint fd, GIOCondition cond, gpointer data)
{
    VnLender *l = data;
    uint64_t n;

    if (read(fd, &n, sizeof(n)) != sizeof(n)) {
        return G_SOURCE_CONTINUE;
    }
    l->requests++;
    l->stats.device_requests++;
    g_message("lender %s: the host wants %s back (VFIO device request %u)", l->name, l->where,
              l->requests);
    if (l->on_request != NULL && l->requests < VN_LENDER_REQUESTS_BEFORE_FENCE) {
        l->on_request(l->on_request_opaque);
    } else if (l->borrower != NULL) {
        l->up->fence(l, l->on_request != NULL ? "the host asked for the device again"
                                              : "the host wants the device back");
    }
    return G_SOURCE_CONTINUE;
}

void vn_lender_request_watch(VnLender *l)
{
    const uint32_t req = VFIO_PCI_REQ_IRQ_INDEX;
    int fd, ret;

    if (l->request_fd >= 0 || l->dev.num_irqs <= req || l->dev.irq_count[req] == 0 ||
        !(l->dev.irq_flags[req] & VFIO_IRQ_INFO_EVENTFD)) {
        return;
    }
    fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) {
        g_warning("lender %s: no eventfd for the device request: %s", l->name, g_strerror(errno));
        return;
    }
    ret = l->ops->set_irqs(l->device, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER, req,
                           0, 1, NULL, &fd);
    if (ret < 0) {
        g_warning("lender %s: the host's device request cannot be heard (%s): an unbind "
                  "or removal of %s would wait for the lease to end",
                  l->name, g_strerror(-ret), l->where);
        close(fd);
        return;
    }
    l->request_fd = fd;
    l->requests = 0;
    l->request_src = vn_util_fd_source_new(fd, G_IO_IN);
    g_source_set_callback(l->request_src, G_SOURCE_FUNC(request_ready), l, NULL);
    g_source_attach(l->request_src, l->ctx);
}

/* After the device is closed (which drops VFIO's own reference). */
void vn_lender_request_unwatch(VnLender *l)
{
    if (l->request_src != NULL) {
        g_source_destroy(l->request_src);
        g_clear_pointer(&l->request_src, g_source_unref);
    }
    vn_util_close_fd(&l->request_fd);
}

/* ---- relay ------------------------------------------------------------- */

static gboolean relay_ready(gint fd, GIOCondition cond, gpointer data)
{
    VnLenderRelay *r = data;
    VnLender *l = r->l;
    uint64_t n;
    int ret;

    /* One doorbell per wake-up: signals that came together are one
     * interrupt, as an edge-triggered MSI would be. */
    if (read(fd, &n, sizeof(n)) != sizeof(n)) {
        return G_SOURCE_CONTINUE; /* EAGAIN: another read got it */
    }
    ret = vn_fabric_doorbell(l->fab, l->borrower, r->bit);
    if (ret == 0) {
        /* Count the device's signals, not doorbells: the counter proves
         * every completion interrupt was relayed, coalesced or not. */
        l->stats.relayed_irqs += n;
    }
    trace_lender_irq_relay(l->name, r->index, r->vector, l->borrower, r->bit, ret);
    return G_SOURCE_CONTINUE;
}

static VnLenderRelay *relay_new(VnLender *l, uint32_t index, uint32_t vector, uint32_t bit,
                                int *err)
{
    VnLenderRelay *r;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

    if (fd < 0) {
        *err = -errno;
        return NULL;
    }
    r = g_new0(VnLenderRelay, 1);
    r->l = l;
    r->fd = fd;
    r->index = index;
    r->vector = vector;
    r->bit = bit;
    /* Attached to the context only once the device has taken the fd. */
    r->src = vn_util_fd_source_new(fd, G_IO_IN);
    g_source_set_callback(r->src, G_SOURCE_FUNC(relay_ready), r, NULL);
    return r;
}

static void relay_free(VnLenderRelay *r)
{
    if (r == NULL) {
        return;
    }
    g_source_destroy(r->src);
    g_source_unref(r->src);
    vn_util_close_fd(&r->fd);
    g_free(r);
}

void vn_lender_relay_drop(VnLender *l, uint32_t index, uint32_t start, uint32_t count)
{
    uint32_t end;

    if (index >= VN_LENDER_RELAY_INDEXES || start >= VN_PROTO_RELAY_VECTORS) {
        return;
    }
    end = count == 0 ? VN_PROTO_RELAY_VECTORS
                     : (uint32_t)MIN((uint64_t)start + count, VN_PROTO_RELAY_VECTORS);
    for (uint32_t v = start; v < end; v++) {
        g_clear_pointer(&l->relay[index][v], relay_free);
    }
}

void vn_lender_relay_drop_all(VnLender *l)
{
    for (uint32_t i = 0; i < VN_LENDER_RELAY_INDEXES; i++) {
        vn_lender_relay_drop(l, i, 0, 0);
    }
}

/*
 * Give the device eventfds of ours for [start, start + count) of @index.
 * A vfio-user message carries VN_MAX_MSG_FDS fds, so a larger range goes in
 * chunks (any backend takes them); when a later chunk fails, the range is de-assigned on the
 * device (its earlier eventfds are replaced already) and the error returned.
 */
static void relay_assign(VnLender *l, const VnProtoSetIrqs *s, uint64_t token)
{
    VnLenderRelay *fresh[VN_PROTO_RELAY_VECTORS] = { NULL };
    int fds[VN_PROTO_RELAY_VECTORS];
    uint32_t done = 0;
    int ret = 0;

    for (uint32_t i = 0; i < s->count; i++) {
        fresh[i] = relay_new(l, s->index, s->start + i, s->doorbell + i, &ret);
        if (fresh[i] == NULL) {
            vn_lender_fail(l, token, ret, "SET_IRQS: no eventfd: %s", g_strerror(-ret));
            goto free;
        }
        fds[i] = fresh[i]->fd;
    }
    while (done < s->count) {
        uint32_t n = MIN(s->count - done, VN_MAX_MSG_FDS);

        ret = l->ops->set_irqs(l->device, s->flags, s->index, s->start + done, n, NULL, fds + done);
        if (ret < 0) {
            break;
        }
        done += n;
    }
    if (ret < 0) {
        if (done > 0) {
            l->ops->set_irqs(l->device, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                             s->index, s->start, done, NULL, NULL);
            vn_lender_relay_drop(l, s->index, s->start, done);
        }
        vn_lender_fail(l, token, ret, "SET_IRQS failed on the device: %s", g_strerror(-ret));
        goto free;
    }
    vn_lender_relay_drop(l, s->index, s->start, s->count);
    for (uint32_t i = 0; i < s->count; i++) {
        l->relay[s->index][s->start + i] = g_steal_pointer(&fresh[i]);
        g_source_attach(l->relay[s->index][s->start + i]->src, l->ctx);
    }
    trace_lender_irq_relaying(l->name, s->index, s->start, s->start + s->count - 1, l->borrower);
    vn_fabric_reply(l->fab, token, "{}", NULL, 0);
free:
    for (uint32_t i = 0; i < s->count; i++) {
        relay_free(fresh[i]);
    }
}

/* ---- SET_IRQS ---------------------------------------------------------- */

/* True when exactly one bit of @mask is set in @flags (linux/vfio.h: one
 * data type, one action). */
static bool one_of(uint32_t flags, uint32_t mask)
{
    uint32_t v = flags & mask;

    return v != 0 && (v & (v - 1)) == 0;
}

/* Check a relayed assignment; 0 or the errno for the borrower. */
static int relay_check(VnLender *l, const VnProtoSetIrqs *s, const char **why)
{
    if (s->flags != (VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)) {
        *why = "relay is for DATA_EVENTFD|ACTION_TRIGGER";
        return EINVAL;
    }
    if (l->irq_mode != VN_IRQ_MODE_RELAY) {
        *why = "attached with fd interrupts, not relay";
        return EINVAL;
    }
    if (s->index >= VN_LENDER_RELAY_INDEXES) {
        *why = "only INTx, MSI and MSI-X can be relayed";
        return ENOTSUP;
    }
    if (s->index == VFIO_PCI_INTX_IRQ_INDEX && (s->start != 0 || s->count != 1)) {
        *why = "INTx is one vector";
        return EINVAL;
    }
    /* A lender limit, whatever the device has: one doorbell per vector. */
    if ((uint64_t)s->start + s->count > VN_PROTO_RELAY_VECTORS) {
        *why = "vectors beyond the relay's doorbells";
        return ENOSPC;
    }
    if ((uint64_t)s->doorbell + s->count > VN_FABRIC_MAX_DOORBELLS) {
        *why = "doorbell bits beyond any NTB's";
        return EINVAL;
    }
    if (s->count == 0 || (uint64_t)s->start + s->count > l->dev.irq_count[s->index]) {
        *why = "vectors beyond the device's";
        return EINVAL;
    }
    return 0;
}

/* Give SET_IRQS @s to the device (@fds: @nroutes routes, closed here) and answer it. */
static void irqs_apply(VnLender *l, const VnFabricMsg *msg, const VnProtoSetIrqs *s, int *fds,
                       uint32_t nroutes, uint64_t token)
{
    uint32_t data = s->flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    uint32_t action = s->flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    int ret = l->ops->set_irqs(l->device, s->flags, s->index, s->start, s->count,
                               data == VFIO_IRQ_SET_DATA_BOOL ? msg->data : NULL,
                               nroutes > 0 ? fds : NULL);

    /* The device server has its own copies now. */
    vn_util_close_fds(fds, nroutes);
    if (ret < 0) {
        vn_lender_fail(l, token, ret, "SET_IRQS failed on the device: %s", g_strerror(-ret));
        return;
    }
    /* The device no longer signals our eventfds there. */
    if (action == VFIO_IRQ_SET_ACTION_TRIGGER && data == VFIO_IRQ_SET_DATA_EVENTFD &&
        s->count > 0) {
        vn_lender_relay_drop(l, s->index, s->start, s->count);
    } else if (action == VFIO_IRQ_SET_ACTION_TRIGGER && data == VFIO_IRQ_SET_DATA_NONE &&
               s->count == 0) {
        vn_lender_relay_drop(l, s->index, 0, 0); /* linux/vfio.h: disable the index */
    }
    trace_lender_set_irqs(l->name, s->flags, s->index, s->start, s->count, nroutes);
    vn_fabric_reply(l->fab, token, "{}", NULL, 0);
}

/*
 * A SET_IRQS whose routes (one u64 id per vector in its data) are being opened, all at
 * once; it goes on when every one has answered.  At most VN_MAX_MSG_FDS: what one
 * vfio-user message of QEMU carries.
 */
typedef struct IrqRoutesWait IrqRoutesWait;
typedef struct IrqRoute {
    IrqRoutesWait *rw;
    uint32_t i;
} IrqRoute;

struct IrqRoutesWait {
    VnLenderWait wait;
    VnFabricMsg *msg; /* a copy: the handler's is gone by the answers */
    VnProtoSetIrqs s;
    uint32_t answered;
    int fds[VN_MAX_MSG_FDS];
    IrqRoute route[VN_MAX_MSG_FDS];
    int err; /* the first route that failed: its errno, vector and why */
    uint32_t where;
    char *why;
};

static void irq_routes_opened(IrqRoutesWait *rw)
{
    VnLender *l = vn_lender_wait_end(&rw->wait);
    bool apply = l != NULL && rw->err == 0 && vn_lender_wait_current(l, &rw->wait);

    if (apply) {
        irqs_apply(l, rw->msg, &rw->s, rw->fds, rw->s.count, rw->wait.token);
    } else {
        vn_util_close_fds(rw->fds, rw->s.count);
    }
    if (l != NULL && rw->err != 0) {
        vn_lender_fail(l, rw->wait.token, rw->err, "SET_IRQS: vector %u: %s", rw->where, rw->why);
    } else if (l != NULL && !apply) {
        vn_lender_fail(l, rw->wait.token, ENODEV,
                       "SET_IRQS: the device was taken back while its routes were opened");
    }
    vn_fabric_msg_free(rw->msg);
    g_free(rw->why);
    g_free(rw);
    if (l != NULL) {
        vn_lender_wait_next(l);
    }
}

static void irq_route_opened(void *opaque, int fd, const GError *error)
{
    IrqRoute *r = opaque;
    IrqRoutesWait *rw = r->rw;

    rw->fds[r->i] = fd >= 0 ? fd : -1;
    if (fd < 0 && rw->err == 0) {
        rw->err = -fd;
        rw->where = rw->s.start + r->i;
        rw->why = g_strdup(error != NULL ? error->message : g_strerror(-fd));
    }
    if (++rw->answered == rw->s.count) {
        irq_routes_opened(rw);
    }
}

/* Open the routes of SET_IRQS @s (@msg's data) and go on with it once all have answered. */
static void routes_open(VnLender *l, const VnFabricMsg *msg, const VnProtoSetIrqs *s,
                        uint64_t token)
{
    IrqRoutesWait *rw = g_new0(IrqRoutesWait, 1);
    /* Kept here: a route may answer at once, and the last answer frees @rw. */
    g_autofree char *peer = g_strdup(l->borrower);
    g_autofree uint64_t *ids = g_memdup2(msg->data, (size_t)s->count * sizeof(uint64_t));
    uint32_t count = s->count;

    rw->msg = vn_fabric_msg_dup(msg);
    rw->s = *s;
    for (uint32_t i = 0; i < count; i++) {
        rw->fds[i] = -1;
        rw->route[i] = (IrqRoute){ .rw = rw, .i = i };
    }
    vn_lender_wait_begin(l, &rw->wait, token);
    for (uint32_t i = 0; i < count; i++) {
        vn_fabric_route_open_async(l->fab, peer, GUINT64_FROM_LE(ids[i]), irq_route_opened,
                                   &rw->route[i]);
    }
}

void vn_lender_set_irqs(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    uint32_t data, action, nroutes;
    VnProtoSetIrqs s;
    const char *why = NULL;
    int ret;

    if (!vn_proto_set_irqs_from_json(msg->json, &s, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    data = s.flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    action = s.flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    if (!one_of(data, VFIO_IRQ_SET_DATA_TYPE_MASK) ||
        !one_of(action, VFIO_IRQ_SET_ACTION_TYPE_MASK)) {
        vn_lender_fail(l, token, EINVAL, "SET_IRQS: flags 0x%x: one data type and one action",
                       s.flags);
        return;
    }
    if (s.index >= l->dev.num_irqs) {
        vn_lender_fail(l, token, EINVAL, "SET_IRQS: no interrupt index %u", s.index);
        return;
    }
    if (s.index == VFIO_PCI_REQ_IRQ_INDEX) {
        /* The host's, not the borrower's (lender.h); its borrower has its
         * own, towards QEMU. */
        vn_lender_fail(l, token, EPERM, "SET_IRQS: the device request is the lender host's");
        return;
    }
    if (s.relay) {
        ret = relay_check(l, &s, &why);
        if (ret != 0 || msg->data_len != 0) {
            vn_lender_fail(l, token, ret != 0 ? ret : EINVAL, "SET_IRQS: %s (index %u, %u+%u)",
                           why != NULL ? why : "relay carries no data", s.index, s.start, s.count);
            return;
        }
        relay_assign(l, &s, token);
        return;
    }
    /* DATA_BOOL: a byte per vector.  DATA_EVENTFD: a route id per vector
     * (u64 LE), or nothing to de-assign. */
    nroutes = data == VFIO_IRQ_SET_DATA_EVENTFD && msg->data_len > 0 ? s.count : 0;
    if (msg->data_len != (data == VFIO_IRQ_SET_DATA_BOOL ? s.count
                          : nroutes > 0                  ? (size_t)nroutes * sizeof(uint64_t)
                                                         : 0)) {
        vn_lender_fail(l, token, EINVAL, "SET_IRQS: %zu data bytes for %u vectors", msg->data_len,
                       s.count);
        return;
    }
    if (nroutes > 0 && (l->irq_mode != VN_IRQ_MODE_FD || nroutes > VN_MAX_MSG_FDS)) {
        vn_lender_fail(l, token, EINVAL, "SET_IRQS: %u routes%s", nroutes,
                       l->irq_mode != VN_IRQ_MODE_FD ? " in relay mode"
                                                     : ", more than one message carries");
        return;
    }
    if (nroutes > 0) {
        /* The routes are the borrower's daemon's to give: the loop stays free meanwhile, and
         * what the borrower sends after this waits for it (lender-queue.c). */
        routes_open(l, msg, &s, token);
        return;
    }
    irqs_apply(l, msg, &s, NULL, 0, token);
}
