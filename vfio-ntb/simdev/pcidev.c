/*
 * The simulated PCIe NVMe device behind the vfio-user server (see pcidev.h).
 *
 * BAR0 is a memfd: the client maps it (GET_REGION_INFO hands out the fd with
 * a sparse-mmap capability), so the guest's register and doorbell writes
 * land in our mapping without a message, and the engine thread polls them.
 * QEMU may still access BAR0 by REGION_READ/WRITE (before it maps, or when
 * mapping failed); those accesses go to the same memory and kick the engine.
 *
 * The CMB (BAR2, optional) is a memfd offered the same way: a lender exports
 * it to borrowers as a window and a peer device DMAs straight into it.
 * Nothing polls it; its trapped accesses are plain copies of the same bytes.
 */
#define G_LOG_DOMAIN "vfio-ntb.simdev"

#include "pcidev.h"

#include "common/peerfd.h"
#include "common/util.h"
#include "engine.h"
#include "pcicfg.h"

#include <errno.h>
#include <gio/gio.h>
#include <linux/vfio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct VnPciDev {
    char *serial; /* names the device in messages */
    VnDeviceInfo info;
    int bar0_fd;
    uint8_t *bar0;                     /* mmap of bar0_fd, shared */
    int cmb_fd;                        /* -1: no CMB */
    uint8_t *cmb;                      /* mmap of cmb_fd, shared with the guest and peers */
    uint64_t cmb_size;                 /* bytes, 0 without a CMB */
    bool trap_bars;                    /* VnPciDevParams.trap_bars */
    uint8_t bar4[VN_PCIDEV_BAR4_SIZE]; /* MSI-X table + PBA storage */
    VnPciCfgIrqMode irq_mode;
    uint32_t vectors; /* MSI-X or MSI vectors offered */
    VnPciCfg *cfg;
    VnNvme *nvme;
    VnEngine *engine; /* NULL unless started */
};

/* PCIe r5.0 7.7.2.5: after reset every vector is masked (Vector Control
 * bit 0 = 1); address and data are undefined, we use 0.  PBA: nothing
 * pending. */
static void bar4_reset(VnPciDev *d)
{
    memset(d->bar4, 0, sizeof(d->bar4));
    if (d->irq_mode != VN_PCICFG_IRQ_MSIX) {
        return;
    }
    for (uint32_t v = 0; v < d->vectors; v++) {
        d->bar4[VN_PCIDEV_MSIX_TABLE + v * VN_PCICFG_MSIX_ENTRY_SIZE + 12] = 1;
    }
}

static void function_reset(VnPciDev *d)
{
    vn_nvme_reset(d->nvme);
    vn_pcicfg_reset(d->cfg);
    bar4_reset(d);
}

static void kick(VnPciDev *d)
{
    if (d->engine != NULL) {
        vn_engine_kick(d->engine);
    }
}

/* BAR0 by message: dword accesses are atomic like the guest's own. */
static void bar0_read(VnPciDev *d, uint64_t off, uint8_t *buf, uint32_t count)
{
    if (off % 4 == 0 && count % 4 == 0) {
        for (uint32_t i = 0; i < count; i += 4) {
            uint32_t v = __atomic_load_n((uint32_t *)(void *)(d->bar0 + off + i), __ATOMIC_ACQUIRE);

            memcpy(buf + i, &v, 4);
        }
    } else {
        memcpy(buf, d->bar0 + off, count);
    }
}

static void bar0_write(VnPciDev *d, uint64_t off, const uint8_t *buf, uint32_t count)
{
    if (off % 4 == 0 && count % 4 == 0) {
        for (uint32_t i = 0; i < count; i += 4) {
            uint32_t v;

            memcpy(&v, buf + i, 4);
            __atomic_store_n((uint32_t *)(void *)(d->bar0 + off + i), v, __ATOMIC_RELEASE);
        }
    } else {
        memcpy(d->bar0 + off, buf, count);
    }
}

static int op_region_read(void *opaque, uint32_t index, uint64_t offset, void *buf, uint32_t count)
{
    VnPciDev *d = opaque;

    /* The server checked the range against our sizes; check again, it is
     * cheap and this is peer input. */
    if (index >= d->info.num_regions ||
        !vn_util_range_ok(offset, count, d->info.regions[index].size)) {
        return -EINVAL;
    }
    switch (index) {
    case VFIO_PCI_CONFIG_REGION_INDEX:
        return vn_pcicfg_read(d->cfg, offset, buf, count);
    case VFIO_PCI_BAR0_REGION_INDEX:
        bar0_read(d, offset, buf, count);
        return 0;
    case VFIO_PCI_BAR2_REGION_INDEX:
        /* Without a CMB its size is 0: the range check refused already. */
        memcpy(buf, d->cmb + offset, count);
        return 0;
    case VFIO_PCI_BAR4_REGION_INDEX:
        /* In MSI mode its size is 0: the range check refused already. */
        memcpy(buf, d->bar4 + offset, count);
        return 0;
    default:
        return -EINVAL;
    }
}

static int op_region_write(void *opaque, uint32_t index, uint64_t offset, const void *buf,
                           uint32_t count)
{
    VnPciDev *d = opaque;
    uint64_t table_end = VN_PCIDEV_MSIX_TABLE + (uint64_t)d->vectors * VN_PCICFG_MSIX_ENTRY_SIZE;
    int ret;

    if (index >= d->info.num_regions ||
        !vn_util_range_ok(offset, count, d->info.regions[index].size)) {
        return -EINVAL;
    }
    switch (index) {
    case VFIO_PCI_CONFIG_REGION_INDEX:
        ret = vn_pcicfg_write(d->cfg, offset, buf, count);
        if (vn_pcicfg_take_flr(d->cfg)) {
            /* PCIe r5.0 6.6.2: the guest asked for an FLR; it waits 100 ms
             * and restores the config space itself. */
            g_info("device nvme %s: function level reset", d->serial);
            function_reset(d);
        }
        kick(d); /* e.g. Bus Master Enable lets waiting commands run */
        return ret;
    case VFIO_PCI_BAR0_REGION_INDEX:
        bar0_write(d, offset, buf, count);
        kick(d);
        return 0;
    case VFIO_PCI_BAR2_REGION_INDEX:
        memcpy(d->cmb + offset, buf, count);
        return 0;
    case VFIO_PCI_BAR4_REGION_INDEX:
        /* The table is read-write storage; the PBA is read-only (PCIe r5.0
         * 7.7.2.6) and the rest of the BAR is reserved: writes are dropped. */
        if (offset < table_end) {
            uint64_t n = MIN((uint64_t)count, table_end - offset);

            memcpy(d->bar4 + offset, buf, n);
        }
        return 0;
    default:
        return -EINVAL;
    }
}

static void op_irqs_changed(void *opaque, uint32_t index)
{
    kick(opaque);
}

/* DEVICE_RESET, the server's reset when a client goes, and FLR: the
 * controller, config space and MSI-X storage go back to power-on values
 * (the namespace's data stays).  The controller lock in vn_nvme_reset()
 * waits for a poll pass in progress, so no DMA follows. */
static int op_reset(void *opaque)
{
    function_reset(opaque);
    return 0;
}

static void op_client_new(void *opaque)
{
    VnPciDev *d = opaque;

    g_info("device nvme %s: client connected", d->serial);
}

static void op_client_gone(void *opaque)
{
    VnPciDev *d = opaque;
    VnNvmeStats st;
    int ret;

    /* The server already reset us; the namespace stays for the next client,
     * but what the last one wrote should be on disk now. */
    ret = vn_nvme_flush(d->nvme);
    if (ret < 0) {
        g_warning("device nvme %s: flush after disconnect: %s", d->serial, g_strerror(-ret));
    }
    vn_nvme_stats(d->nvme, &st);
    g_info("device nvme %s: client gone; so far %" G_GUINT64_FORMAT " admin and %" G_GUINT64_FORMAT
           " I/O commands (%" G_GUINT64_FORMAT " errors, %" G_GUINT64_FORMAT " interrupts)",
           d->serial, st.admin_cmds, st.io_cmds, st.errors, st.irqs);
}

const VnDeviceOps vn_pcidev_ops = {
    .region_read = op_region_read,
    .region_write = op_region_write,
    .irqs_changed = op_irqs_changed,
    .reset = op_reset,
    .client_new = op_client_new,
    .client_gone = op_client_gone,
};

/* A BAR of ours in a memfd: READ|WRITE, and MMAP with one sparse area over
 * all of it unless trap_bars keeps the fd back. */
static void memory_region(VnPciDev *d, VnRegion *r, int fd, uint64_t size)
{
    r->size = size;
    r->flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    if (!d->trap_bars) {
        r->flags |= VFIO_REGION_INFO_FLAG_MMAP;
        r->mmap_fd = fd;
        r->mmap_offset = 0;
        r->nr_sparse = 1;
        r->sparse[0] = (VnSparseArea){ .offset = 0, .size = size };
    }
}

static void info_build(VnPciDev *d)
{
    VnDeviceInfo *i = &d->info;

    memset(i, 0, sizeof(*i));
    i->flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
    i->num_regions = VFIO_PCI_NUM_REGIONS;
    for (uint32_t r = 0; r < VN_MAX_REGIONS; r++) {
        i->regions[r].mmap_fd = -1;
    }
    memory_region(d, &i->regions[VFIO_PCI_BAR0_REGION_INDEX], d->bar0_fd, VN_NVME_BAR0_SIZE);
    if (d->cmb != NULL) {
        memory_region(d, &i->regions[VFIO_PCI_BAR2_REGION_INDEX], d->cmb_fd, d->cmb_size);
    }
    if (d->irq_mode == VN_PCICFG_IRQ_MSIX) {
        i->regions[VFIO_PCI_BAR4_REGION_INDEX] = (VnRegion){
            .size = VN_PCIDEV_BAR4_SIZE,
            .mmap_fd = -1,
            .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE,
        };
    }
    i->regions[VFIO_PCI_CONFIG_REGION_INDEX] = (VnRegion){
        .size = VN_PCICFG_SIZE,
        .mmap_fd = -1,
        .flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE,
    };

    i->num_irqs = VFIO_PCI_NUM_IRQS;
    i->irq_count[VFIO_PCI_INTX_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_INTX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    if (d->irq_mode == VN_PCICFG_IRQ_MSI) {
        /* QEMU asks for 2^Multiple Message Enable of them (vfio_msi_enable). */
        i->irq_count[VFIO_PCI_MSI_IRQ_INDEX] = d->vectors;
        i->irq_flags[VFIO_PCI_MSI_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
    } else {
        i->irq_count[VFIO_PCI_MSIX_IRQ_INDEX] = d->vectors;
        i->irq_flags[VFIO_PCI_MSIX_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE;
    }
    /* Linux's vfio-pci reports one ERR vector for every PCIe function
     * (vfio_pci_get_irq_count); QEMU warns "Could not enable error recovery"
     * for any other count.  We never signal it: we have no AER errors. */
    i->irq_count[VFIO_PCI_ERR_IRQ_INDEX] = 1;
    i->irq_flags[VFIO_PCI_ERR_IRQ_INDEX] = VFIO_IRQ_INFO_EVENTFD;
}

/* PCI 3.0 6.8.1.3: MSI offers a power of two, at most 32. */
static uint32_t msi_vectors_for(uint32_t vectors)
{
    uint32_t n = 1;

    while (n * 2 <= vectors && n * 2 <= VN_PCICFG_MAX_MSI_VECTORS) {
        n *= 2;
    }
    return n;
}

/* The memory of BAR @bar: a new memfd of @size bytes (zeros) in *fd, mapped
 * at *map.  On failure *map stays NULL and *fd is -1 or the memfd, which
 * vn_pcidev_free() closes. */
static bool bar_memfd(VnPciDev *d, unsigned bar, uint64_t size, int *fd, uint8_t **map,
                      GError **error)
{
    g_autofree char *name = g_strdup_printf("vfio-ntb-simdev-bar%u", bar);
    void *p;

    /* Sealed: the lender exports it as a fabric segment, which must be. */
    *fd = vn_peerfd_memfd_new(name, size);
    if (*fd < 0) {
        int err = -*fd;

        *fd = -1;
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(err),
                    "device nvme %s: BAR%u memfd: %s", d->serial, bar, g_strerror(err));
        return false;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;

        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(err), "device nvme %s: BAR%u mmap: %s",
                    d->serial, bar, g_strerror(err));
        return false;
    }
    *map = p;
    return true;
}

VnPciDev *vn_pcidev_new(const VnPciDevParams *params, GError **error)
{
    g_autoptr(VnPciDev) d = g_new0(VnPciDev, 1);
    VnPciCfgParams cp = {
        .vendor_id = VN_PCIDEV_VENDOR_ID,
        .device_id = VN_PCIDEV_DEVICE_ID,
        .subsys_vendor_id = VN_PCIDEV_VENDOR_ID,
        .subsys_id = VN_PCIDEV_DEVICE_ID,
        .revision = 1,
        .class_code = VN_PCIDEV_CLASS,
        .bars = { [0] = { .size = VN_NVME_BAR0_SIZE, .is64 = true },
                  [4] = { .size = VN_PCIDEV_BAR4_SIZE } },
        .irq_mode = params->irq_mode,
        .msix_vectors = params->vectors,
        .msix_bir = 4,
        .msix_table_offset = VN_PCIDEV_MSIX_TABLE,
        .msix_pba_offset = VN_PCIDEV_MSIX_PBA,
    };
    VnNvmeParams np = {
        .backing = params->backing,
        .size = params->size,
        .serial = params->serial,
        .io_queues = MIN(params->vectors - 1, VN_NVME_MAX_IO_QUEUES),
        .pci_vendor_id = VN_PCIDEV_VENDOR_ID,
        .pci_subsys_vendor_id = VN_PCIDEV_VENDOR_ID,
    };

    d->bar0_fd = -1;
    d->cmb_fd = -1;
    d->trap_bars = params->trap_bars;
    d->serial = g_strdup(params->serial != NULL ? params->serial : "?");
    if (params->vectors < VN_PCIDEV_MIN_VECTORS || params->vectors > VN_PCIDEV_MAX_VECTORS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "device nvme %s: %u vectors (%u..%u)", d->serial, params->vectors,
                    VN_PCIDEV_MIN_VECTORS, VN_PCIDEV_MAX_VECTORS);
        return NULL;
    }
    if (!vn_nvme_cmb_mib_valid(params->cmb_mib)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "device nvme %s: a CMB of %u MiB (a power of two from %u to %u, or 0 for none)",
                    d->serial, params->cmb_mib, VN_NVME_MIN_CMB_MIB, VN_NVME_MAX_CMB_MIB);
        return NULL;
    }
    if ((unsigned)params->irq_mode >= VN_PCICFG_IRQ_LAST) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "device nvme %s: unknown interrupt mode %u", d->serial,
                    (unsigned)params->irq_mode);
        return NULL;
    }
    d->irq_mode = params->irq_mode;
    if (d->irq_mode == VN_PCICFG_IRQ_MSI) {
        d->vectors = msi_vectors_for(params->vectors);
        cp.msi_vectors = d->vectors;
        cp.bars[4].size = 0;
    } else {
        d->vectors = params->vectors;
    }
    /* Create I/O CQ checks the IV against the vectors of this mode. */
    np.vectors = d->vectors;
    if (!bar_memfd(d, 0, VN_NVME_BAR0_SIZE, &d->bar0_fd, &d->bar0, error)) {
        return NULL;
    }
    if (params->cmb_mib != 0) {
        /* BAR2/3 are free: BAR0/1 hold the registers (64-bit), BAR4 the
         * MSI-X table (32-bit) or nothing in MSI mode.  Prefetchable, as
         * plain memory is (PCI 3.0 6.2.5.1), so a guest's firmware may put
         * it above 4 GiB. */
        d->cmb_size = (uint64_t)params->cmb_mib << 20;
        if (!bar_memfd(d, VN_NVME_CMB_BAR, d->cmb_size, &d->cmb_fd, &d->cmb, error)) {
            return NULL;
        }
        cp.bars[VN_NVME_CMB_BAR] =
            (VnPciCfgBar){ .size = d->cmb_size, .is64 = true, .prefetch = true };
        np.cmb_mib = params->cmb_mib;
        np.cmb = d->cmb;
    }
    d->cfg = vn_pcicfg_new(&cp, error);
    if (d->cfg == NULL) {
        return NULL;
    }
    d->nvme = vn_nvme_new(&np, d->bar0, d->cfg, error);
    if (d->nvme == NULL) {
        return NULL;
    }
    bar4_reset(d);
    info_build(d);
    return g_steal_pointer(&d);
}

void vn_pcidev_free(VnPciDev *d)
{
    if (d == NULL) {
        return;
    }
    vn_pcidev_stop(d);
    vn_nvme_free(d->nvme); /* before BAR0 and the CMB go: it points into them */
    vn_pcicfg_free(d->cfg);
    if (d->bar0 != NULL) {
        munmap(d->bar0, VN_NVME_BAR0_SIZE);
    }
    vn_util_close_fd(&d->bar0_fd);
    if (d->cmb != NULL) {
        munmap(d->cmb, d->cmb_size);
    }
    vn_util_close_fd(&d->cmb_fd);
    g_free(d->serial);
    g_free(d);
}

uint32_t vn_pcidev_vectors(VnPciDev *d)
{
    return d->vectors;
}

const VnDeviceInfo *vn_pcidev_info(VnPciDev *d)
{
    return &d->info;
}

static VnEnginePoll engine_poll(void *opaque)
{
    VnPciDev *d = opaque;

    if (vn_nvme_poll_once(d->nvme)) {
        return VN_ENGINE_BUSY;
    }
    /* Disabled (no client, or a driver not loaded): only CC can change,
     * and the host allows CAP.TO for that. */
    return vn_nvme_ready(d->nvme) ? VN_ENGINE_IDLE : VN_ENGINE_DORMANT;
}

bool vn_pcidev_start(VnPciDev *d, VnDma *dma, VnIrqs *irqs, GError **error)
{
    if (d->engine != NULL) {
        return true;
    }
    vn_nvme_attach(d->nvme, dma, irqs);
    d->engine = vn_engine_new("simdev-nvme", engine_poll, d, error);
    if (d->engine == NULL) {
        g_prefix_error(error, "device nvme %s: ", d->serial);
        return false;
    }
    return true;
}

void vn_pcidev_stop(VnPciDev *d)
{
    g_clear_pointer(&d->engine, vn_engine_free);
}

VnNvme *vn_pcidev_nvme(VnPciDev *d)
{
    return d->nvme;
}
