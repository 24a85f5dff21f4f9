/*
 * The simulated NTB's ports as vfio-user devices (see ntbdev.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "ntbdev-int.h"

#include "common/util.h"
#include "pcicfg.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/vfio.h>
#include <string.h>

/* MSI-X (in the layout's BAR, from its offset): the table (16 bytes a vector) and, after
 * it, the PBA (PCIe r5.0 7.7.2). */
#define MSIX_TABLE_END (VN_EPF_MAX_VECTORS * VN_PCICFG_MSIX_ENTRY_SIZE)
G_STATIC_ASSERT(MSIX_TABLE_END <= VN_EPF_PBA_OFFSET);

/* ---- the model's ops: interrupts and DMA of a port's function ----------- */

static void epf_signal(void *opaque, unsigned port, uint32_t vector)
{
    NtbPort *p = &((VnNtbDev *)opaque)->port[port];

    if (p->irqs == NULL || !vn_irqs_signal(p->irqs, VFIO_PCI_MSIX_IRQ_INDEX, vector)) {
        g_debug("NTB model: port %u: vector %u has no eventfd", port, vector);
    }
}

/*
 * DMA by port @port's function.  Where its client's DMA table holds the address (guest
 * RAM), straight into it; where it does not (a BAR of another device of that host's, peer
 * to peer), the client does it (QEMU, through that guest's IOMMU): a posted write, a read
 * waited for (vn_server_client_dma()).
 */
static int port_dma(NtbPort *p, uint64_t addr, void *buf, uint32_t len, bool write)
{
    uint32_t n;
    int ret;

    if (p->dma == NULL) {
        return -ENODEV;
    }
    ret = write ? vn_dma_write(p->dma, addr, buf, len) : vn_dma_read(p->dma, addr, buf, len);
    if (ret != -EFAULT) {
        return ret;
    }
    for (uint32_t done = 0; done < len; done += n) {
        n = MIN(len - done, VN_SERVER_CLIENT_DMA_MAX);
        ret = vn_server_client_dma(p->server, addr + done, (uint8_t *)buf + done, n, write);
        if (ret < 0) {
            if (ret == -ETIMEDOUT || ret == -EBUSY || ret == -ENOTCONN) {
                p->p2p_unanswered++;
            } else {
                p->p2p_failures++;
            }
            return -EFAULT;
        }
    }
    if (write) {
        p->p2p_writes++;
    } else {
        p->p2p_reads++;
    }
    return 0;
}

static int epf_dma_read(void *opaque, unsigned port, uint64_t addr, void *buf, uint32_t len)
{
    return port_dma(&((VnNtbDev *)opaque)->port[port], addr, buf, len, false);
}

static int epf_dma_write(void *opaque, unsigned port, uint64_t addr, const void *buf, uint32_t len)
{
    return port_dma(&((VnNtbDev *)opaque)->port[port], addr, (void *)buf, len, true);
}

static bool epf_bus_master(void *opaque, unsigned port)
{
    return vn_pcicfg_bus_master(((VnNtbDev *)opaque)->port[port].cfg);
}

static const VnEpfOps epf_ops = {
    .signal = epf_signal,
    .dma_read = epf_dma_read,
    .dma_write = epf_dma_write,
    .bus_master = epf_bus_master,
};

/* ---- construction ------------------------------------------------------ */

static void info_build(VnDeviceInfo *i, const VnEpfLayout *l)
{
    const uint32_t rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;

    memset(i, 0, sizeof(*i));
    i->flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
    i->num_regions = VFIO_PCI_NUM_REGIONS;
    for (uint32_t r = 0; r < VN_MAX_REGIONS; r++) {
        i->regions[r].mmap_fd = -1;
    }
    for (unsigned b = 0; b < VN_EPF_BARS; b++) {
        /* A 64-bit BAR's upper half is not a region of its own. */
        if (l->bar_size[b] != 0) {
            i->regions[VFIO_PCI_BAR0_REGION_INDEX + b].size = l->bar_size[b];
            i->regions[VFIO_PCI_BAR0_REGION_INDEX + b].flags = rw;
        }
    }
    i->regions[VFIO_PCI_CONFIG_REGION_INDEX].size = VN_PCICFG_SIZE;
    i->regions[VFIO_PCI_CONFIG_REGION_INDEX].flags = rw;

    i->num_irqs = VFIO_PCI_NUM_IRQS;
    i->irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_INTX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    i->irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = VN_EPF_MAX_VECTORS;
    i->irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE;
    /* As Linux's vfio-pci reports for a PCIe function (QEMU warns otherwise). */
    i->irq_count[VFIO_PCI_ERR_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_ERR_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
}

VnNtbDev *vn_ntbdev_new(const uint64_t *sizes, unsigned windows, GError **error)
{
    g_autoptr(VnNtbDev) d = g_new0(VnNtbDev, 1);
    VnPciCfgParams cp = {
        .revision = 1,
        .class_code = VN_EPF_CLASS,
        .irq_mode = VN_PCICFG_IRQ_MSIX,
        .msix_vectors = VN_EPF_MAX_VECTORS,
    };

    d->epf = vn_epf_new(sizes, windows, &epf_ops, d, error);
    if (d->epf == NULL) {
        return NULL;
    }
    vn_epf_layout(d->epf, &d->layout);
    cp.vendor_id = cp.subsys_vendor_id = d->layout.vendor_id;
    cp.device_id = cp.subsys_id = d->layout.device_id;
    cp.msix_bir = d->layout.msix_bar;
    cp.msix_table_offset = (uint32_t)d->layout.msix_offset;
    cp.msix_pba_offset = (uint32_t)d->layout.msix_offset + VN_EPF_PBA_OFFSET;
    for (unsigned b = 0; b < VN_EPF_BARS; b++) {
        cp.bars[b] = (VnPciCfgBar){ .size = d->layout.bar_size[b],
                                    .is64 = d->layout.bar_is64[b],
                                    .prefetch = d->layout.bar_prefetch[b] };
    }
    for (unsigned p = 0; p < 2; p++) {
        d->port[p].dev = d;
        d->port[p].index = p;
        for (unsigned mw = 0; mw < VN_EPF_MAX_WINDOWS; mw++) {
            d->port[p].map[mw].port = &d->port[p];
            d->port[p].map[mw].mw = mw;
        }
        d->port[p].cfg = vn_pcicfg_new(&cp, error);
        if (d->port[p].cfg == NULL) {
            g_prefix_error(error, "NTB model port %u: ", p);
            return NULL;
        }
    }
    info_build(&d->info, &d->layout);
    return g_steal_pointer(&d);
}

void vn_ntbdev_free(VnNtbDev *d)
{
    if (d == NULL) {
        return;
    }
    vn_ntbdev_map_clear(d);
    for (unsigned p = 0; p < 2; p++) {
        vn_pcicfg_free(d->port[p].cfg);
    }
    vn_epf_free(d->epf);
    g_free(d);
}

const VnDeviceInfo *vn_ntbdev_info(VnNtbDev *d)
{
    return &d->info;
}

void vn_ntbdev_layout(VnNtbDev *d, VnEpfLayout *out)
{
    *out = d->layout;
}

void *vn_ntbdev_port(VnNtbDev *d, unsigned port)
{
    return &d->port[port & 1];
}

void vn_ntbdev_attach(VnNtbDev *d, unsigned port, VnServer *server)
{
    d->port[port & 1].server = server;
    d->port[port & 1].dma = server != NULL ? vn_server_dma(server) : NULL;
    d->port[port & 1].irqs = server != NULL ? vn_server_irqs(server) : NULL;
}

char *vn_ntbdev_stats_json(VnNtbDev *d)
{
    g_autoptr(GString) s = g_string_new("{");

    g_string_append_printf(
        s, "\"link_up\": %s, \"window_size\": %" G_GUINT64_FORMAT ", \"mapping\": %s",
        vn_epf_link_up(d->epf) ? "true" : "false", vn_epf_window_size(d->epf, 0),
        vn_ntbdev_mapping(d) ? "true" : "false");
    for (unsigned p = 0; p < 2; p++) {
        VnEpfStats st;

        vn_epf_stats(d->epf, p, &st);
        g_string_append_printf(
            s,
            ", \"port%u\": {\"commands\": %" G_GUINT64_FORMAT
            ", \"command_errors\": %" G_GUINT64_FORMAT ", \"doorbells\": %" G_GUINT64_FORMAT
            ", \"doorbells_lost\": %" G_GUINT64_FORMAT ", \"window_reads\": %" G_GUINT64_FORMAT
            ", \"window_writes\": %" G_GUINT64_FORMAT ", \"window_faults\": %" G_GUINT64_FORMAT
            ", \"link_events\": %" G_GUINT64_FORMAT ", \"p2p_reads\": %" G_GUINT64_FORMAT
            ", \"p2p_writes\": %" G_GUINT64_FORMAT ", \"p2p_failures\": %" G_GUINT64_FORMAT
            ", \"p2p_unanswered\": %" G_GUINT64_FORMAT ", \"link_ups\": %" G_GUINT64_FORMAT
            ", \"link_downs\": %" G_GUINT64_FORMAT ", \"resets\": %" G_GUINT64_FORMAT
            ", \"connects\": %" G_GUINT64_FORMAT ", \"connected\": %s, \"link_wanted\": %s",
            p, st.commands, st.command_errors, st.doorbells, st.doorbells_lost, st.window_reads,
            st.window_writes, st.window_faults, st.link_events, d->port[p].p2p_reads,
            d->port[p].p2p_writes, d->port[p].p2p_failures, d->port[p].p2p_unanswered, st.link_ups,
            st.link_downs, st.resets, st.connects, st.connected ? "true" : "false",
            st.link_wanted ? "true" : "false");
        vn_ntbdev_map_stats(&d->port[p], s); /* its windows' mapping */
        g_string_append(s, "}");
    }
    g_string_append(s, "}");
    return g_string_free(g_steal_pointer(&s), FALSE);
}

/* ---- the server's ops, per port ---------------------------------------- */

static void port_reset(NtbPort *p)
{
    vn_pcicfg_reset(p->cfg);
    memset(p->msix, 0, sizeof(p->msix));
    vn_epf_reset(p->dev->epf, p->index);
}

/* What an access at @offset of region @index reaches, in the layout (see epf.h); the offset
 * within that part in *@at, the window in *@mw. */
typedef enum Part { PART_NONE, PART_CONFIG, PART_CTRL, PART_MSIX, PART_DB, PART_WINDOW } Part;

static Part part_of(const VnEpfLayout *l, uint32_t index, uint64_t offset, uint64_t *at,
                    unsigned *mw)
{
    unsigned bar = index - VFIO_PCI_BAR0_REGION_INDEX;

    *at = offset;
    if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
        return PART_CONFIG;
    }
    if (bar >= VN_EPF_BARS || l->bar_size[bar] == 0) { /* BAR0 is region 0 */
        return PART_NONE;
    }
    if (bar == VN_EPF_CTRL_BAR) {
        return PART_CTRL;
    }
    if (bar == l->peer_spad_bar && offset < 4u * VN_EPF_SPADS) {
        *at = VN_EPF_PEER_SPAD_OFFSET + offset; /* where BAR0 has them in the other map */
        return PART_CTRL;
    }
    if (bar == l->msix_bar && offset >= l->msix_offset) {
        *at = offset - l->msix_offset;
        return *at < VN_EPF_MSIX_SIZE ? PART_MSIX : PART_NONE;
    }
    for (unsigned w = 0; w < VN_EPF_MAX_WINDOWS; w++) {
        if (l->window_bar[w] == bar && offset >= l->window_offset[w]) {
            *at = offset - l->window_offset[w];
            *mw = w;
            return PART_WINDOW;
        }
    }
    return bar == VN_EPF_DB_BAR ? PART_DB : PART_NONE;
}

static int op_region_read(void *opaque, uint32_t index, uint64_t offset, void *buf, uint32_t count)
{
    NtbPort *p = opaque;
    VnEpf *epf = p->dev->epf;
    unsigned mw = 0;
    uint64_t at;

    /* The server checked the range against our sizes; checked again below (peer input). */
    switch (part_of(&p->dev->layout, index, offset, &at, &mw)) {
    case PART_CONFIG:
        return vn_pcicfg_read(p->cfg, at, buf, count);
    case PART_CTRL:
        return vn_epf_ctrl_read(epf, p->index, at, buf, count);
    case PART_MSIX:
        if (!vn_util_range_ok(at, count, VN_EPF_MSIX_SIZE)) {
            return -EINVAL;
        }
        memcpy(buf, p->msix + at, count); /* the PBA reads 0: nothing pending */
        return 0;
    case PART_DB:
        return vn_epf_db_read(epf, p->index, at, buf, count);
    case PART_WINDOW:
        vn_ntbdev_map_trapped(p, mw);
        return vn_epf_window_read(epf, p->index, mw, at, buf, count);
    default:
        return -EINVAL;
    }
}

static int op_region_write(void *opaque, uint32_t index, uint64_t offset, const void *buf,
                           uint32_t count)
{
    NtbPort *p = opaque;
    VnEpf *epf = p->dev->epf;
    unsigned mw = 0;
    uint64_t at;
    int ret;

    switch (part_of(&p->dev->layout, index, offset, &at, &mw)) {
    case PART_CONFIG:
        ret = vn_pcicfg_write(p->cfg, at, buf, count);
        if (vn_pcicfg_take_flr(p->cfg)) {
            g_info("NTB model: port %u: function level reset", p->index);
            port_reset(p);
        }
        vn_ntbdev_map_sync(p->dev); /* bus mastering, a reset */
        return ret;
    case PART_CTRL:
        ret = vn_epf_ctrl_write(epf, p->index, at, buf, count);
        if (at < VN_EPF_SPAD_OFFSET) {
            vn_ntbdev_map_sync(p->dev); /* a translation, the link (not a scratchpad) */
        }
        return ret;
    case PART_MSIX:
        /* The table is storage; the PBA is read-only (PCIe r5.0 7.7.2.6). */
        if (!vn_util_range_ok(at, count, VN_EPF_MSIX_SIZE)) {
            return -EINVAL;
        }
        if (at < MSIX_TABLE_END) {
            memcpy(p->msix + at, buf, MIN((uint64_t)count, MSIX_TABLE_END - at));
        }
        return 0;
    case PART_DB:
        return vn_epf_db_write(epf, p->index, at, buf, count);
    case PART_WINDOW:
        vn_ntbdev_map_trapped(p, mw);
        return vn_epf_window_write(epf, p->index, mw, at, buf, count);
    default:
        return -EINVAL;
    }
}

/* DEVICE_RESET, and the server's reset when a client goes. */
static int op_reset(void *opaque)
{
    NtbPort *p = opaque;

    port_reset(p);
    vn_ntbdev_map_sync(p->dev);
    return 0;
}

static void op_client_new(void *opaque)
{
    NtbPort *p = opaque;

    vn_epf_set_connected(p->dev->epf, p->index, true);
    vn_ntbdev_map_sync(p->dev);
}

static void op_client_gone(void *opaque)
{
    NtbPort *p = opaque;

    vn_epf_set_connected(p->dev->epf, p->index, false);
    vn_ntbdev_map_client_gone(p);
    vn_ntbdev_map_sync(p->dev); /* the other port's windows reach nothing now */
}

/* The peer's memory a window may be mapped onto now (the table holds it already). */
static int op_dma_mapped(void *opaque, const VnDmaMapping *m)
{
    vn_ntbdev_map_mapped(opaque, m->iova, m->size);
    return 0;
}

static void op_dma_unmapping(void *opaque, uint64_t iova, uint64_t size, bool all)
{
    vn_ntbdev_map_unmapping(opaque, iova, size, all);
}

const VnDeviceOps vn_ntbdev_ops = {
    .region_read = op_region_read,
    .region_write = op_region_write,
    .dma_mapped = op_dma_mapped,
    .dma_unmapping = op_dma_unmapping,
    .reset = op_reset,
    .client_new = op_client_new,
    .client_gone = op_client_gone,
};
