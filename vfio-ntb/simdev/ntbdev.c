/*
 * The simulated NTB's ports as vfio-user devices (see ntbdev.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "ntbdev.h"

#include "common/util.h"
#include "pcicfg.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/vfio.h>
#include <string.h>

/* BAR1: the MSI-X table (16 bytes a vector) and, after it, the PBA (PCIe r5.0 7.7.2). */
#define MSIX_BAR_SIZE 4096u
#define MSIX_TABLE 0x000u
#define MSIX_PBA 0x800u
#define MSIX_TABLE_END (MSIX_TABLE + VN_EPF_MAX_VECTORS * VN_PCICFG_MSIX_ENTRY_SIZE)
G_STATIC_ASSERT(MSIX_TABLE_END <= MSIX_PBA);

typedef struct NtbPort {
    VnNtbDev *dev;
    unsigned index;
    VnPciCfg *cfg;
    uint8_t msix[MSIX_BAR_SIZE];
    VnServer *server; /* borrowed; NULL when detached */
    VnDma *dma;       /* the server's */
    VnIrqs *irqs;
    /* DMA the client did for us; refused by it (an address nothing decodes there: what a
     * real host sees as an unsupported request); not answered (a busy TCG VM: no answer in
     * time, or its own commands piled up while we waited, or it went). */
    uint64_t p2p_reads, p2p_writes, p2p_failures, p2p_unanswered;
} NtbPort;

struct VnNtbDev {
    VnEpf *epf;
    VnDeviceInfo info;
    NtbPort port[2];
};

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

static void info_build(VnDeviceInfo *i, uint64_t window_size, unsigned windows)
{
    static const struct {
        uint32_t index;
        uint64_t size;
    } bars[] = {
        { VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_CTRL_BAR, VN_EPF_CTRL_SIZE },
        { VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_MSIX_BAR, MSIX_BAR_SIZE },
        { VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_DB_BAR, VN_EPF_DB_SIZE },
        { VFIO_PCI_CONFIG_REGION_INDEX, VN_PCICFG_SIZE },
    };
    const uint32_t rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;

    memset(i, 0, sizeof(*i));
    i->flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
    i->num_regions = VFIO_PCI_NUM_REGIONS;
    for (uint32_t r = 0; r < VN_MAX_REGIONS; r++) {
        i->regions[r].mmap_fd = -1;
    }
    for (unsigned b = 0; b < G_N_ELEMENTS(bars); b++) {
        i->regions[bars[b].index].size = bars[b].size;
        i->regions[bars[b].index].flags = rw;
    }
    for (unsigned w = 0; w < windows; w++) {
        i->regions[VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR + w].size = window_size;
        i->regions[VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR + w].flags = rw;
    }

    i->num_irqs = VFIO_PCI_NUM_IRQS;
    i->irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_INTX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    i->irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = VN_EPF_MAX_VECTORS;
    i->irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE;
    /* As Linux's vfio-pci reports for a PCIe function (QEMU warns otherwise). */
    i->irq_count[VFIO_PCI_ERR_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_ERR_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
}

VnNtbDev *vn_ntbdev_new(uint64_t window_size, unsigned windows, GError **error)
{
    g_autoptr(VnNtbDev) d = g_new0(VnNtbDev, 1);
    VnPciCfgParams cp = {
        .vendor_id = VN_EPF_VENDOR_ID,
        .device_id = VN_EPF_DEVICE_ID,
        .subsys_vendor_id = VN_EPF_VENDOR_ID,
        .subsys_id = VN_EPF_DEVICE_ID,
        .revision = 1,
        .class_code = VN_EPF_CLASS,
        .bars = { [VN_EPF_CTRL_BAR] = { .size = VN_EPF_CTRL_SIZE },
                  [VN_EPF_MSIX_BAR] = { .size = MSIX_BAR_SIZE },
                  [VN_EPF_DB_BAR] = { .size = VN_EPF_DB_SIZE },
                  [VN_EPF_WINDOW_BAR] = { .size = window_size, .is64 = true, .prefetch = true } },
        .irq_mode = VN_PCICFG_IRQ_MSIX,
        .msix_vectors = VN_EPF_MAX_VECTORS,
        .msix_bir = VN_EPF_MSIX_BAR,
        .msix_table_offset = MSIX_TABLE,
        .msix_pba_offset = MSIX_PBA,
    };

    d->epf = vn_epf_new(window_size, windows, &epf_ops, d, error);
    if (d->epf == NULL) {
        return NULL;
    }
    if (windows > 1) {
        /* Window 2 is BAR5 (ntb_hw_epf's mx8_map): both 32-bit. */
        cp.bars[VN_EPF_WINDOW_BAR].is64 = false;
        cp.bars[VN_EPF_WINDOW_BAR + 1] = (VnPciCfgBar){ .size = window_size, .prefetch = true };
    }
    for (unsigned p = 0; p < 2; p++) {
        d->port[p].dev = d;
        d->port[p].index = p;
        d->port[p].cfg = vn_pcicfg_new(&cp, error);
        if (d->port[p].cfg == NULL) {
            g_prefix_error(error, "NTB model port %u: ", p);
            return NULL;
        }
    }
    info_build(&d->info, window_size, windows);
    return g_steal_pointer(&d);
}

void vn_ntbdev_free(VnNtbDev *d)
{
    if (d == NULL) {
        return;
    }
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

    g_string_append_printf(s, "\"link_up\": %s, \"window_size\": %" G_GUINT64_FORMAT,
                           vn_epf_link_up(d->epf) ? "true" : "false", vn_epf_window_size(d->epf));
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
            ", \"p2p_unanswered\": %" G_GUINT64_FORMAT "}",
            p, st.commands, st.command_errors, st.doorbells, st.doorbells_lost, st.window_reads,
            st.window_writes, st.window_faults, st.link_events, d->port[p].p2p_reads,
            d->port[p].p2p_writes, d->port[p].p2p_failures, d->port[p].p2p_unanswered);
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

static int op_region_read(void *opaque, uint32_t index, uint64_t offset, void *buf, uint32_t count)
{
    NtbPort *p = opaque;
    VnEpf *epf = p->dev->epf;

    /* The server checked the range against our sizes; checked again below (peer input). */
    switch (index) {
    case VFIO_PCI_CONFIG_REGION_INDEX:
        return vn_pcicfg_read(p->cfg, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_CTRL_BAR:
        return vn_epf_ctrl_read(epf, p->index, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_MSIX_BAR:
        if (!vn_util_range_ok(offset, count, MSIX_BAR_SIZE)) {
            return -EINVAL;
        }
        memcpy(buf, p->msix + offset, count); /* the PBA reads 0: nothing pending */
        return 0;
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_DB_BAR:
        return vn_epf_db_read(epf, p->index, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR:
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR + 1:
        return vn_epf_window_read(epf, p->index,
                                  index - VFIO_PCI_BAR0_REGION_INDEX - VN_EPF_WINDOW_BAR, offset,
                                  buf, count);
    default:
        return -EINVAL;
    }
}

static int op_region_write(void *opaque, uint32_t index, uint64_t offset, const void *buf,
                           uint32_t count)
{
    NtbPort *p = opaque;
    VnEpf *epf = p->dev->epf;
    int ret;

    switch (index) {
    case VFIO_PCI_CONFIG_REGION_INDEX:
        ret = vn_pcicfg_write(p->cfg, offset, buf, count);
        if (vn_pcicfg_take_flr(p->cfg)) {
            g_info("NTB model: port %u: function level reset", p->index);
            port_reset(p);
        }
        return ret;
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_CTRL_BAR:
        return vn_epf_ctrl_write(epf, p->index, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_MSIX_BAR:
        /* The table is storage; the PBA is read-only (PCIe r5.0 7.7.2.6). */
        if (!vn_util_range_ok(offset, count, MSIX_BAR_SIZE)) {
            return -EINVAL;
        }
        if (offset < MSIX_TABLE_END) {
            memcpy(p->msix + offset, buf, MIN((uint64_t)count, MSIX_TABLE_END - offset));
        }
        return 0;
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_DB_BAR:
        return vn_epf_db_write(epf, p->index, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR:
    case VFIO_PCI_BAR0_REGION_INDEX + VN_EPF_WINDOW_BAR + 1:
        return vn_epf_window_write(epf, p->index,
                                   index - VFIO_PCI_BAR0_REGION_INDEX - VN_EPF_WINDOW_BAR, offset,
                                   buf, count);
    default:
        return -EINVAL;
    }
}

/* DEVICE_RESET, and the server's reset when a client goes. */
static int op_reset(void *opaque)
{
    port_reset(opaque);
    return 0;
}

static void op_client_new(void *opaque)
{
    NtbPort *p = opaque;

    vn_epf_set_connected(p->dev->epf, p->index, true);
}

static void op_client_gone(void *opaque)
{
    NtbPort *p = opaque;

    vn_epf_set_connected(p->dev->epf, p->index, false);
}

const VnDeviceOps vn_ntbdev_ops = {
    .region_read = op_region_read,
    .region_write = op_region_write,
    .reset = op_reset,
    .client_new = op_client_new,
    .client_gone = op_client_gone,
};
