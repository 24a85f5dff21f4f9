/*
 * The `vfio` device backend (backend.h): a physical PCI function bound to
 * vfio-pci on this host, driven through Linux VFIO's type1 uAPI (Debian's
 * kernels have no iommufd).  @where is its address, DDDD:BB:DD.F.
 *
 * Open: the function's IOMMU group must be viable (every device in it
 * bound to vfio-pci or to no driver); it gets a container of its own with a
 * TYPE1v2 IOMMU (backend-type1.c), so the device reaches only what dma_map
 * gave it: that container is the device's IOMMU.  Regions are the device
 * fd's, at the offsets VFIO gives; the VGA range is hidden (reported
 * empty).  Reset: FLR (VFIO_DEVICE_RESET) where the device has one, else a
 * hot reset of its bus when the group holds all it affects.  The kernel
 * answers every call at once: nothing stalls here.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lending/backend-type1.h"
#include "lending/backend.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* A region info with its capability chain fits in this. */
#define VN_VFIO_INFO_MAX 4096

typedef struct Vfio {
    char bdf[16];
    VnBackendType1 *type1; /* its container and group: the device's IOMMU */
    int group_id;          /* its IOMMU group's number */
    int device;
    struct vfio_device_info info;
    uint64_t region_offset[VFIO_PCI_NUM_REGIONS];
    uint64_t region_size[VFIO_PCI_NUM_REGIONS];
} Vfio;

bool vn_backend_vfio_address_ok(const char *s)
{
    unsigned dom, bus, dev, fn;
    char tail;

    return s != NULL && strlen(s) == 12 &&
           sscanf(s, "%4x:%2x:%2x.%1x%c", &dom, &bus, &dev, &fn, &tail) == 4 && dev < 32 &&
           fn < 8 && strspn(s, "0123456789abcdef:.") == 12 && s[4] == ':' && s[7] == ':' &&
           s[10] == '.';
}

int vn_backend_vfio_group(const char *bdf, GError **error)
{
    g_autofree char *dir = g_strdup_printf("/sys/bus/pci/devices/%s", bdf);
    g_autofree char *link = g_strdup_printf("%s/iommu_group", dir);
    g_autofree char *target = g_file_read_link(link, NULL);
    g_autofree char *base = target != NULL ? g_path_get_basename(target) : NULL;
    guint64 n;

    if (!g_file_test(dir, G_FILE_TEST_EXISTS)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND, "no PCI function %s on this host",
                    bdf);
        return -1;
    }
    if (base == NULL || !g_ascii_string_to_unsigned(base, 10, 0, 1 << 20, &n, NULL)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "%s is in no IOMMU group: is the IOMMU on (intel_iommu=on, amd_iommu=on)?",
                    bdf);
        return -1;
    }
    return (int)n;
}

static void vfio_free(Vfio *v)
{
    /* The device first: closing it disables its DMA and interrupts. */
    vn_util_close_fd(&v->device);
    vn_backend_type1_free(v->type1);
    g_free(v);
}

/* The container (ours) joined to the group @group (an open /dev/vfio/N; taken), and the
 * device @where from it. */
static void *vfio_setup(const char *where, int group, GError **error)
{
    Vfio *v;
    int n;

    if (!vn_backend_vfio_address_ok(where)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "\"%.40s\" is not a PCI address (DDDD:BB:DD.F, lower-case hex)",
                    where != NULL ? where : "(null)");
        if (group >= 0) {
            close(group);
        }
        return NULL;
    }
    if ((n = vn_backend_vfio_group(where, error)) < 0) {
        if (group >= 0) {
            close(group);
        }
        return NULL;
    }
    v = g_new0(Vfio, 1);
    v->device = -1;
    v->group_id = n;
    g_strlcpy(v->bdf, where, sizeof(v->bdf));
    v->type1 = vn_backend_type1_new(where, n, group, error);
    if (v->type1 == NULL) {
        goto fail;
    }
    v->device = ioctl(vn_backend_type1_group(v->type1), VFIO_GROUP_GET_DEVICE_FD, where);
    v->info.argsz = sizeof(v->info);
    if (v->device < 0 || ioctl(v->device, VFIO_DEVICE_GET_INFO, &v->info) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno), "%s: %s", where,
                    g_strerror(errno));
        goto fail;
    }
    if (!(v->info.flags & VFIO_DEVICE_FLAGS_PCI) || v->info.num_regions < VFIO_PCI_NUM_REGIONS) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, "%s is not a PCI device to VFIO",
                    where);
        goto fail;
    }
    for (uint32_t i = 0; i < VFIO_PCI_NUM_REGIONS; i++) {
        struct vfio_region_info ri = { .argsz = sizeof(ri), .index = i };

        if (ioctl(v->device, VFIO_DEVICE_GET_REGION_INFO, &ri) == 0) {
            v->region_offset[i] = ri.offset;
            v->region_size[i] = i == VFIO_PCI_VGA_REGION_INDEX ? 0 : ri.size;
        }
    }
    return v;
fail:
    vfio_free(v);
    return NULL;
}

static void *vfio_open(const char *where, unsigned timeout_ms, VnBackendStallFn stall, void *opaque,
                       GError **error)
{
    return vfio_setup(where, -1, error);
}

/* @fd: the function's IOMMU group (/dev/vfio/N), which vfio-ntbd opened for a worker that
 * serves as the worker user. */
static void *vfio_open_fd(int fd, const char *where, unsigned timeout_ms, VnBackendStallFn stall,
                          void *opaque, GError **error)
{
    return vfio_setup(where, fd, error);
}

static void vfio_close(void *dev)
{
    vfio_free(dev);
}

static int vfio_get_info(void *dev, VnWireDeviceInfo *info)
{
    Vfio *v = dev;

    /* What a borrower may use: the PCI regions and interrupt indexes;
     * device-specific extra regions are not lent. */
    *info = (VnWireDeviceInfo){ .argsz = sizeof(*info),
                                .flags = v->info.flags &
                                         (VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET),
                                .num_regions = VFIO_PCI_NUM_REGIONS,
                                .num_irqs = MIN(v->info.num_irqs, VFIO_PCI_NUM_IRQS) };
    return 0;
}

/* Region @index with its capability chain (sparse mmap areas). */
static int vfio_get_region_info(void *dev, uint32_t index, struct vfio_region_info *info, int *fd,
                                struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                                uint32_t *nr_sparse)
{
    Vfio *v = dev;
    g_autofree uint8_t *buf = g_malloc0(VN_VFIO_INFO_MAX);
    struct vfio_region_info *ri = (void *)buf;

    *fd = -1;
    if (nr_sparse != NULL) {
        *nr_sparse = 0;
    }
    if (index >= VFIO_PCI_NUM_REGIONS) {
        return -EINVAL;
    }
    if (index == VFIO_PCI_VGA_REGION_INDEX) {
        /* VGA ranges are the lender host's (and most functions have none:
         * VFIO says EINVAL). */
        *info = (struct vfio_region_info){ .argsz = sizeof(*info), .index = index };
        return 0;
    }
    ri->argsz = VN_VFIO_INFO_MAX;
    ri->index = index;
    if (ioctl(v->device, VFIO_DEVICE_GET_REGION_INFO, ri) < 0) {
        return -errno;
    }
    *info = *ri;
    info->argsz = sizeof(*info);
    info->cap_offset = 0;
    info->flags &= ~(uint32_t)VFIO_REGION_INFO_FLAG_CAPS;
    if ((ri->flags & VFIO_REGION_INFO_FLAG_CAPS) && ri->argsz <= VN_VFIO_INFO_MAX &&
        sparse != NULL) {
        for (uint32_t off = ri->cap_offset;
             off != 0 && off + sizeof(struct vfio_info_cap_header) <= VN_VFIO_INFO_MAX;) {
            struct vfio_info_cap_header *h = (void *)(buf + off);

            if (h->id == VFIO_REGION_INFO_CAP_SPARSE_MMAP &&
                off + sizeof(struct vfio_region_info_cap_sparse_mmap) <= VN_VFIO_INFO_MAX) {
                struct vfio_region_info_cap_sparse_mmap *sm = (void *)h;
                uint32_t n = MIN(sm->nr_areas, max_sparse);

                if (off + sizeof(*sm) + (uint64_t)n * sizeof(sm->areas[0]) > VN_VFIO_INFO_MAX) {
                    break;
                }
                memcpy(sparse, sm->areas, n * sizeof(sm->areas[0]));
                *nr_sparse = n;
            }
            if (h->next <= off) {
                break;
            }
            off = h->next;
        }
    }
    /* Mappable through the device fd at the region's offset. */
    if (ri->flags & VFIO_REGION_INFO_FLAG_MMAP) {
        *fd = fcntl(v->device, F_DUPFD_CLOEXEC, 0);
    }
    return 0;
}

static int vfio_get_irq_info(void *dev, uint32_t index, struct vfio_irq_info *info)
{
    Vfio *v = dev;

    *info = (struct vfio_irq_info){ .argsz = sizeof(*info), .index = index };
    if (ioctl(v->device, VFIO_DEVICE_GET_IRQ_INFO, info) == 0) {
        return 0;
    }
    /* vfio-pci has the error index only for PCI Express functions (a
     * conventional one, ivshmem or an older NIC, answers EINVAL): no
     * vectors, as for a device without INTx. */
    if (errno == EINVAL && index == VFIO_PCI_ERR_IRQ_INDEX) {
        *info = (struct vfio_irq_info){ .argsz = sizeof(*info), .index = index };
        return 0;
    }
    return -errno;
}

static int vfio_set_irqs(void *dev, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                         const uint8_t *bools, const int *fds)
{
    Vfio *v = dev;
    size_t data = 0;
    g_autofree struct vfio_irq_set *s = NULL;

    if (count > 2048) {
        return -EINVAL; /* MSI-X has at most 2048 vectors */
    }
    if (flags & VFIO_IRQ_SET_DATA_EVENTFD) {
        data = (size_t)count * sizeof(int32_t);
    } else if (flags & VFIO_IRQ_SET_DATA_BOOL) {
        data = count;
    }
    s = g_malloc0(sizeof(*s) + data);
    *s = (struct vfio_irq_set){ .argsz = (uint32_t)(sizeof(*s) + data),
                                .flags = flags,
                                .index = index,
                                .start = start,
                                .count = count };
    if (flags & VFIO_IRQ_SET_DATA_EVENTFD) {
        /* No fds: every vector's eventfd goes (-1).  Zeros would name fd 0, which VFIO
         * refuses (EINVAL): QEMU enabling MSI-X with every vector masked sends that. */
        for (uint32_t i = 0; i < count; i++) {
            ((int32_t *)s->data)[i] = fds != NULL ? fds[i] : -1;
        }
    } else if ((flags & VFIO_IRQ_SET_DATA_BOOL) && bools != NULL) {
        memcpy(s->data, bools, count);
    }
    return ioctl(v->device, VFIO_DEVICE_SET_IRQS, s) < 0 ? -errno : 0;
}

static int region_check(Vfio *v, uint32_t region, uint64_t offset, uint32_t count)
{
    if (region >= VFIO_PCI_NUM_REGIONS ||
        !vn_util_range_ok(offset, count, v->region_size[region])) {
        return -EINVAL;
    }
    return 0;
}

static int vfio_region_read(void *dev, uint32_t region, uint64_t offset, void *buf, uint32_t count)
{
    Vfio *v = dev;
    ssize_t n;

    if (region_check(v, region, offset, count) < 0) {
        return -EINVAL;
    }
    n = pread(v->device, buf, count, (off_t)(v->region_offset[region] + offset));
    return n < 0 ? -errno : (int)n;
}

static int vfio_region_write(void *dev, uint32_t region, uint64_t offset, const void *buf,
                             uint32_t count)
{
    Vfio *v = dev;
    ssize_t n;

    if (region_check(v, region, offset, count) < 0) {
        return -EINVAL;
    }
    n = pwrite(v->device, buf, count, (off_t)(v->region_offset[region] + offset));
    return n < 0 ? -errno : (int)n;
}

/* A bus reset of the function's slot or bus, when every device it affects
 * is in our group (then ours alone to reset). */
static int hot_reset(Vfio *v)
{
    g_autofree uint8_t *buf = g_malloc0(VN_VFIO_INFO_MAX);
    struct vfio_pci_hot_reset_info *info = (void *)buf;
    struct {
        struct vfio_pci_hot_reset r;
        int32_t fd;
    } reset = { .r = { .argsz = sizeof(reset), .count = 1 },
                .fd = vn_backend_type1_group(v->type1) };

    info->argsz = VN_VFIO_INFO_MAX;
    if (ioctl(v->device, VFIO_DEVICE_GET_PCI_HOT_RESET_INFO, info) < 0) {
        return -errno;
    }
    if (info->count > (VN_VFIO_INFO_MAX - sizeof(*info)) / sizeof(info->devices[0])) {
        return -EPROTO;
    }
    for (uint32_t i = 0; i < info->count; i++) {
        if ((int)info->devices[i].group_id != v->group_id) {
            return -EBUSY; /* another group shares the bus */
        }
    }
    return ioctl(v->device, VFIO_DEVICE_PCI_HOT_RESET, &reset) < 0 ? -errno : 0;
}

static int vfio_reset(void *dev)
{
    Vfio *v = dev;

    if ((v->info.flags & VFIO_DEVICE_FLAGS_RESET) && ioctl(v->device, VFIO_DEVICE_RESET) == 0) {
        return 0;
    }
    return hot_reset(v);
}

static bool vfio_stalled(void *dev)
{
    return false;
}

/* The device's own container (type1) is its IOMMU. */
static const VnBackendIommuOps *vfio_iommu(void *dev, void **iommu)
{
    *iommu = ((Vfio *)dev)->type1;
    return &vn_backend_type1;
}

const VnBackendOps vn_backend_vfio = {
    .name = "vfio",
    .open = vfio_open,
    .open_fd = vfio_open_fd,
    .close = vfio_close,
    .get_info = vfio_get_info,
    .get_region_info = vfio_get_region_info,
    .get_irq_info = vfio_get_irq_info,
    .set_irqs = vfio_set_irqs,
    .region_read = vfio_region_read,
    .region_write = vfio_region_write,
    .reset = vfio_reset,
    .stalled = vfio_stalled,
    .iommu = vfio_iommu,
};
