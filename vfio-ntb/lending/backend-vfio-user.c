/*
 * The `vfio-user` device backend (backend.h): a device some vfio-user server
 * serves, driven through our client (vfio-user/client.h) on its socket.
 *
 * A server is not a host: nothing gave its BARs addresses.  This backend
 * does, as the lending host's firmware would, when it opens the device and
 * after every reset (a reset clears them): a server that decodes accesses
 * by address, such as QEMU's x-remote, ignores a BAR that has none.  The
 * addresses mean nothing outside the server (the borrower keeps the
 * guest's BAR writes to itself), so each BAR simply gets its own naturally
 * aligned range.
 *
 * Its IOMMU is the device server's own (vn_backend_vfio_user_iommu): DMA_MAP hands it the
 * borrower's memory fd, DMA_UNMAP takes it back, through the same client; the server
 * decides what the device reaches.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lending/backend.h"
#include "vfio-user/client.h"

#include <gio/gio.h>
#include <linux/pci_regs.h>
#include <unistd.h>

/* Where the BARs go, in the server's own view. */
#define VN_VFIO_USER_IO_BASE 0x1000ull
#define VN_VFIO_USER_BAR_MAX (1ull << 40)

typedef struct VfioUser {
    VnClient *client;
    VnBackendStallFn stall;
    void *opaque;
} VfioUser;

static void on_stall(void *opaque, VnClientEvent ev, uint16_t cmd, uint64_t ms)
{
    VfioUser *v = opaque;

    if (v->stall != NULL) {
        v->stall(v->opaque,
                 ev == VN_CLIENT_TIMED_OUT ? VN_BACKEND_TIMED_OUT : VN_BACKEND_LATE_ANSWER,
                 vn_wire_cmd_to_string(cmd), ms);
    }
}

static uint64_t bar_size(VfioUser *v, uint32_t index)
{
    struct vfio_region_info ri;
    int fd = -1;

    if (vn_client_get_region_info(v->client, index, &ri, &fd, NULL, 0, NULL) < 0) {
        return 0;
    }
    if (fd >= 0) {
        close(fd);
    }
    return ri.size;
}

static void write_config(VfioUser *v, uint32_t reg, uint32_t value)
{
    uint32_t le = GUINT32_TO_LE(value);

    vn_client_region_write(v->client, VFIO_PCI_CONFIG_REGION_INDEX, reg, &le, 4, false);
}

static void assign_bars(VfioUser *v)
{
    uint64_t next_mem = VN_BACKEND_VFIO_USER_BAR_BASE, next_io = VN_VFIO_USER_IO_BASE;
    VnWireDeviceInfo info;

    if (vn_client_get_info(v->client, &info) < 0) {
        return;
    }
    for (uint32_t i = VFIO_PCI_BAR0_REGION_INDEX;
         i <= VFIO_PCI_BAR5_REGION_INDEX && i < info.num_regions; i++) {
        uint32_t reg = PCI_BASE_ADDRESS_0 + 4 * i, bar = 0;
        uint64_t size = bar_size(v, i), addr;
        bool is64;

        /* BAR sizes are powers of two; anything else, or absurdly large, is left alone. */
        if (size == 0 || (size & (size - 1)) != 0 || size > VN_VFIO_USER_BAR_MAX ||
            vn_client_region_read(v->client, VFIO_PCI_CONFIG_REGION_INDEX, reg, &bar, 4) != 4) {
            continue;
        }
        bar = GUINT32_FROM_LE(bar);
        if (bar & PCI_BASE_ADDRESS_SPACE_IO) {
            if (size > 0x10000) {
                continue;
            }
            addr = (next_io + size - 1) & ~(size - 1);
            next_io = addr + size;
            write_config(v, reg, (uint32_t)addr);
            continue;
        }
        is64 = (bar & PCI_BASE_ADDRESS_MEM_TYPE_MASK) == PCI_BASE_ADDRESS_MEM_TYPE_64;
        addr = (next_mem + size - 1) & ~(size - 1);
        if (!is64 && addr + size > (1ull << 32)) {
            continue;
        }
        next_mem = addr + size;
        write_config(v, reg, (uint32_t)addr);
        if (is64 && i < VFIO_PCI_BAR5_REGION_INDEX) {
            write_config(v, reg + 4, (uint32_t)(addr >> 32));
            i++;
        }
    }
}

static void *vu_ready(VnClient *c, VnBackendStallFn stall, void *opaque)
{
    VfioUser *v;

    if (c == NULL) {
        return NULL;
    }
    v = g_new0(VfioUser, 1);
    *v = (VfioUser){ .client = c, .stall = stall, .opaque = opaque };
    vn_client_set_observer(c, on_stall, v);
    assign_bars(v);
    return v;
}

static void *vu_open(const char *where, unsigned timeout_ms, VnBackendStallFn stall, void *opaque,
                     GError **error)
{
    return vu_ready(vn_client_connect(where, timeout_ms, error), stall, opaque);
}

static void *vu_open_fd(int fd, const char *where, unsigned timeout_ms, VnBackendStallFn stall,
                        void *opaque, GError **error)
{
    return vu_ready(vn_client_new_fd(fd, where, timeout_ms, error), stall, opaque);
}

static void vu_close(void *dev)
{
    VfioUser *v = dev;

    vn_client_free(v->client);
    g_free(v);
}

static int vu_get_info(void *dev, VnWireDeviceInfo *info)
{
    return vn_client_get_info(((VfioUser *)dev)->client, info);
}

static int vu_get_region_info(void *dev, uint32_t index, struct vfio_region_info *info, int *fd,
                              struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                              uint32_t *nr_sparse)
{
    return vn_client_get_region_info(((VfioUser *)dev)->client, index, info, fd, sparse, max_sparse,
                                     nr_sparse);
}

static int vu_get_irq_info(void *dev, uint32_t index, struct vfio_irq_info *info)
{
    return vn_client_get_irq_info(((VfioUser *)dev)->client, index, info);
}

static int vu_set_irqs(void *dev, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                       const uint8_t *bools, const int *fds)
{
    return vn_client_set_irqs(((VfioUser *)dev)->client, flags, index, start, count, bools, fds);
}

static int vu_region_read(void *dev, uint32_t region, uint64_t offset, void *buf, uint32_t count)
{
    return vn_client_region_read(((VfioUser *)dev)->client, region, offset, buf, count);
}

static int vu_region_write(void *dev, uint32_t region, uint64_t offset, const void *buf,
                           uint32_t count)
{
    return vn_client_region_write(((VfioUser *)dev)->client, region, offset, buf, count, false);
}

static int vu_reset(void *dev)
{
    VfioUser *v = dev;
    int ret = vn_client_reset(v->client);

    if (ret == 0) {
        assign_bars(v);
    }
    return ret;
}

static bool vu_stalled(void *dev)
{
    VnClientStats cs;

    vn_client_stats(((VfioUser *)dev)->client, &cs);
    return cs.stalled;
}

static int vu_hangup_fd(void *dev)
{
    return vn_client_fd(((VfioUser *)dev)->client);
}

/* The IOMMU's object is the device's client: vfio-user.rst's DMA_MAP and DMA_UNMAP. */
static const VnBackendIommuOps *vu_iommu(void *dev, void **iommu)
{
    *iommu = ((VfioUser *)dev)->client;
    return &vn_backend_vfio_user_iommu;
}

static int vu_dma_map(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                      uint32_t prot)
{
    return vn_client_dma_map(iommu, iova, size, offset, prot, fd);
}

static int vu_dma_unmap(void *iommu, uint64_t iova, uint64_t size, bool all)
{
    return vn_client_dma_unmap(iommu, iova, size, all);
}

const VnBackendIommuOps vn_backend_vfio_user_iommu = {
    .name = "vfio-user",
    .dma_map = vu_dma_map,
    .dma_unmap = vu_dma_unmap,
};

const VnBackendOps vn_backend_vfio_user = {
    .name = "vfio-user",
    .open = vu_open,
    .open_fd = vu_open_fd,
    .close = vu_close,
    .get_info = vu_get_info,
    .get_region_info = vu_get_region_info,
    .get_irq_info = vu_get_irq_info,
    .set_irqs = vu_set_irqs,
    .region_read = vu_region_read,
    .region_write = vu_region_write,
    .reset = vu_reset,
    .stalled = vu_stalled,
    .hangup_fd = vu_hangup_fd,
    .iommu = vu_iommu,
};
