/*
 * Peer-to-peer targets, the borrower worker's part (borrower-int.h; docs/p2p.md).
 *
 * Two facts go to the daemon, which alone knows the VM's other devices: where the guest put
 * this device's mapped BARs (from the config writes mediate.c sees: the BAR registers and
 * Memory Space Enable), and which ranges QEMU mapped for this device without memory (a
 * DMA_MAP without fd: QEMU's offer of another device's BAR, as vfio-user.rst allows).  The
 * daemon answers an offer that is another device's BAR with a target: that device's lender's
 * segments, shared with our lender, which our lender then maps for our device at the offer's
 * IOVA (a DMA_MAP naming the segments' node).  The device's DMA then goes from its lender to
 * the other device's lender, never through this host.
 *
 * A target's mapping is not kept for a worker that takes over (its daemon says the targets
 * again when the new worker says its offers: QEMU's maps are in the kept state's rows only
 * for guest memory; see the closing note of issue 32).
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include "fabric/host.h"
#include "trace-borrower.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <linux/pci_regs.h>
#include <string.h>

G_STATIC_ASSERT(VN_PROTO_MAX_REGION_SEGMENTS == VN_HOST_BAR_SEGMENTS);

/* ---- where the guest put our BARs ---------------------------------------- */

/* BAR @i's guest-physical address as the guest wrote it (0: none), from the shadow of the
 * BAR registers: its size's alignment, a 64-bit BAR's upper half from the next register. */
static uint64_t bar_address(const VnMediate *m, uint32_t i, uint64_t size)
{
    uint64_t a = m->bar[i] & PCI_BASE_ADDRESS_MEM_MASK;

    if ((m->bar_type[i] & PCI_BASE_ADDRESS_MEM_TYPE_MASK) == PCI_BASE_ADDRESS_MEM_TYPE_64 &&
        i + 1 < PCI_STD_NUM_BARS) {
        a |= (uint64_t)m->bar[i + 1] << 32;
    }
    return a & ~(size - 1);
}

/* Our mapped BARs where the guest decodes them now, into @bars; how many. */
static unsigned placed(VnBorrower *b, VnHostBar *bars)
{
    unsigned n = 0;

    if (!(b->med.command & PCI_COMMAND_MEMORY)) {
        return 0;
    }
    for (uint32_t i = 0; i < PCI_STD_NUM_BARS && n < VN_HOST_MAX_BARS; i++) {
        uint64_t size = b->info.num_regions > i ? b->info.regions[i].size : 0;
        uint64_t gpa;

        if (b->nr_windows[i] == 0 || size == 0 || (size & (size - 1)) != 0 ||
            (b->med.bar_type[i] & PCI_BASE_ADDRESS_SPACE_IO)) {
            continue;
        }
        gpa = bar_address(&b->med, i, size);
        if (gpa == 0 || gpa + (size - 1) < gpa) {
            continue; /* not placed, or a sizing pattern */
        }
        bars[n] = (VnHostBar){ .gpa = gpa,
                               .size = b->bar_size[i] != 0 ? b->bar_size[i] : size,
                               .chunk = b->windows[i][0]->size,
                               .region = i,
                               .nr_segments = b->nr_windows[i] };
        for (uint32_t k = 0; k < b->nr_windows[i]; k++) {
            bars[n].segments[k] = b->windows[i][k]->segment;
        }
        /* The BAR as the lender cut it: at most its windows' bytes. */
        bars[n].size = MIN(bars[n].size, (uint64_t)bars[n].nr_segments * bars[n].chunk);
        n++;
    }
    return n;
}

void vn_borrower_p2p_place(VnBorrower *b, bool again)
{
    VnHostBar bars[VN_HOST_MAX_BARS];
    unsigned n = placed(b, bars);

    if (!again && n == b->p2p_nplaced && memcmp(bars, b->p2p_placed, n * sizeof(bars[0])) == 0) {
        return;
    }
    memcpy(b->p2p_placed, bars, n * sizeof(bars[0]));
    b->p2p_nplaced = n;
    for (unsigned k = 0; k < n; k++) {
        trace_borrower_bar_placed(b->device, bars[k].region, bars[k].gpa, bars[k].size);
    }
    vn_host_p2p_place(b->fab, bars, n);
}

/* ---- what QEMU offers, and the targets the daemon finds ------------------- */

typedef struct Offer {
    uint64_t iova, size;
} Offer;

void vn_borrower_p2p_offer(VnBorrower *b, uint64_t iova, uint64_t size)
{
    Offer o = { .iova = iova, .size = size };

    if (b->p2p_offers == NULL || size == 0 || b->p2p_offers->len >= VN_BORROWER_MAX_OFFERS) {
        return; /* the daemon would not look at more either */
    }
    g_array_append_val(b->p2p_offers, o);
    vn_host_p2p_offer(b->fab, iova, size, false);
}

/* A P2P mapping at the lender, QEMU's DMA_UNMAP or the daemon's GONE takes back: what the
 * daemon said of it (for a per-segment map's answer, that segment's part only). */
typedef struct Target {
    uint64_t iova, size;
    char peer[VN_MAX_NODE_NAME + 1];
    VnHostP2pTarget t;
} Target;

static bool inside(uint64_t iova, uint64_t size, uint64_t first, uint64_t len)
{
    return iova >= first && iova - first < len && size <= len - (iova - first);
}

static int on_target_mapped(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    const Target *t = opaque;
    g_autofree char *why = reply != NULL && err < 0 ? vn_fabric_error_message(reply) : NULL;

    if (err < 0) {
        b->stats.p2p_refused++;
        g_info("borrower %s: our lender did not map [0x%" PRIx64 ", +0x%" PRIx64
               ") onto %s's memory: %s",
               b->device, t->iova, t->size, t->peer, why != NULL ? why : g_strerror(-err));
    }
    return 0;
}

/* The daemon's target @t for [@iova, +@size): a DMA_MAP per segment it spans, naming
 * @peer, nobody waiting (QEMU was answered when it offered). */
static void target_map(VnBorrower *b, uint64_t iova, uint64_t size, const char *peer,
                       const VnHostP2pTarget *t)
{
    uint64_t done = 0, offset = t->offset;
    bool offered = false;

    for (guint i = 0; i < b->p2p_offers->len && !offered; i++) {
        const Offer *o = &g_array_index(b->p2p_offers, Offer, i);

        offered = o->iova == iova && o->size == size;
    }
    if (!offered) {
        return; /* QEMU unmapped it meanwhile */
    }
    for (uint32_t k = 0; k < t->nr_segments && done < size; k++) {
        uint64_t len = MIN(t->chunk - offset, size - done);
        VnProtoDmaMap pm = { .iova = iova + done,
                             .size = len,
                             .segment = t->segments[k],
                             .offset = offset,
                             .prot = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE };
        g_autofree char *json = NULL;
        Target *tg = g_new0(Target, 1);

        g_strlcpy(pm.peer, peer, sizeof(pm.peer));
        json = vn_proto_dma_map_to_json(b->device, &pm);
        *tg = (Target){ .iova = pm.iova, .size = len };
        g_strlcpy(tg->peer, peer, sizeof(tg->peer));
        trace_borrower_p2p_map(b->device, pm.iova, len, peer, pm.segment, offset);
        vn_borrower_ask_posted(b, VN_PROTO_DMA_MAP, json, on_target_mapped, tg, g_free);
        done += len;
        offset = 0;
    }
    b->stats.p2p_targets++;
    g_array_append_val(b->p2p_targets, ((Target){ .iova = iova, .size = size, .t = *t }));
    g_strlcpy(g_array_index(b->p2p_targets, Target, b->p2p_targets->len - 1).peer, peer,
              VN_MAX_NODE_NAME + 1);
}

/* Whether [@iova, +@size) is mapped onto @peer's @t already (the daemon says its targets
 * again after a restart: a mapping in use stays, no gap in the device's reach). */
static bool target_same(VnBorrower *b, uint64_t iova, uint64_t size, const char *peer,
                        const VnHostP2pTarget *t)
{
    for (guint i = 0; i < b->p2p_targets->len; i++) {
        const Target *x = &g_array_index(b->p2p_targets, Target, i);

        if (x->iova == iova && x->size == size && strcmp(x->peer, peer) == 0 &&
            memcmp(&x->t, t, sizeof(*t)) == 0) {
            return true;
        }
    }
    return false;
}

static int on_target_unmapped(VnBorrower *b, const VnFabricMsg *reply, int err, void *opaque)
{
    return 0; /* the lender gone or refusing: nothing more to undo */
}

/* Targets inside [@iova, +@size) (@all: every one) are forgotten here; with @tell, each is
 * unmapped at the lender too, nobody waiting.  Whether any was. */
static bool targets_drop(VnBorrower *b, uint64_t iova, uint64_t size, bool all, bool tell)
{
    bool any = false;

    for (guint i = b->p2p_targets->len; i-- > 0;) {
        const Target *t = &g_array_index(b->p2p_targets, Target, i);

        if (all || inside(t->iova, t->size, iova, size)) {
            trace_borrower_p2p_unmap(b->device, t->iova, t->size);
            if (tell) {
                VnProtoDmaUnmap u = { .iova = t->iova, .size = t->size };
                g_autofree char *json = vn_proto_dma_unmap_to_json(b->device, &u);

                vn_borrower_ask_posted(b, VN_PROTO_DMA_UNMAP, json, on_target_unmapped, NULL, NULL);
            }
            g_array_remove_index_fast(b->p2p_targets, i);
            any = true;
        }
    }
    return any;
}

bool vn_borrower_p2p_unmapping(VnBorrower *b, uint64_t iova, uint64_t size, bool all)
{
    bool offered = false;

    if (b->p2p_offers == NULL) {
        return false; /* stopped: the borrower goes */
    }
    for (guint i = b->p2p_offers->len; i-- > 0;) {
        const Offer *o = &g_array_index(b->p2p_offers, Offer, i);

        if (all || inside(o->iova, o->size, iova, size)) {
            g_array_remove_index_fast(b->p2p_offers, i);
            offered = true;
        }
    }
    if (offered) {
        vn_host_p2p_offer(b->fab, all ? 0 : iova, all ? UINT64_MAX : size, true);
    }
    /* dma.c unmaps the whole range at the lender, QEMU waiting for it. */
    return targets_drop(b, iova, size, all, false);
}

/* The daemon's word (fabric/host.h: VnHostP2pFn). */
static void on_p2p(void *opaque, uint64_t iova, uint64_t size, const char *peer,
                   const VnHostP2pTarget *t)
{
    VnBorrower *b = opaque;

    if (t != NULL && target_same(b, iova, size, peer, t)) {
        return;
    }
    /* Another target there (the BAR moved, another device's now): the old one goes first. */
    targets_drop(b, iova, size, false, true);
    if (t != NULL && b->attached && !b->stats.lender_lost) {
        target_map(b, iova, size, peer, t);
    }
}

void vn_borrower_p2p_start(VnBorrower *b)
{
    b->p2p_offers = g_array_new(FALSE, FALSE, sizeof(Offer));
    b->p2p_targets = g_array_new(FALSE, FALSE, sizeof(Target));
    vn_host_on_p2p(b->fab, on_p2p, b);
}

void vn_borrower_p2p_again(VnBorrower *b)
{
    if (b->p2p_offers == NULL) {
        return;
    }
    vn_borrower_p2p_place(b, true);
    for (guint i = 0; i < b->p2p_offers->len; i++) {
        const Offer *o = &g_array_index(b->p2p_offers, Offer, i);

        vn_host_p2p_offer(b->fab, o->iova, o->size, false);
    }
}

void vn_borrower_p2p_stop(VnBorrower *b)
{
    vn_host_on_p2p(b->fab, NULL, NULL);
    g_clear_pointer(&b->p2p_offers, g_array_unref);
    g_clear_pointer(&b->p2p_targets, g_array_unref);
}
