/*
 * The borrower: a vfio-user server for a device on another node (see
 * borrower.h): its device ops and its end.  Its start is in start.c, what it asks its
 * lender in requests.c, guest memory in dma.c, config space in mediate.c.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower.h"

#include "borrower-int.h"
#include "common/json.h"
#include "common/name.h"
#include "common/util.h"
#include "fabric/host.h"
#include "trace-borrower.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <json-glib/json-glib.h>
#include <string.h>
#include <unistd.h>

/* ---- the device ops QEMU's requests reach ---- */

/* Whether an access reaches past what a BAR's device server sized (bars.c). */
static bool past_bar(VnBorrower *b, uint32_t index, uint64_t offset, uint32_t count)
{
    return index < VN_MAX_REGIONS && b->bar_size[index] != 0 && offset + count > b->bar_size[index];
}

/* A BAR read the lender's backend makes: QEMU's reply waits for its bytes, the loop does
 * not. */
static int forward_read(VnBorrower *b, uint32_t index, uint64_t offset, uint32_t count)
{
    VnProtoRegionRw rw = { .region = index, .offset = offset, .count = count, .write = false };
    g_autofree char *json = vn_proto_region_rw_to_json(b->device, &rw);

    return vn_borrower_ask_later(b, VN_PROTO_REGION_RW, json, NULL, 0, count, NULL, NULL, NULL);
}

static int op_region_read(void *opaque, uint32_t index, uint64_t offset, void *buf, uint32_t count)
{
    VnBorrower *b = opaque;
    uint8_t *mem;

    if (b->stats.lender_lost || past_bar(b, index, offset, count)) {
        /* Like a PCIe read of a device that went away: all-ones. */
        memset(buf, 0xff, count);
        return 0;
    }
    if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        return vn_mediate_read(b, offset, buf, count);
    }
    mem = vn_borrower_bar_memory(b, index, offset, count);
    if (mem != NULL) {
        /* QEMU traps a mapped BAR at times (INTx emulation): the window is
         * the same memory, so no message crosses the fabric.  A device's
         * BAR is not touched here (it may fault: fabric.h); the lender's
         * backend reads it, and a fault there is an error, not a crash. */
        memcpy(buf, mem, count);
        return 0;
    }
    b->stats.region_forwarded++;
    return forward_read(b, index, offset, count);
}

static int op_region_write(void *opaque, uint32_t index, uint64_t offset, const void *buf,
                           uint32_t count)
{
    VnBorrower *b = opaque;
    uint8_t *mem;

    if (b->stats.lender_lost || past_bar(b, index, offset, count)) {
        return 0; /* dropped, as a write to a vanished device (or past a BAR's end) is */
    }
    if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        int ret = vn_mediate_write(b, offset, buf, count);

        vn_borrower_keep_state(b, false); /* the Interrupt Line, the ROM BAR */
        return ret;
    }
    mem = vn_borrower_bar_memory(b, index, offset, count);
    if (mem != NULL) {
        memcpy(mem, buf, count);
        return 0;
    }
    b->stats.region_forwarded++;
    return vn_borrower_region_write_posted(b, index, offset, buf, count);
}

/* Give back the doorbell bits of the relayed vectors [start, start + count)
 * of @index (count 0: all). */
static void relay_unmap(VnBorrower *b, uint32_t index, uint32_t start, uint32_t count)
{
    uint32_t end = count == 0 ? VN_PROTO_RELAY_VECTORS
                              : (uint32_t)MIN((uint64_t)start + count, VN_PROTO_RELAY_VECTORS);

    for (uint32_t v = start; index < VN_BORROWER_RELAY_INDEXES && v < end; v++) {
        if (b->relay_bit[index][v] != 0) {
            uint32_t bit = b->relay_bit[index][v] - 1u;

            b->doorbell_of[bit].used = false;
            vn_fabric_doorbells_free(b->fab, bit, 1);
            b->relay_bit[index][v] = 0;
        }
    }
}

/* Withdraw the routes of [start, start + count) of @index (count 0: all). */
static void routes_drop(VnBorrower *b, uint32_t index, uint32_t start, uint32_t count)
{
    uint32_t end = count == 0 ? b->info.irq_count[index] : start + count;

    for (uint32_t v = start; b->routes[index] != NULL && v < end; v++) {
        if (b->routes[index][v] != 0) {
            vn_fabric_route_unexport(b->fab, b->routes[index][v]);
            b->routes[index][v] = 0;
        }
    }
}

/* A SET_IRQS on its way to the lender: what to undo if it refuses, what goes if not. */
typedef struct IrqSet {
    uint32_t flags, index, start, count;
    unsigned routed, rung;
    uint32_t doorbell;
    uint64_t ids[VN_MAX_MSG_FDS];
} IrqSet;

static int on_irqs_set(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    const IrqSet *set = opaque;
    bool eventfd = (set->flags & VFIO_IRQ_SET_DATA_EVENTFD) != 0;
    bool trigger = (set->flags & VFIO_IRQ_SET_ACTION_TRIGGER) != 0;
    uint32_t index = set->index, start = set->start, count = set->count;

    if (err < 0) {
        for (unsigned i = 0; i < set->routed; i++) {
            vn_fabric_route_unexport(b->fab, GUINT64_FROM_LE(set->ids[i]));
        }
        if (set->rung > 0) {
            vn_fabric_doorbells_free(b->fab, set->doorbell, set->rung);
        }
        return err;
    }
    /* The device signals the new routes or doorbells (or none) now: the
     * old ones go. */
    if (trigger && eventfd && count > 0) {
        routes_drop(b, index, start, count);
        relay_unmap(b, index, start, count);
    } else if (trigger && (set->flags & VFIO_IRQ_SET_DATA_NONE) && count == 0) {
        routes_drop(b, index, 0, 0);
        relay_unmap(b, index, 0, 0);
    }
    for (unsigned i = 0; i < set->rung; i++) {
        b->relay_bit[index][start + i] = (uint8_t)(set->doorbell + i + 1);
        b->doorbell_of[set->doorbell + i].used = true;
        b->doorbell_of[set->doorbell + i].index = (uint8_t)index;
        b->doorbell_of[set->doorbell + i].vector = (uint8_t)(start + i);
    }
    if (set->routed > 0) {
        if (b->routes[index] == NULL) {
            b->routes[index] = g_new0(uint64_t, b->info.irq_count[index]);
        }
        for (unsigned i = 0; i < set->routed; i++) {
            b->routes[index][start + i] = GUINT64_FROM_LE(set->ids[i]);
        }
    }
    if (b->mode == VN_IRQ_MODE_RELAY && eventfd) {
        vn_borrower_keep_irqs(b, index, start, count);
    }
    vn_borrower_keep_state(b, false);
    return 0;
}

/* Send the SET_IRQS @set (taken) to the lender, answering QEMU's reply @reply_id (0: the
 * command being handled's, later); @bools: DATA_BOOL's bytes. */
static int irqs_send(VnBorrower *b, IrqSet *set, const uint8_t *bools, uint64_t reply_id)
{
    VnProtoSetIrqs s = { .flags = set->flags,
                         .index = set->index,
                         .start = set->start,
                         .count = set->count,
                         .relay = set->rung > 0,
                         .doorbell = set->doorbell };
    g_autofree char *json = vn_proto_set_irqs_to_json(b->device, &s);
    const void *data = (set->flags & VFIO_IRQ_SET_DATA_BOOL) ? (const void *)bools
                       : set->routed > 0                     ? (const void *)set->ids
                                                             : NULL;
    size_t len =
        (set->flags & VFIO_IRQ_SET_DATA_BOOL) ? set->count : set->routed * sizeof(set->ids[0]);

    /* QEMU's reply waits for the lender's: the device signals the new routes from then. */
    if (reply_id != 0) {
        return vn_borrower_ask_answering(b, reply_id, VN_PROTO_SET_IRQS, json, data, len,
                                         on_irqs_set, set, g_free);
    }
    return vn_borrower_ask_later(b, VN_PROTO_SET_IRQS, json, data, len, 0, on_irqs_set, set,
                                 g_free);
}

/*
 * A SET_IRQS whose doorbell bits (relay) or routes (fd mode) are asked of the fabric first
 * (its daemon's to give, for a worker): QEMU's later commands wait (vn_server_pause) until
 * they came and the SET_IRQS went to the lender.  Relay: the VM's eventfds (dups) are set
 * in our table once the bits are ours.
 */
typedef struct IrqsAsk {
    VnBorrowerPending pending;
    IrqSet *set;
    uint64_t reply_id, pause;
    unsigned unanswered; /* routes asked and not answered, and 1 while asking */
    int err;
    int fds[VN_MAX_MSG_FDS]; /* relay: the VM's eventfds, ours until set */
    unsigned nfds;
} IrqsAsk;

/* One route asked: where its id goes. */
typedef struct BorrowerRoute {
    IrqsAsk *q;
    unsigned i;
} BorrowerRoute;

/* Everything asked came (or the borrower went): the SET_IRQS goes, or QEMU hears why not. */
static void irqs_asked(IrqsAsk *q)
{
    VnBorrower *b = vn_borrower_pending_end(&q->pending);
    bool here = b != NULL && b->server != NULL && vn_server_resume(b->server, q->pause);
    IrqSet *set = q->set;
    int err = q->err;

    if (here && err == 0 && set->rung > 0) {
        err = vn_irqs_set(vn_server_irqs(b->server), set->flags, set->index, set->start, set->count,
                          NULL, q->fds, q->nfds);
    }
    if (!here || err < 0) {
        for (unsigned i = 0; i < set->routed; i++) {
            vn_fabric_route_unexport(q->pending.fab, GUINT64_FROM_LE(set->ids[i]));
        }
        if (set->rung > 0) {
            vn_fabric_doorbells_free(q->pending.fab, set->doorbell, set->rung);
        }
        if (here) {
            vn_server_complete(b->server, q->reply_id, err);
        }
        g_free(set);
    } else {
        irqs_send(b, set, NULL, q->reply_id);
    }
    vn_util_close_fds(q->fds, q->nfds); /* those vn_irqs_set did not take */
    g_free(q);
}

static void irqs_bits(void *opaque, int first, const GError *error)
{
    IrqsAsk *q = opaque;

    if (first < 0) {
        if (q->pending.b != NULL) {
            g_info("borrower %s: cannot relay %u vectors: %s", q->pending.b->device, q->set->count,
                   error->message);
        }
        q->err = -ENOSPC;
    } else {
        q->set->doorbell = (uint32_t)first;
        q->set->rung = q->set->count;
    }
    irqs_asked(q);
}

static void irqs_route(void *opaque, uint64_t id, const GError *error)
{
    BorrowerRoute *r = opaque;
    IrqsAsk *q = r->q;

    if (id == 0 && q->err == 0) {
        if (q->pending.b != NULL) {
            g_info("borrower %s: %s", q->pending.b->device, error->message);
        }
        q->err = g_error_matches(error, G_IO_ERROR, G_IO_ERROR_NO_SPACE) ? -ENOSPC : -EINVAL;
    }
    q->set->ids[r->i] = GUINT64_TO_LE(id);
    g_free(r);
    if (--q->unanswered == 0) {
        /* Every answer in: the ones that came before a refusal are withdrawn with it. */
        q->set->routed = q->set->count;
        irqs_asked(q);
    }
}

static IrqsAsk *irqs_ask_new(VnBorrower *b, IrqSet *set)
{
    IrqsAsk *q = g_new0(IrqsAsk, 1);

    q->set = set;
    q->reply_id = vn_server_later(b->server);
    q->pause = vn_server_pause(b->server);
    vn_borrower_pending_begin(b, &q->pending);
    return q;
}

static int op_set_irqs(void *opaque, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                       const uint8_t *bools, int *fds, unsigned nfds)
{
    VnBorrower *b = opaque;
    bool eventfd = (flags & VFIO_IRQ_SET_DATA_EVENTFD) != 0;
    IrqSet *set;
    IrqsAsk *q;
    int ret;

    if (index >= b->info.num_irqs || (uint64_t)start + count > b->info.irq_count[index]) {
        return -EINVAL;
    }
    if (index == VFIO_PCI_REQ_IRQ_INDEX) {
        /* Ours, not the device's: see vn_borrower_request_unplug(). */
        ret = vn_irqs_set(vn_server_irqs(b->server), flags, index, start, count, bools, fds, nfds);
        if (ret == 0) {
            vn_borrower_keep_irqs(b, index, start, count);
        }
        return ret;
    }
    if (b->mode == VN_IRQ_MODE_RELAY && eventfd && nfds > 0) {
        if (index >= VN_BORROWER_RELAY_INDEXES) {
            return -ENOTSUP;
        }
        if ((uint64_t)start + count > VN_PROTO_RELAY_VECTORS || nfds > VN_MAX_MSG_FDS) {
            return -ENOSPC;
        }
    } else if (b->mode == VN_IRQ_MODE_RELAY && eventfd) {
        vn_irqs_set(vn_server_irqs(b->server), flags, index, start, count, NULL, NULL, 0);
    } else if (eventfd && nfds > 0 && (nfds != count || nfds > VN_MAX_MSG_FDS)) {
        return -EINVAL;
    }
    set = g_new0(IrqSet, 1);
    *set = (IrqSet){ .flags = flags, .index = index, .start = start, .count = count };
    if (b->mode == VN_IRQ_MODE_RELAY && eventfd && nfds > 0) {
        /* One doorbell bit of this host per vector, for the lender to ring; the VM's
         * eventfds are kept here once they are ours, the lender's device gets its own. */
        q = irqs_ask_new(b, set);
        for (unsigned i = 0; i < nfds; i++) {
            q->fds[q->nfds] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
            q->nfds += q->fds[q->nfds] >= 0;
        }
        q->err = q->nfds == nfds ? 0 : -EMFILE;
        if (q->err < 0) {
            irqs_asked(q);
            return 0;
        }
        vn_fabric_doorbells_alloc_async(b->fab, count, irqs_bits, q);
        return 0;
    }
    if (eventfd && nfds > 0) {
        /* fd mode: each of the VM's eventfds becomes an interrupt route of ours that the
         * lender's device signals; their ids (LE) go with the SET_IRQS. */
        q = irqs_ask_new(b, set);
        q->unanswered = 1;
        for (unsigned i = 0; i < nfds; i++) {
            BorrowerRoute *r = g_new0(BorrowerRoute, 1);

            *r = (BorrowerRoute){ .q = q, .i = i };
            q->unanswered++;
            vn_fabric_route_export_async(b->fab, fds[i], b->lender, irqs_route, r);
        }
        if (--q->unanswered == 0) {
            q->set->routed = q->set->count;
            irqs_asked(q);
        }
        return 0;
    }
    return irqs_send(b, set, bools, 0);
}

static int op_reset(void *opaque)
{
    VnBorrower *b = opaque;
    g_autofree char *json = vn_proto_device_only_to_json(b->device);

    /* Answered when the lender has reset it (a client going: waited for). */
    return vn_borrower_ask_later(b, VN_PROTO_RESET, json, NULL, 0, 0, NULL, NULL, NULL);
}

static int op_dma_mapped(void *opaque, const VnDmaMapping *m)
{
    return vn_borrower_dma_mapped(opaque, m);
}

static void op_dma_unmapping(void *opaque, uint64_t iova, uint64_t size, bool all)
{
    vn_borrower_dma_unmapping(opaque, iova, size, all);
}

static void op_client_leaving(void *opaque)
{
    ((VnBorrower *)opaque)->client_leaving = true;
}

static void op_client_gone(void *opaque)
{
    VnBorrower *b = opaque;

    /* The VM went (or unplugged the device): the server already unmapped
     * its DMA and reset the device; make sure no interrupt stays wired to
     * eventfds nobody reads. */
    for (uint32_t i = 0; i < b->info.num_irqs; i++) {
        VnProtoSetIrqs s = { .flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                             .index = i };
        g_autofree char *json = NULL;

        if (b->info.irq_count[i] == 0 || i == VFIO_PCI_REQ_IRQ_INDEX) {
            continue;
        }
        json = vn_proto_set_irqs_to_json(b->device, &s);
        vn_borrower_ask_later(b, VN_PROTO_SET_IRQS, json, NULL, 0, 0, NULL, NULL, NULL);
        routes_drop(b, i, 0, 0);
        relay_unmap(b, i, 0, 0);
    }
    /* (the server drops the VM's eventfds itself) */
    b->client_leaving = false;
    vn_borrower_keep_client_gone(b);
    g_info("borrower %s: QEMU disconnected; device quiesced", b->device);
}

static void op_client_new(void *opaque)
{
    vn_borrower_keep_sockets(opaque);
}

const VnDeviceOps vn_borrower_ops = {
    .region_read = op_region_read,
    .region_write = op_region_write,
    .dma_mapped = op_dma_mapped,
    .dma_unmapping = op_dma_unmapping,
    .set_irqs = op_set_irqs,
    .reset = op_reset,
    .client_new = op_client_new,
    .client_leaving = op_client_leaving,
    .client_gone = op_client_gone,
};

/* ---- setup ---- */

/* What QEMU is told of the device, besides its regions (bars.c). */
void vn_borrower_describe(VnBorrower *b, const VnProtoDevice *d)
{
    b->info.flags = d->flags;
    b->info.num_regions = d->num_regions;
    b->info.num_irqs = d->num_irqs;
    memcpy(b->info.irq_count, d->irq_count, sizeof(d->irq_count));
    memcpy(b->info.irq_flags, d->irq_flags, sizeof(d->irq_flags));
    /* The device-request interrupt belongs to the borrower whatever the device
     * has: it is how we ask QEMU to give the device back (revoke, lender
     * lost).  A QEMU that supports it (vfio-user-pci with x-req, see
     * qemu-patches/) registers an eventfd for it; stock QEMU does not. */
    b->info.num_irqs = MAX(b->info.num_irqs, VFIO_PCI_REQ_IRQ_INDEX + 1);
    b->info.irq_count[VFIO_PCI_REQ_IRQ_INDEX] = 1;
    b->info.irq_flags[VFIO_PCI_REQ_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
}

VnBorrower *vn_borrower_alloc(VnFabric *fab, const char *lender, const char *device, VnIrqMode mode)
{
    VnBorrower *b = g_new0(VnBorrower, 1);

    b->fab = fab;
    b->lender = g_strdup(lender);
    b->device = g_strdup(device);
    b->posted = g_new0(VnBorrowerPosted, 1);
    b->posted->refs = 1;
    g_snprintf(b->posted->device, sizeof(b->posted->device), "%s/%s", lender, device);
    for (uint32_t i = 0; i < VN_MAX_REGIONS; i++) {
        b->joined_fd[i] = -1;
    }
    /* fd mode needs the fabric to carry interrupt routes; without them
     * the lender relays interrupts as doorbells. */
    if (mode == VN_IRQ_MODE_FD && !(vn_fabric_caps(fab) & VN_FABRIC_CAP_DIRECT_ROUTES)) {
        g_info("borrower %s: the fabric carries no interrupt routes; interrupts are relayed",
               device);
        mode = VN_IRQ_MODE_RELAY;
    }
    b->mode = mode;
    b->linger_ms = VN_BORROWER_LINGER_MS;
    b->linger_max = VN_BORROWER_MAX_LINGERING;
    vn_borrower_p2p_start(b);
    return b;
}

static void on_detached(void *opaque, VnFabricMsg *reply, int err)
{
    /* Whatever the answer: we are gone. */
}

void vn_borrower_free(VnBorrower *b)
{
    if (b == NULL) {
        return;
    }
    /* A worker that ends on purpose leaves nothing to take over: QEMU sees its socket
     * close when we close it, not when the daemon does. */
    vn_host_on_greeted(b->fab, NULL, NULL);
    vn_borrower_p2p_stop(b);
    if (b->server != NULL) {
        vn_host_forget(b->fab, 0, UINT64_MAX);
    }
    g_clear_pointer(&b->server, vn_server_free);
    g_clear_pointer(&b->kept, g_bytes_unref);
    vn_borrower_posted_flush(b); /* QEMU was told they were done: before the DETACH */
    if (b->attached && !b->stats.lender_lost) {
        g_autofree char *json = vn_proto_device_only_to_json(b->device);

        /* Sent, not waited for: the lender fences the device when it reads
         * it, and our daemon, stopping us, relays it only once we are gone
         * (its loop waits for us meanwhile). */
        vn_fabric_request(b->fab, b->lender, VN_PROTO_DETACH, json, NULL, 0, on_detached, NULL);
    }
    vn_borrower_bars_unmap(b);
    vn_borrower_asks_orphan(b);
    vn_borrower_pending_orphan(b);
    vn_borrower_dma_forget(b);
    for (uint32_t i = 0; i < VN_MAX_IRQ_INDEXES; i++) {
        if (i < b->info.num_irqs) {
            routes_drop(b, i, 0, 0);
            relay_unmap(b, i, 0, 0);
        }
        g_free(b->routes[i]);
    }
    vn_borrower_posted_release(b->posted); /* answers still on their way keep it */
    g_free(b->lender);
    g_free(b->device);
    g_free(b);
}

const char *vn_borrower_lender(VnBorrower *b)
{
    return b->lender;
}

const char *vn_borrower_device(VnBorrower *b)
{
    return b->device;
}

void vn_borrower_doorbell(VnBorrower *b, uint32_t bit)
{
    if (b->mode != VN_IRQ_MODE_RELAY || b->server == NULL) {
        return;
    }
    /* A bit we did not hand out for a vector is the lender's mistake. */
    if (bit >= VN_FABRIC_MAX_DOORBELLS || !b->doorbell_of[bit].used) {
        trace_borrower_doorbell_unknown(b->device, bit);
        return;
    }
    vn_irqs_signal(vn_server_irqs(b->server), b->doorbell_of[bit].index,
                   b->doorbell_of[bit].vector);
    b->stats.relayed_irqs++;
}

bool vn_borrower_can_request_unplug(VnBorrower *b)
{
    return vn_server_has_client(b->server) &&
           vn_irqs_enabled(vn_server_irqs(b->server), VFIO_PCI_REQ_IRQ_INDEX, 0);
}

bool vn_borrower_request_unplug(VnBorrower *b)
{
    if (!vn_borrower_can_request_unplug(b) ||
        !vn_irqs_signal(vn_server_irqs(b->server), VFIO_PCI_REQ_IRQ_INDEX, 0)) {
        return false;
    }
    b->stats.unplug_requests++;
    g_message("borrower %s: asked QEMU to unplug the device (device request)", b->device);
    return true;
}

void vn_borrower_lender_down(VnBorrower *b)
{
    if (b->stats.lender_lost) {
        return;
    }
    b->stats.lender_lost = true;
    g_warning("borrower %s: lender %s lost: reads now return all-ones, writes are dropped",
              b->device, b->lender);
    /* Stock QEMU keeps the dead device (the guest's driver gives up on it);
     * one that takes device requests unplugs it. */
    vn_borrower_request_unplug(b);
}

bool vn_borrower_lender_up(VnBorrower *b)
{
    if (!b->stats.lender_lost) {
        return true;
    }
    if (b->stats.unmaps_missed > 0) {
        g_warning("borrower %s: lender %s is back, but %" G_GUINT64_FORMAT
                  " DMA unmaps did not reach it while it was away: the device stays dead "
                  "(detach it)",
                  b->device, b->lender, b->stats.unmaps_missed);
        return false;
    }
    b->stats.lender_lost = false;
    b->stats.lender_returns++;
    vn_borrower_dma_lender_back(b);
    g_message("borrower %s: lender %s is back: the device is served again", b->device, b->lender);
    return true;
}

void vn_borrower_stats(VnBorrower *b, VnBorrowerStats *out)
{
    *out = b->stats;
    out->posted_writes = b->posted->writes;
    out->posted_write_failures = b->posted->failures;
    out->dma_lingering = b->lingering.length;
}

char *vn_borrower_stats_json(VnBorrower *b)
{
    g_autoptr(JsonBuilder) jb = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *server = b->server ? vn_server_stats_json(b->server) : NULL;
    /* Our own server's counters: a few hundred bytes. */
    g_autoptr(JsonNode) vu = vn_json_parse(server, -1, VN_MAX_MSG_SIZE, NULL);
    const struct {
        const char *name;
        uint64_t v;
    } c[] = {
        { "region_forwarded", b->stats.region_forwarded },
        { "config_forwarded", b->stats.config_forwarded },
        { "config_virtualized", b->stats.config_virtualized },
        { "relayed_irqs", b->stats.relayed_irqs },
        { "unmaps_missed", b->stats.unmaps_missed },
        { "dma_maps_refused", b->stats.dma_maps_refused },
        { "lender_returns", b->stats.lender_returns },
        { "p2p_targets", b->stats.p2p_targets },
        { "p2p_refused", b->stats.p2p_refused },
        { "fabric_requests", b->stats.fabric_requests },
        { "dma_maps", b->stats.dma_maps },
        { "dma_unmaps", b->stats.dma_unmaps },
        { "dma_maps_here", b->stats.dma_maps_here },
        { "dma_unmaps_here", b->stats.dma_unmaps_here },
        { "dma_lingering", b->lingering.length },
        { "unplug_requests", b->stats.unplug_requests },
        { "posted_writes", b->posted->writes },
        { "posted_write_failures", b->posted->failures },
    };

    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "device");
    json_builder_add_string_value(jb, b->device);
    json_builder_set_member_name(jb, "lender");
    json_builder_add_string_value(jb, b->lender);
    json_builder_set_member_name(jb, "irq_mode");
    json_builder_add_string_value(jb, vn_irq_mode_to_string(b->mode));
    json_builder_set_member_name(jb, "lender_lost");
    json_builder_add_boolean_value(jb, b->stats.lender_lost);
    json_builder_set_member_name(jb, "client_connected");
    json_builder_add_boolean_value(jb, vn_server_has_client(b->server));
    json_builder_set_member_name(jb, "unplug_request_supported");
    json_builder_add_boolean_value(jb, vn_borrower_can_request_unplug(b));
    for (size_t i = 0; i < G_N_ELEMENTS(c); i++) {
        json_builder_set_member_name(jb, c[i].name);
        json_builder_add_int_value(jb, (gint64)c[i].v);
    }
    if (vu != NULL) {
        json_builder_set_member_name(jb, "vfio_user");
        json_builder_add_value(jb, g_steal_pointer(&vu));
    }
    json_builder_end_object(jb);
    root = json_builder_get_root(jb);
    return json_to_string(root, FALSE);
}
