/*
 * The borrowed device's BARs: each mappable region is one or more fabric
 * windows onto the lender's segments, and QEMU gets one fd for all of it.
 *
 * A BAR larger than the fabric's largest window (a GPU's memory) comes as
 * several segments, consecutive slices of one fd of the lender's (it cut
 * them to the max_window we sent with ATTACH), each through a window of
 * its own.  QEMU maps a region with one mmap, so the fabric joins the
 * windows into one fd (vn_fabric_windows_join): over shm they are slices of
 * one open file already (SCM_RIGHTS keeps it); an NTB's windows are files
 * of their own, which its module spans.  Windows that cannot be joined
 * make no mapping: that attach is refused.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include "common/peerfd.h"
#include "common/util.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

/* Registers this small (less than a page: no window holds less) may go without a window. */
#define VN_BORROWER_SMALL_BAR 4096u

/* A region's windows are joined in one call. */
G_STATIC_ASSERT(VN_PROTO_MAX_REGION_SEGMENTS <= VN_FABRIC_MAX_JOIN);

/* The window budget, for a refusal's message. */
static char *budget(VnBorrower *b)
{
    const VnFabricLimits *lim = vn_fabric_limits(b->fab);
    g_autofree char *each = vn_util_size_text(lim->max_window_size);

    return g_strdup_printf("this host's window budget: %u windows (max-windows) of at most "
                           "%s (max-window-size)",
                           lim->max_windows, each);
}

/* Whether region @i's @n windows are equal slices of the BAR's @size (the last may be
 * shorter), in order; false with @error. */
static bool region_slices(VnBorrower *b, uint32_t i, uint64_t size, GError **error)
{
    VnFabricWindow *const *w = b->windows[i];
    uint32_t n = b->nr_windows[i];
    uint64_t chunk = w[0]->size;
    const char *fault = NULL;
    uint32_t k = 0;

    /* n >= 2: every window but the last is full, the last is not empty. */
    if (chunk == 0 || chunk > size / (n - 1) || (uint64_t)(n - 1) * chunk >= size) {
        fault = "do not add up to the BAR";
    }
    while (fault == NULL && ++k < n) {
        if (w[k]->size != MIN(chunk, size - (uint64_t)k * chunk)) {
            fault = "are not equal slices";
        }
    }
    if (fault != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "borrower %s: BAR%u: its %u windows %s (window %u)", b->device, i, n, fault, k);
        return false;
    }
    return true;
}

/* Region @i's windows all came (none failed) and were joined when they are several (@joined:
 * why not, or NULL): whether they make the BAR; false with @error. */
static bool region_whole(VnBorrower *b, uint32_t i, const VnProtoRegion *pr, GError *joined,
                         GError **error)
{
    VnFabricWindow **w = b->windows[i];

    if (pr->nr_segments == 1 && w[0]->size < pr->size) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "borrower %s: BAR%u window smaller than the BAR", b->device, i);
        return false;
    }
    if (joined != NULL) {
        g_propagate_error(error, g_error_copy(joined));
        return false;
    }
    return true;
}

/* Unmap region @i's windows (those that came). */
static void region_unmap(VnBorrower *b, uint32_t i)
{
    for (uint32_t k = 0; k < b->nr_windows[i]; k++) {
        vn_fabric_window_unmap(b->fab, b->windows[i][k]);
        b->windows[i][k] = NULL;
    }
    b->nr_windows[i] = 0;
    vn_util_close_fd(&b->joined_fd[i]);
}

/* Region @i mapped: QEMU gets its fd and the areas it may map. */
static void region_mapped(VnBorrower *b, uint32_t i, const VnProtoRegion *pr)
{
    VnRegion *r = &b->info.regions[i];

    r->flags |= VFIO_REGION_INFO_FLAG_MMAP;
    r->mmap_fd = b->joined_fd[i] >= 0 ? b->joined_fd[i] : b->windows[i][0]->fd;
    r->mmap_offset = b->joined_fd[i] >= 0 ? b->joined_offset[i] : b->windows[i][0]->offset;
    r->nr_sparse = pr->nr_sparse;
    memcpy(r->sparse, pr->sparse, sizeof(pr->sparse[0]) * pr->nr_sparse);
    if (r->nr_sparse == 0) {
        r->sparse[0] = (VnSparseArea){ 0, pr->size };
        r->nr_sparse = 1;
    }
    if (b->nr_windows[i] > 1) {
        g_autofree char *size = vn_util_size_text(pr->size);

        g_info("borrower %s: BAR%u (%s) mapped through %u windows", b->device, i, size,
               b->nr_windows[i]);
    }
}

/* Largest region first: a BAR that needs several windows (a GPU's memory) must get them;
 * registers smaller than a page can do without one. */
static gint larger_first(gconstpointer x, gconstpointer y, gpointer data)
{
    const VnProtoDevice *d = data;
    uint64_t a = d->regions[*(const uint32_t *)x].size, c = d->regions[*(const uint32_t *)y].size;

    return a > c ? -1 : a < c ? 1 : (int)*(const uint32_t *)x - (int)*(const uint32_t *)y;
}

/* The BARs being mapped: every window asked at once, in order (the largest region first, so
 * it takes the budget's slots first); settled when the last answered. */
typedef struct BarsMap BarsMap;
typedef struct BarWindow {
    BarsMap *bm;
    uint32_t region, k;
} BarWindow;

struct BarsMap {
    VnBorrower *b;
    VnProtoDevice d;
    uint32_t order[VN_MAX_REGIONS], n;
    uint32_t owed; /* windows (then joins) not answered yet, and one while being asked */
    GError *failed[VN_MAX_REGIONS]; /* a region's first window that did not come, and which */
    uint32_t failed_k[VN_MAX_REGIONS];
    GError *unjoined[VN_MAX_REGIONS]; /* why a region's windows are not one fd */
    BarWindow slot[VN_MAX_REGIONS][VN_PROTO_MAX_REGION_SEGMENTS];
    VnBorrowerBarsFn done;
    void *opaque;
};

/* Every window answered: each region is whole and given to QEMU, or trapped, or the
 * device is refused. */
static void bars_settle(BarsMap *bm)
{
    VnBorrower *b = bm->b;
    GError *error = NULL;

    for (uint32_t k = 0; k < bm->n && error == NULL; k++) {
        uint32_t i = bm->order[k];
        const VnProtoRegion *pr = &bm->d.regions[i];
        g_autoptr(GError) local = g_steal_pointer(&bm->failed[i]);
        g_autofree char *limits = NULL;
        g_autofree char *size = NULL;

        if (local == NULL && region_whole(b, i, pr, bm->unjoined[i], &error)) {
            region_mapped(b, i, pr);
            continue;
        }
        region_unmap(b, i);
        if (error != NULL) {
            break;
        }
        /* A window is a page at least and, on an NTB, one of a few translations: a BAR of
         * less than a page (registers) that finds none left stays trapped, served by the
         * lender, rather than refuse the device. */
        if (pr->nr_segments == 1 && pr->size < VN_BORROWER_SMALL_BAR &&
            g_error_matches(local, G_IO_ERROR, G_IO_ERROR_NO_SPACE)) {
            g_info("borrower %s: BAR%u (%" PRIu64 " bytes) trapped: %s", b->device, i, pr->size,
                   local->message);
            continue;
        }
        limits = budget(b);
        size = vn_util_size_text(pr->size);
        if (pr->nr_segments == 1) {
            g_set_error(&error, local->domain, local->code, "borrower %s: BAR%u: %s (%s)",
                        b->device, i, local->message, limits);
        } else {
            g_set_error(&error, local->domain, local->code,
                        "borrower %s: BAR%u (%s) needs %u windows; window %u: %s (%s)", b->device,
                        i, size, pr->nr_segments, bm->failed_k[i], local->message, limits);
        }
    }
    for (uint32_t i = 0; i < VN_MAX_REGIONS; i++) {
        g_clear_error(&bm->failed[i]);
        g_clear_error(&bm->unjoined[i]);
    }
    bm->done(b, error, bm->opaque);
    g_free(bm);
}

static void bar_joined(void *opaque, int fd, uint64_t offset, const GError *error)
{
    BarWindow *bw = opaque;
    BarsMap *bm = bw->bm;
    VnBorrower *b = bm->b;
    uint32_t i = bw->region;

    if (fd >= 0) {
        b->joined_fd[i] = fd;
        b->joined_offset[i] = offset;
    } else {
        g_set_error(&bm->unjoined[i], G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "borrower %s: BAR%u: its %u windows are not one memory: %s", b->device, i,
                    b->nr_windows[i], error->message);
    }
    if (--bm->owed == 0) {
        bars_settle(bm);
    }
}

/* Every window answered: a region of several windows (a BAR larger than a window) becomes
 * one fd for QEMU, joined by the fabric (or one file already), asked without waiting;
 * settled once the last join answered. */
static void bars_join(BarsMap *bm)
{
    VnBorrower *b = bm->b;

    bm->owed = 1;
    for (uint32_t k = 0; k < bm->n; k++) {
        uint32_t i = bm->order[k];

        if (bm->failed[i] != NULL || bm->d.regions[i].nr_segments < 2 ||
            !region_slices(b, i, bm->d.regions[i].size, &bm->unjoined[i])) {
            continue;
        }
        bm->owed++;
        vn_fabric_windows_join_async(b->fab, b->windows[i], b->nr_windows[i], bar_joined,
                                     &bm->slot[i][0]);
    }
    if (--bm->owed == 0) {
        bars_settle(bm);
    }
}

static void bar_window_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    BarWindow *bw = opaque;
    BarsMap *bm = bw->bm;

    bm->b->windows[bw->region][bw->k] = w;
    if (w == NULL && bm->failed[bw->region] == NULL) {
        bm->failed[bw->region] = g_error_copy(error);
        bm->failed_k[bw->region] = bw->k;
    }
    if (--bm->owed == 0) {
        bars_join(bm);
    }
}

void vn_borrower_bars_map(VnBorrower *b, const VnProtoDevice *d, VnBorrowerBarsFn done,
                          void *opaque)
{
    BarsMap *bm = g_new0(BarsMap, 1);
    uint32_t *order = bm->order, n = 0;

    bm->b = b;
    bm->d = *d;
    bm->done = done;
    bm->opaque = opaque;
    for (uint32_t i = 0; i < d->num_regions; i++) {
        const VnProtoRegion *pr = &d->regions[i];
        VnRegion *r = &b->info.regions[i];

        r->size = pr->size;
        r->flags = pr->flags & (VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE);
        /* Config space can be read and written whatever a device server says of it, as
         * QEMU's client and Linux VFIO take it (libvfio-user reports its config region with
         * no flags at all); mediate.c decides what a write does. */
        if (i == VFIO_PCI_CONFIG_REGION_INDEX && pr->size > 0) {
            r->flags |= VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        }
        r->mmap_fd = -1;
        /* A BAR is a power of two in size (QEMU asserts it: pci_register_bar()); a device
         * server may say otherwise (libvfio-user's sample server has a BAR of 0x3000
         * bytes).  QEMU is told the next power of two; past the device's own size reads
         * are all-ones and writes go nowhere, as for a BAR nothing decodes. */
        b->bar_size[i] = 0;
        if (i < VFIO_PCI_ROM_REGION_INDEX && r->size > 0 && (r->size & (r->size - 1)) != 0 &&
            r->size <= (UINT64_C(1) << 62)) {
            b->bar_size[i] = r->size;
            r->size = UINT64_C(1) << (64 - __builtin_clzll(r->size));
            g_info("borrower %s: BAR%u of %" PRIu64 " bytes is shown as %" PRIu64
                   " (a BAR is a power of two)",
                   b->device, i, b->bar_size[i], r->size);
        }
        if (pr->nr_segments != 0 && (pr->flags & VFIO_REGION_INFO_FLAG_MMAP)) {
            order[n++] = i;
        }
    }
    bm->n = n;
    g_qsort_with_data(order, (gint)n, sizeof(order[0]), larger_first, &bm->d);
    bm->owed = 1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        const VnProtoRegion *pr = &bm->d.regions[i];

        b->nr_windows[i] = pr->nr_segments;
        for (uint32_t s = 0; s < pr->nr_segments; s++) {
            bm->slot[i][s] = (BarWindow){ .bm = bm, .region = i, .k = s };
            bm->owed++;
            vn_fabric_window_map_async(b->fab, b->lender, pr->segments[s], bar_window_mapped,
                                       &bm->slot[i][s]);
        }
    }
    if (--bm->owed == 0) {
        bars_join(bm);
    }
}

void vn_borrower_bars_unmap(VnBorrower *b)
{
    for (uint32_t i = 0; i < VN_MAX_REGIONS; i++) {
        region_unmap(b, i);
    }
}

uint8_t *vn_borrower_bar_memory(VnBorrower *b, uint32_t index, uint64_t offset, uint32_t count)
{
    VnFabricWindow *w;
    uint64_t chunk, k;

    if (index >= VN_MAX_REGIONS || b->nr_windows[index] == 0) {
        return NULL;
    }
    chunk = b->windows[index][0]->size;
    k = offset / chunk;
    if (k >= b->nr_windows[index]) {
        return NULL;
    }
    w = b->windows[index][k];
    offset -= k * chunk;
    /* A device's window is handed on, never touched here (fabric.h); an
     * access across two windows is the lender's to serve. */
    if (w->host == NULL || offset > w->size || count > w->size - offset) {
        return NULL;
    }
    return w->host + offset;
}

/* Remove [h0, h1) from a region's sparse areas (areas may split in two). */
static void carve(VnRegion *r, uint64_t h0, uint64_t h1)
{
    VnSparseArea out[VN_MAX_SPARSE_AREAS] = { { 0 } };
    uint32_t n = 0;

    for (uint32_t a = 0; a < r->nr_sparse; a++) {
        uint64_t s = r->sparse[a].offset, e = s + r->sparse[a].size;

        if (e <= h0 || s >= h1) {
            out[n++] = r->sparse[a];
            continue;
        }
        if (s < h0 && n < VN_MAX_SPARSE_AREAS) {
            out[n++] = (VnSparseArea){ s, h0 - s };
        }
        if (e > h1 && n < VN_MAX_SPARSE_AREAS) {
            out[n++] = (VnSparseArea){ h1, e - h1 };
        }
    }
    memcpy(r->sparse, out, sizeof(out[0]) * n);
    r->nr_sparse = n;
}

/* QEMU emulates the MSI-X table and PBA: leave them out of the mapped areas
 * (page-rounded, since a mapping cannot cover part of a page). */
void vn_borrower_bars_carve_msix(VnBorrower *b)
{
    long pg = sysconf(_SC_PAGESIZE);
    const VnMsixLayout *x = &b->med.msix;
    uint64_t t0, t1, p0, p1;

    if (!x->present) {
        return;
    }
    t0 = x->table_offset & ~(uint64_t)(pg - 1);
    t1 = (x->table_offset + (uint64_t)x->vectors * 16 + pg - 1) & ~(uint64_t)(pg - 1);
    p0 = x->pba_offset & ~(uint64_t)(pg - 1);
    p1 = (x->pba_offset + ((uint64_t)x->vectors + 63) / 64 * 8 + pg - 1) & ~(uint64_t)(pg - 1);
    if (x->table_bar < b->info.num_regions) {
        carve(&b->info.regions[x->table_bar], t0, t1);
    }
    if (x->pba_bar < b->info.num_regions) {
        carve(&b->info.regions[x->pba_bar], p0, p1);
    }
}
