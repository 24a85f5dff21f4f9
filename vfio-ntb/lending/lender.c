/*
 * The lender of one device (see lender.h): attach, fence, the dispatch of
 * lending-protocol requests, forwarded region accesses and DMA mappings of
 * the borrower's segments.  Interrupts are in lender-irq.c, the device server's watch
 * in lender-server.c, the counters and stalls in lender-stats.c.
 *
 * The device is driven through its backend's ops (backend.h), the borrower's
 * memory mapped for it through its IOMMU's (VnBackendIommuOps).  Every request is
 * answered before the next one is looked at (lender-queue.c keeps them in order while
 * one waits on the fabric), so the device sees the borrower's requests in the order the
 * borrower sent them.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lender-int.h"

#include "common/name.h"
#include "common/util.h"
#include "trace-lending.h"

#include <errno.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <linux/pci_regs.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------- */

static void handle_request(VnLender *l, VnFabricMsg *msg, uint64_t token);

static const VnLenderUp lender_up = {
    .handle = handle_request,
    .fence = vn_lender_fence,
    .drop_device = vn_lender_drop_device,
};

/* The errno behind a GError of ours or of the layers below (they build
 * G_IO_ERRORs with g_io_error_from_errno()). */
static int errno_of(const GError *error)
{
    if (error == NULL || error->domain != G_IO_ERROR) {
        return EIO;
    }
    switch (error->code) {
    case G_IO_ERROR_NOT_FOUND:
        return ENOENT;
    case G_IO_ERROR_PERMISSION_DENIED:
        return EACCES;
    case G_IO_ERROR_NO_SPACE:
        return ENOSPC;
    case G_IO_ERROR_INVALID_ARGUMENT:
        return EINVAL;
    case G_IO_ERROR_CONNECTION_REFUSED:
        return ECONNREFUSED;
    case G_IO_ERROR_TIMED_OUT:
        return ETIMEDOUT;
    case G_IO_ERROR_BUSY:
        return EBUSY;
    case G_IO_ERROR_NOT_SUPPORTED:
        return ENOTSUP;
    case G_IO_ERROR_INVALID_DATA:
        return EPROTO;
    case G_IO_ERROR_CANCELLED:
        return ECANCELED;
    case G_IO_ERROR_CONNECTION_CLOSED:
        return ECONNRESET;
    case G_IO_ERROR_NOT_CONNECTED:
        return ENOTCONN;
    default:
        return EIO;
    }
}

static void reply_ok(VnLender *l, uint64_t token)
{
    vn_fabric_reply(l->fab, token, "{}", NULL, 0);
}

/* ---- life -------------------------------------------------------------- */

VnLender *vn_lender_new(VnFabric *fab, const char *name, const VnBackendOps *ops, const char *where,
                        GError **error)
{
    g_autofree char *json = NULL;
    char checked[VN_MAX_DEVICE_NAME + 1];
    VnLender *l;

    if (fab == NULL || name == NULL || where == NULL || where[0] == '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "lender: a fabric, a device name and the device's place are needed");
        return NULL;
    }
    if (!vn_backend_ops_valid(ops, error)) {
        return NULL;
    }
    /* The one place the name rules live is the protocol's decoder. */
    json = vn_proto_device_only_to_json(name);
    if (!vn_proto_device_name(json, checked, NULL) || strcmp(checked, name) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "lender: \"%s\" is not a device name (1-%d of [A-Za-z0-9_.-])", name,
                    VN_MAX_DEVICE_NAME);
        return NULL;
    }
    l = g_new0(VnLender, 1);
    l->fab = fab;
    l->ctx = vn_fabric_backend_context(fab);
    l->name = g_strdup(name);
    l->ops = ops;
    l->where = g_strdup(where);
    l->windows = g_ptr_array_new();
    l->maps = g_array_new(FALSE, FALSE, sizeof(VnLenderMap));
    g_queue_init(&l->queued);
    l->up = &lender_up;
    l->request_fd = -1;
    vn_lender_server_start(l);
    return l;
}

void vn_lender_on_device_request(VnLender *l, VnLenderRequestFn fn, void *opaque)
{
    l->on_request = fn;
    l->on_request_opaque = opaque;
}

const char *vn_lender_name(VnLender *l)
{
    return l->name;
}

const char *vn_lender_borrower(VnLender *l)
{
    return l->borrower;
}

/* ---- windows and DMA mappings ------------------------------------------ */

static VnLenderWindow *window_find(VnLender *l, const char *peer, uint64_t segment)
{
    for (guint i = 0; i < l->windows->len; i++) {
        VnLenderWindow *lw = l->windows->pdata[i];

        if (lw->w->segment == segment && strcmp(lw->w->peer, peer) == 0) {
            return lw;
        }
    }
    return NULL;
}

static void window_release(VnLender *l, VnLenderWindow *lw)
{
    g_ptr_array_remove_fast(l->windows, lw);
    vn_fabric_window_unmap(l->fab, lw->w);
    g_free(lw);
}

/* Drop a reference; the window goes with its last mapping. */
static void window_unref(VnLender *l, VnLenderWindow *lw)
{
    if (--lw->refs == 0) {
        window_release(l, lw);
    }
}

static void windows_release_all(VnLender *l)
{
    while (l->windows->len > 0) {
        window_release(l, l->windows->pdata[l->windows->len - 1]);
    }
}

/* Map @m onto window @lw (the borrower's segment, ours now) for the device, and answer. */
static void dma_map_onto(VnLender *l, VnLenderWindow *lw, const VnProtoDmaMap *m, uint64_t token)
{
    VnLenderMap map;
    int ret;

    if (!vn_util_range_ok(m->offset, m->size, lw->w->size)) {
        vn_lender_fail(l, token, EINVAL,
                       "DMA_MAP: [0x%" PRIx64 ", +0x%" PRIx64 ") lies outside segment %" PRIu64
                       " (0x%" PRIx64 " bytes)",
                       m->offset, m->size, m->segment, lw->w->size);
        goto unused;
    }
    ret = l->iommu_ops->dma_map(l->iommu, m->iova, m->size, lw->w->fd, lw->w->offset + m->offset,
                                m->prot);
    if (ret < 0) {
        const char *why =
            l->iommu_ops->last_error != NULL ? l->iommu_ops->last_error(l->iommu) : NULL;

        vn_lender_fail(l, token, ret, "DMA_MAP of iova 0x%" PRIx64 " failed on the device: %s",
                       m->iova, why != NULL ? why : g_strerror(-ret));
        goto unused;
    }
    lw->refs++;
    map = (VnLenderMap){ .iova = m->iova, .size = m->size, .window = lw };
    g_array_append_val(l->maps, map);
    l->stats.dma_maps++;
    if (strcmp(lw->w->peer, l->borrower) != 0) {
        l->stats.p2p_maps++;
    }
    trace_lender_dma_map(l->name, m->iova, m->size, lw->w->peer, m->segment, m->offset);
    reply_ok(l, token);
    return;

unused:
    if (lw->refs == 0) {
        window_release(l, lw);
    }
}

/* A DMA_MAP into a segment we have no window onto yet: it waits for the window. */
typedef struct DmaMapWait {
    VnLenderWait wait;
    VnProtoDmaMap m;
} DmaMapWait;

static void dma_window_mapped(void *opaque, VnFabricWindow *w, const GError *error)
{
    DmaMapWait *dw = opaque;
    VnLender *l = vn_lender_wait_end(&dw->wait);
    VnLenderWindow *lw;

    if (l == NULL || (w != NULL && !vn_lender_wait_current(l, &dw->wait))) {
        /* The lender went, or the device was taken back meanwhile: nothing may map it. */
        vn_fabric_window_unmap(dw->wait.fab, w);
        if (l != NULL) {
            vn_lender_fail(l, dw->wait.token, ENODEV,
                           "DMA_MAP: the device was taken back while its window was mapped");
        }
    } else if (w == NULL) {
        vn_lender_fail(l, dw->wait.token, errno_of(error), "DMA_MAP: %s", error->message);
    } else {
        lw = g_new0(VnLenderWindow, 1);
        lw->w = w;
        g_ptr_array_add(l->windows, lw);
        dma_map_onto(l, lw, &dw->m, dw->wait.token);
    }
    g_free(dw);
    if (l != NULL) {
        vn_lender_wait_next(l);
    }
}

static void handle_dma_map(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    VnLenderWindow *lw;
    VnProtoDmaMap m;
    DmaMapWait *dw;
    const char *peer;

    if (!vn_proto_dma_map_from_json(msg->json, &m, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    if (m.segment == 0) {
        vn_lender_fail(l, token, EINVAL, "DMA_MAP: no segment");
        return;
    }
    if (l->maps->len >= VN_MAX_DMA_MAPS) {
        vn_lender_fail(l, token, ENOSPC, "DMA_MAP: already %u mappings", VN_MAX_DMA_MAPS);
        return;
    }
    /* Another node's segment is a peer-to-peer target the borrower's daemon had shared
     * with ours (docs/p2p.md): our daemon maps it only when the holder allowed it. */
    peer = m.peer[0] != '\0' ? m.peer : l->borrower;
    lw = window_find(l, peer, m.segment);
    if (lw != NULL) {
        dma_map_onto(l, lw, &m, token);
        return;
    }
    /* The window is the borrower's daemon's to give: the loop stays free meanwhile, and
     * what the borrower sends after this waits for it (lender-queue.c). */
    dw = g_new0(DmaMapWait, 1);
    dw->m = m;
    vn_lender_wait_begin(l, &dw->wait, token);
    vn_fabric_window_map_async(l->fab, peer, m.segment, dma_window_mapped, dw);
}

/* Forget the mappings the device dropped (all, or those inside the range:
 * vfio type1 semantics, which the device server applies too). */
static void maps_forget(VnLender *l, uint64_t iova, uint64_t size, bool all)
{
    for (guint i = l->maps->len; i-- > 0;) {
        VnLenderMap *m = &g_array_index(l->maps, VnLenderMap, i);

        if (all || (m->iova >= iova && m->size <= size && m->iova - iova <= size - m->size)) {
            VnLenderWindow *lw = m->window;

            g_array_remove_index_fast(l->maps, i);
            window_unref(l, lw);
        }
    }
}

static void handle_dma_unmap(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    VnProtoDmaUnmap u;
    int ret;

    if (!vn_proto_dma_unmap_from_json(msg->json, &u, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    if (!u.all && (u.size == 0 || u.iova + u.size < u.iova)) {
        vn_lender_fail(l, token, EINVAL, "DMA_UNMAP: empty or wrapping range");
        return;
    }
    /* The device lets go first: once the borrower has our reply, nothing
     * of the lender's can reach that memory (vfio-user.rst: DMA_UNMAP). */
    ret = l->iommu_ops->dma_unmap(l->iommu, u.all ? 0 : u.iova, u.all ? 0 : u.size, u.all);
    if (ret < 0) {
        vn_lender_fail(l, token, ret, "DMA_UNMAP failed on the device: %s", g_strerror(-ret));
        return;
    }
    maps_forget(l, u.iova, u.size, u.all);
    l->stats.dma_unmaps++;
    trace_lender_dma_unmap(l->name, u.all ? "all, " : "", u.iova, u.size, l->maps->len,
                           l->windows->len);
    reply_ok(l, token);
}

/* ---- region accesses --------------------------------------------------- */

static void handle_region_rw(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    g_autofree uint8_t *buf = NULL;
    VnProtoRegionRw r;
    int ret;

    if (!vn_proto_region_rw_from_json(msg->json, &r, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    if (r.region >= l->dev.num_regions) {
        vn_lender_fail(l, token, EINVAL, "REGION_RW: no region %u (the device has %u)", r.region,
                       l->dev.num_regions);
        return;
    }
    if (msg->data_len != (r.write ? r.count : 0)) {
        vn_lender_fail(l, token, EINVAL, "REGION_RW: %zu data bytes for a %u-byte %s",
                       msg->data_len, r.count, r.write ? "write" : "read");
        return;
    }
    l->stats.region_rw++;
    if (r.region == VFIO_PCI_CONFIG_REGION_INDEX) {
        l->stats.config_rw++;
    }
    /* Answered even when the borrower posted the write (a BAR write: borrower-int.h): it
     * counts and logs the ones that failed. */
    if (r.write && r.region == VFIO_PCI_CONFIG_REGION_INDEX &&
        vn_lender_guard_write(l, token, r.offset, msg->data, r.count)) {
        return; /* the guard's to make and answer */
    }
    if (r.write) {
        ret = l->ops->region_write(l->device, r.region, r.offset, msg->data, r.count);
    } else {
        buf = g_malloc(MAX(r.count, 1));
        ret = l->ops->region_read(l->device, r.region, r.offset, buf, r.count);
        if (ret >= 0 && (uint32_t)ret != r.count) {
            ret = -EIO;
        }
    }
    trace_lender_device_rw(l->name, l->corr != NULL ? l->corr : "-", r.write ? "write" : "read",
                           r.region, r.offset, r.count, ret);
    if (ret < 0) {
        vn_lender_fail(l, token, ret, "%s of region %u at 0x%" PRIx64 " failed on the device: %s",
                       r.write ? "write" : "read", r.region, r.offset, g_strerror(-ret));
        return;
    }
    if (r.write) {
        reply_ok(l, token);
    } else {
        vn_fabric_reply(l->fab, token, NULL, buf, r.count);
    }
}

/* ---- attach and fence -------------------------------------------------- */

/* Withdraw the segments of every region: the borrower's windows onto the
 * device are gone (@why: logged, or NULL). */
static void regions_unexport(VnLender *l, const char *why)
{
    for (uint32_t i = 0; i < l->dev.num_regions; i++) {
        VnProtoRegion *r = &l->dev.regions[i];

        if (why != NULL && r->nr_segments > 0) {
            g_info("lender %s: %s: region %u's %u segment%s withdrawn", l->name, why, i,
                   r->nr_segments, r->nr_segments == 1 ? "" : "s");
        }
        for (uint32_t k = 0; k < r->nr_segments; k++) {
            vn_fabric_segment_unexport(l->fab, r->segments[k]);
        }
        r->nr_segments = 0;
    }
}

/* Withdraw what an attach set up locally (no device commands). */
static void release(VnLender *l)
{
    maps_forget(l, 0, 0, true);
    windows_release_all(l);
    regions_unexport(l, NULL);
    vn_lender_relay_drop_all(l);
    if (l->device != NULL) {
        l->ops->close(g_steal_pointer(&l->device));
    }
    l->device_gen++;
    l->iommu_ops = NULL;
    l->iommu = NULL;
    vn_lender_request_unwatch(l);
    memset(&l->dev, 0, sizeof(l->dev));
    g_clear_pointer(&l->borrower, g_free);
    vn_lender_server_released(l);
}

void vn_lender_drop_device(VnLender *l, const char *why)
{
    g_info("lender %s: %s: %u mappings forgotten, %u windows onto %s unmapped", l->name, why,
           l->maps->len, l->windows->len, l->borrower);
    regions_unexport(l, why);
    maps_forget(l, 0, 0, true);
    windows_release_all(l);
    vn_lender_relay_drop_all(l);
    vn_lender_request_unwatch(l);
    if (l->device != NULL) {
        l->ops->close(g_steal_pointer(&l->device));
    }
    l->device_gen++;
    l->iommu_ops = NULL;
    l->iommu = NULL;
    memset(&l->dev, 0, sizeof(l->dev));
}

/* One step of a fence, logged with its device and outcome: a failure is a warning (the
 * operator must know which step did not hold), success is information. */
static void fence_step(VnLender *l, const char *step, int ret)
{
    if (ret < 0) {
        g_warning("lender %s: fence of %s: %s failed: %s", l->name, l->borrower, step,
                  g_strerror(-ret));
    } else {
        g_info("lender %s: fence: %s", l->name, step);
    }
}

/* Bus mastering off through config space: the device starts no new DMA (the step before
 * its IOMMU mappings go, so it does not fault on them meanwhile). */
static int bus_master_off(VnLender *l)
{
    uint16_t cmd = 0;
    int ret = vn_lender_cfg_read(l, PCI_COMMAND, &cmd, sizeof(cmd));

    if (ret < 0) {
        return ret;
    }
    cmd = (uint16_t)GUINT16_FROM_LE(cmd) & (uint16_t)~PCI_COMMAND_MASTER;
    cmd = GUINT16_TO_LE(cmd);
    ret = l->ops->region_write(l->device, VFIO_PCI_CONFIG_REGION_INDEX, PCI_COMMAND, &cmd,
                               sizeof(cmd));
    return ret < 0 ? ret : 0;
}

/*
 * Take the device back from its borrower, in the order that leaves it no way to the old
 * holder at any step: interrupts and bus mastering off; the windows onto its BARs
 * withdrawn (on an NTB the inbound translations are cleared when the call returns); its
 * DMA unmapped, every mapping in one call to its IOMMU (VnBackendIommuOps), and only then
 * our windows onto the holder's memory (an IOMMU mapping holds no reference on a window's
 * pages); then the reset; then the connection.  Each
 * step goes on when one fails (a dead device server must not leave the holder's memory
 * mapped), and each says how it went.
 */
void vn_lender_fence(VnLender *l, const char *why)
{
    bool clean = true; /* every step held: the connection may serve the next lease */
    int ret;

    if (l->borrower == NULL) {
        return;
    }
    g_info("lender %s: fencing %s (%s)", l->name, l->borrower, why);
    if (l->device != NULL) {
        for (uint32_t i = 0; i < l->dev.num_irqs; i++) {
            if (l->dev.irq_count[i] == 0) {
                continue;
            }
            g_autofree char *step = g_strdup_printf("interrupts of index %u disabled", i);

            ret = l->ops->set_irqs(l->device, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                                   i, 0, 0, NULL, NULL);
            fence_step(l, step, ret);
            clean &= ret >= 0;
        }
        ret = bus_master_off(l);
        fence_step(l, "bus mastering off", ret);
        clean &= ret >= 0;
    }
    regions_unexport(l, "fence");
    if (l->device != NULL) {
        ret = l->iommu_ops->dma_unmap(l->iommu, 0, 0, true);
        fence_step(l, "DMA unmapped", ret);
        clean &= ret >= 0;
    }
    g_info("lender %s: fence: %u mappings forgotten, %u windows onto %s unmapped", l->name,
           l->maps->len, l->windows->len, l->borrower);
    maps_forget(l, 0, 0, true);
    windows_release_all(l);
    if (l->device != NULL) {
        ret = l->ops->reset(l->device);
        fence_step(l, "device reset", ret);
        clean &= ret >= 0;
    }
    g_info("lender %s: fence: relay eventfds closed", l->name);
    vn_lender_relay_drop_all(l);
    /* A connection whose every step held is clean (nothing mapped, no interrupt, reset) and
     * is kept for the next lease: some servers serve one client for their lifetime. */
    if (clean && l->device != NULL && vn_lender_server_keep(l, l->device)) {
        g_info("lender %s: fence: %s %s kept for the next lease", l->name, l->ops->name, l->where);
        l->device = NULL;
    } else {
        g_info("lender %s: fence: closing %s %s", l->name, l->ops->name, l->where);
    }
    release(l);
    l->stats.fences++;
    g_info("lender %s: free", l->name);
}

/* Describe region @i and ask for its export (into @bars) when it can be mapped. */
static int describe_region(VnLender *l, uint32_t i, const char *peer, uint64_t max_window,
                           VnLenderBars *bars, VnProtoRegion *r, GError **error)
{
    struct vfio_region_sparse_mmap_area areas[VN_MAX_SPARSE_AREAS];
    struct vfio_region_info ri;
    uint32_t nr = 0;
    bool mappable;
    int fd = -1;
    int ret;

    ret = l->ops->get_region_info(l->device, i, &ri, &fd, areas, VN_MAX_SPARSE_AREAS, &nr);
    if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret), "region %u info: %s", i,
                    g_strerror(-ret));
        return ret;
    }
    r->size = ri.size;
    r->flags = ri.flags & (VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE |
                           VFIO_REGION_INFO_FLAG_MMAP);
    for (uint32_t a = 0; a < nr; a++) {
        /* The device server is a peer too: an area outside its region would
         * be refused by the borrower's decoder. */
        if (!vn_util_range_ok(areas[a].offset, areas[a].size, ri.size)) {
            nr = 0;
            break;
        }
        r->sparse[a] = (VnSparseArea){ .offset = areas[a].offset, .size = areas[a].size };
    }
    r->nr_sparse = nr;
    /* The region's own memory (a memfd of a device server's, a physical
     * BAR of the VFIO device fd at the region's offset) becomes a segment:
     * the borrower's QEMU maps it and no software of ours sees the guest's
     * loads and stores. */
    /* Only a BAR's: a device-specific region past them (libvfio-user's migration region is
     * mappable) is no memory a borrower's guest may reach. */
    mappable = i < VFIO_PCI_ROM_REGION_INDEX && (ri.flags & VFIO_REGION_INFO_FLAG_MMAP) &&
               fd >= 0 && ri.size > 0;
    if (mappable &&
        vn_lender_bars_ask(bars, l, i, fd, ri.offset, ri.size, peer, max_window, error) < 0) {
        vn_util_close_fd(&fd);
        return -EINVAL;
    }
    if (!mappable) {
        r->flags &= ~(uint32_t)VFIO_REGION_INFO_FLAG_MMAP;
        r->nr_sparse = 0;
    }
    vn_util_close_fd(&fd);
    return 0;
}

/* Take the device's connection @dev and describe it for @peer; its BARs' exports asked
 * into @bars. */
static bool attach(VnLender *l, void *dev, const char *peer, VnIrqMode mode, uint64_t max_window,
                   VnLenderBars *bars, GError **error)
{
    VnWireDeviceInfo info;
    int ret;

    l->device = dev;
    vn_lender_server_attached(l);
    l->borrower = g_strdup(peer);
    l->irq_mode = mode;
    l->iommu_ops = l->ops->iommu(l->device, &l->iommu);
    if (!vn_backend_iommu_ops_valid(l->iommu_ops, error)) {
        return false;
    }
    ret = l->ops->get_info(l->device, &info);
    if (ret < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret), "device info: %s",
                    g_strerror(-ret));
        return false;
    }
    if (info.num_regions > VN_MAX_REGIONS || info.num_irqs > VN_MAX_IRQ_INDEXES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "the device has %u regions and %u interrupt indexes (at most %u and %u)",
                    info.num_regions, info.num_irqs, VN_MAX_REGIONS, VN_MAX_IRQ_INDEXES);
        return false;
    }
    l->dev.flags = info.flags;
    for (uint32_t i = 0; i < info.num_regions; i++) {
        /* Counted as we go, so release() withdraws what was exported. */
        l->dev.num_regions = i + 1;
        if (describe_region(l, i, peer, max_window, bars, &l->dev.regions[i], error) < 0) {
            return false;
        }
    }
    for (uint32_t i = 0; i < info.num_irqs; i++) {
        struct vfio_irq_info ii;

        ret = l->ops->get_irq_info(l->device, i, &ii);
        if (ret < 0 || ii.count > VN_MAX_IRQ_VECTORS) {
            ret = ret < 0 ? ret : -EPROTO;
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(-ret),
                        "interrupt index %u info: %s", i, g_strerror(-ret));
            return false;
        }
        l->dev.irq_count[i] = ii.count;
        l->dev.irq_flags[i] = ii.flags;
    }
    l->dev.num_irqs = info.num_irqs;
    vn_lender_guard_probe(l);
    vn_lender_request_watch(l);
    return true;
}

/* Every BAR export of an ATTACH answered: the ATTACH is. */
static void attach_exported(VnLender *l, const VnLenderBars *bars, uint64_t token, bool current)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;

    if (!current) {
        vn_lender_fail(l, token, ENODEV, "ATTACH: the device was taken back meanwhile");
        return;
    }
    if (!vn_lender_bars_settle(l, bars, &error)) {
        release(l);
        vn_lender_fail(l, token, errno_of(error), "ATTACH: %s", error->message);
        return;
    }
    g_info("lender %s: lent to %s (%s interrupts)", l->name, l->borrower,
           vn_irq_mode_to_string(l->irq_mode));
    json = vn_proto_device_to_json(&l->dev);
    vn_fabric_reply(l->fab, token, json, NULL, 0);
}

/* An ATTACH's own, kept while its device's connection is dialled. */
typedef struct AttachArgs {
    uint64_t token;
    char peer[VN_MAX_NODE_NAME + 1];
    VnIrqMode mode;
    uint64_t max_window;
} AttachArgs;

/* The ATTACH's connection to the device came (or not): the device is described and its
 * BARs exported; the ATTACH is answered once they are (attach_exported). */
static void attach_taken(VnLender *l, void *dev, const GError *why, void *opaque)
{
    g_autofree AttachArgs *a = opaque;
    g_autoptr(GError) error = NULL;
    VnLenderBars *bars;
    bool ok;

    if (dev == NULL) {
        release(l);
        vn_lender_fail(l, a->token, errno_of(why), "ATTACH: %s", why->message);
        return;
    }
    bars = vn_lender_bars_begin(l, a->token, attach_exported);
    ok = attach(l, dev, a->peer, a->mode, a->max_window, bars, &error);
    if (!ok) {
        release(l); /* what was asked is withdrawn as it is answered */
        vn_lender_fail(l, a->token, errno_of(error), "ATTACH: %s", error->message);
    }
    vn_lender_bars_asked(bars, !ok);
}

static void handle_attach(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *json = NULL;
    VnProtoAttach a;
    AttachArgs *args;

    if (!vn_proto_attach_from_json(msg->json, &a, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    if (l->borrower != NULL && strcmp(l->borrower, msg->peer) != 0) {
        vn_lender_fail(l, token, EBUSY, "lent to %s", l->borrower);
        return;
    }
    if (a.resume) {
        /* The holder's worker died; the one taking over its QEMU goes on with the
         * attachment as the device has it (DMA maps, interrupts): nothing is fenced. */
        if (l->borrower == NULL || a.irq_mode != l->irq_mode) {
            vn_lender_fail(l, token, ENODEV, "%s has no attachment %sto resume", msg->peer,
                           l->borrower == NULL ? "" : "in that interrupt mode ");
            return;
        }
        g_message("lender %s: %s resumes its attachment (its worker was replaced)", l->name,
                  l->borrower);
        json = vn_proto_device_to_json(&l->dev);
        vn_fabric_reply(l->fab, token, json, NULL, 0);
        return;
    }
    if (l->borrower != NULL) {
        /* The borrower starts over (e.g. its VM restarted): fresh state. */
        vn_lender_fence(l, "attached again");
    }
    args = g_new0(AttachArgs, 1);
    *args = (AttachArgs){ .token = token, .mode = a.irq_mode, .max_window = a.max_window };
    g_strlcpy(args->peer, msg->peer, sizeof(args->peer));
    vn_lender_server_take(l, token, attach_taken, args);
}

/* ---- dispatch ---------------------------------------------------------- */

static void lender_dispatch(VnLender *l, VnFabricMsg *msg, uint64_t token, const char *device);

static void handle_request(VnLender *l, VnFabricMsg *msg, uint64_t token)
{
    g_autoptr(GError) error = NULL;
    char device[VN_MAX_DEVICE_NAME + 1];
    char corr[VN_TRACE_MAX_CORR] = "-";

    l->stats.requests++;
    /* The correlation id is read only for the traces that show it. */
    bool traced = trace_lender_request_enabled() || trace_lender_device_rw_enabled();

    if (!vn_proto_device_and_corr(msg->json, device, traced ? corr : NULL, &error)) {
        vn_lender_fail(l, token, EINVAL, "%s", error->message);
        return;
    }
    trace_lender_request(l->name, corr, vn_proto_type_to_string(msg->type), token, msg->peer,
                         msg->data_len);
    l->corr = corr;
    lender_dispatch(l, msg, token, device);
    l->corr = NULL;
}

/* The request's checks and its handler (l->corr is its correlation id meanwhile). */
static void lender_dispatch(VnLender *l, VnFabricMsg *msg, uint64_t token, const char *device)
{
    if (strcmp(device, l->name) != 0) {
        vn_lender_fail(l, token, ENODEV, "request for device %s", device);
        return;
    }
    if (msg->type != VN_PROTO_ATTACH && l->borrower == NULL && l->holder != NULL &&
        strcmp(l->holder, msg->peer) == 0) {
        /* The holder's attachment went with a worker before us (or with a device server):
         * the device is new to it, and its VM is given it anew. */
        vn_lender_fail(l, token, ENODEV,
                       "%s is not attached to this device: it was presented anew (its lender "
                       "worker or device server started again); attach again",
                       msg->peer);
        return;
    }
    if (msg->type != VN_PROTO_ATTACH &&
        (l->borrower == NULL || strcmp(l->borrower, msg->peer) != 0)) {
        vn_lender_fail(l, token, EPERM, "not lent to %s", msg->peer);
        return;
    }
    if (vn_lender_server_refuses(l, msg->type, token)) {
        return;
    }
    if (msg->data_len > 0 && msg->type != VN_PROTO_SET_IRQS && msg->type != VN_PROTO_REGION_RW) {
        vn_lender_fail(l, token, EINVAL, "%s carries no data", vn_proto_type_to_string(msg->type));
        return;
    }
    switch (msg->type) {
    case VN_PROTO_ATTACH:
        handle_attach(l, msg, token);
        break;
    case VN_PROTO_DETACH:
        vn_lender_fence(l, "detached");
        reply_ok(l, token);
        break;
    case VN_PROTO_REGION_RW:
        handle_region_rw(l, msg, token);
        break;
    case VN_PROTO_DMA_MAP:
        handle_dma_map(l, msg, token);
        break;
    case VN_PROTO_DMA_UNMAP:
        handle_dma_unmap(l, msg, token);
        break;
    case VN_PROTO_SET_IRQS:
        vn_lender_set_irqs(l, msg, token);
        break;
    case VN_PROTO_RESET:
        vn_lender_guard_reset(l, token);
        break;
    default:
        vn_lender_fail(l, token, ENOTSUP, "unknown request type %u", msg->type);
        break;
    }
}

void vn_lender_peer_up(VnLender *l, const char *peer)
{
    g_free(l->holder);
    l->holder = g_strdup(peer);
}

void vn_lender_peer_down(VnLender *l, const char *peer)
{
    if (l->holder != NULL && peer != NULL && strcmp(l->holder, peer) == 0) {
        g_clear_pointer(&l->holder, g_free);
    }
    if (l->borrower != NULL && peer != NULL && strcmp(l->borrower, peer) == 0) {
        vn_lender_fence(l, "link down");
    }
}

void vn_lender_free(VnLender *l)
{
    if (l == NULL) {
        return;
    }
    vn_lender_queue_close(l);
    vn_lender_fence(l, "lender closing");
    release(l);
    vn_lender_server_stop(l);
    g_ptr_array_unref(l->windows);
    g_array_unref(l->maps);
    g_free(l->holder);
    g_free(l->name);
    g_free(l->where);
    g_free(l);
}
