/*
 * The `vfio` device backend (backend.h): a physical PCI function bound to
 * vfio-pci on this host, driven through Linux VFIO's type1 uAPI (Debian's
 * kernels have no iommufd).  @where is its address, DDDD:BB:DD.F.
 *
 * Open: the function's IOMMU group must be viable (every device in it
 * bound to vfio-pci or to no driver); it gets a container of its own with a
 * TYPE1v2 IOMMU, so the device reaches only what dma_map gave it.  Regions
 * are the device fd's, at the offsets VFIO gives; the VGA range is hidden
 * (reported empty).  DMA maps mmap the window's fd and hand that mapping to
 * VFIO_IOMMU_MAP_DMA at the guest-physical IOVA, after checking it against
 * the IOMMU's usable ranges.  Reset: FLR (VFIO_DEVICE_RESET) where the
 * device has one, else a hot reset of its bus when the group holds all it
 * affects.  The kernel answers every call at once: nothing stalls here.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lending/backend.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

/* The IOMMU's usable IOVA ranges we keep (type1 reports a handful). */
#define VN_VFIO_MAX_RANGES 16
/* DMA mappings a borrower may hold at once (guest RAM is a few regions). */
#define VN_VFIO_MAX_MAPS 256
/* A region info with its capability chain fits in this. */
#define VN_VFIO_INFO_MAX 4096

typedef struct VfioMap {
    uint64_t iova;
    uint64_t size;
    void *vaddr;
} VfioMap;

typedef struct Vfio {
    char bdf[16];
    int container;
    int group;
    int group_id; /* its IOMMU group's number */
    int device;
    struct vfio_device_info info;
    uint64_t region_offset[VFIO_PCI_NUM_REGIONS];
    uint64_t region_size[VFIO_PCI_NUM_REGIONS];
    struct vfio_iova_range ranges[VN_VFIO_MAX_RANGES];
    uint32_t nr_ranges;
    GArray *maps;  /* VfioMap */
    char why[160]; /* the last refusal in words ("" none) */
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
    if (v->maps != NULL) {
        for (guint i = 0; i < v->maps->len; i++) {
            VfioMap *m = &g_array_index(v->maps, VfioMap, i);

            munmap(m->vaddr, m->size);
        }
        g_array_unref(v->maps);
    }
    /* The device first: closing it disables its DMA and interrupts. */
    vn_util_close_fd(&v->device);
    vn_util_close_fd(&v->group);
    vn_util_close_fd(&v->container);
    g_free(v);
}

/* The IOMMU's usable IOVA ranges (capability IOVA_RANGE); none kept means
 * the kernel did not say, and every IOVA is tried. */
static void read_ranges(Vfio *v)
{
    g_autofree uint8_t *buf = g_malloc0(VN_VFIO_INFO_MAX);
    struct vfio_iommu_type1_info *info = (void *)buf;
    uint32_t off;

    info->argsz = VN_VFIO_INFO_MAX;
    if (ioctl(v->container, VFIO_IOMMU_GET_INFO, info) < 0 ||
        !(info->flags & VFIO_IOMMU_INFO_CAPS) || info->argsz > VN_VFIO_INFO_MAX) {
        return;
    }
    for (off = info->cap_offset;
         off != 0 && off + sizeof(struct vfio_info_cap_header) <= VN_VFIO_INFO_MAX;) {
        struct vfio_info_cap_header *h = (void *)(buf + off);

        if (h->id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE &&
            off + sizeof(struct vfio_iommu_type1_info_cap_iova_range) <= VN_VFIO_INFO_MAX) {
            struct vfio_iommu_type1_info_cap_iova_range *r = (void *)h;
            uint32_t n = r->nr_iovas;

            if (off + sizeof(*r) + (uint64_t)n * sizeof(r->iova_ranges[0]) > VN_VFIO_INFO_MAX) {
                return;
            }
            v->nr_ranges = MIN(n, VN_VFIO_MAX_RANGES);
            memcpy(v->ranges, r->iova_ranges, v->nr_ranges * sizeof(v->ranges[0]));
        }
        if (h->next <= off) {
            break; /* a chain goes forward */
        }
        off = h->next;
    }
}

/* The container (ours) joined to the group @group (an open /dev/vfio/N; taken), and the
 * device @where from it. */
static void *vfio_setup(const char *where, int group, GError **error)
{
    struct vfio_group_status status = { .argsz = sizeof(status) };
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
    v->container = v->device = -1;
    v->group = group;
    v->group_id = n;
    g_strlcpy(v->bdf, where, sizeof(v->bdf));
    v->maps = g_array_new(FALSE, FALSE, sizeof(VfioMap));
    if (v->group < 0) {
        g_autofree char *group_path = g_strdup_printf("/dev/vfio/%d", n);

        v->group = open(group_path, O_RDWR | O_CLOEXEC);
        if (v->group < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "%s (IOMMU group of %s): %s (is it bound to vfio-pci, and not in use?)",
                        group_path, where, g_strerror(errno));
            goto fail;
        }
    }
    /* /dev/vfio/vfio is everyone's (0666): an unprivileged worker opens its own. */
    v->container = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    if (v->container < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                    "/dev/vfio/vfio: %s (is vfio-pci loaded?)", g_strerror(errno));
        goto fail;
    }
    if (ioctl(v->container, VFIO_GET_API_VERSION) != VFIO_API_VERSION ||
        ioctl(v->container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) <= 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "this kernel's VFIO has no type1v2 IOMMU");
        goto fail;
    }
    if (ioctl(v->group, VFIO_GROUP_GET_STATUS, &status) < 0 ||
        !(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY,
                    "IOMMU group %d of %s is not viable: every device in it must be bound "
                    "to vfio-pci (see /sys/kernel/iommu_groups/%d/devices)",
                    n, where, n);
        goto fail;
    }
    if (ioctl(v->group, VFIO_GROUP_SET_CONTAINER, &v->container) < 0 ||
        ioctl(v->container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                    "IOMMU group %d of %s: no IOMMU domain: %s (interrupt remapping off?)", n,
                    where, g_strerror(errno));
        goto fail;
    }
    v->device = ioctl(v->group, VFIO_GROUP_GET_DEVICE_FD, where);
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
    read_ranges(v);
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
    if ((flags & VFIO_IRQ_SET_DATA_EVENTFD) && fds != NULL) {
        for (uint32_t i = 0; i < count; i++) {
            ((int32_t *)s->data)[i] = fds[i];
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

/* [iova, iova + size) within one usable range, else why not (the message
 * names both). */
static int iova_check(Vfio *v, uint64_t iova, uint64_t size)
{
    uint64_t last = iova + size - 1;

    if (v->nr_ranges == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < v->nr_ranges; i++) {
        if (iova >= v->ranges[i].start && last <= v->ranges[i].end) {
            return 0;
        }
    }
    for (uint32_t i = 0; i + 1 < v->nr_ranges; i++) {
        if (last > v->ranges[i].end && iova < v->ranges[i + 1].start) {
            g_snprintf(v->why, sizeof(v->why),
                       "guest memory [0x%" PRIx64 ", 0x%" PRIx64 "] "
                       "collides with the IOMMU's reserved range [0x%" PRIx64 ", 0x%" PRIx64
                       "] of %s",
                       iova, last, (uint64_t)v->ranges[i].end + 1,
                       (uint64_t)v->ranges[i + 1].start - 1, v->bdf);
            g_warning("vfio %s", v->why);
            return -ERANGE;
        }
    }
    g_snprintf(v->why, sizeof(v->why),
               "guest memory [0x%" PRIx64 ", 0x%" PRIx64 "] is "
               "outside the IOMMU's usable addresses for %s",
               iova, last, v->bdf);
    return -ERANGE;
}

static int vfio_dma_map(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                        uint32_t prot)
{
    Vfio *v = iommu;
    struct vfio_iommu_type1_dma_map m = { .argsz = sizeof(m) };
    int mprot = 0, ret;
    VfioMap map;
    void *vaddr;

    if (fd < 0 || size == 0 || iova + size < iova || v->maps->len >= VN_VFIO_MAX_MAPS) {
        return -EINVAL;
    }
    v->why[0] = '\0';
    if ((ret = iova_check(v, iova, size)) < 0) {
        return ret;
    }
    mprot |= (prot & VFIO_DMA_MAP_FLAG_READ) ? PROT_READ : 0;
    mprot |= (prot & VFIO_DMA_MAP_FLAG_WRITE) ? PROT_WRITE : 0;
    vaddr = mmap(NULL, size, mprot != 0 ? mprot : PROT_READ, MAP_SHARED, fd, (off_t)offset);
    if (vaddr == MAP_FAILED) {
        return -errno;
    }
    m.vaddr = (uintptr_t)vaddr;
    m.iova = iova;
    m.size = size;
    m.flags = prot & (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE);
    if (ioctl(v->container, VFIO_IOMMU_MAP_DMA, &m) < 0) {
        ret = -errno;
        munmap(vaddr, size);
        return ret;
    }
    map = (VfioMap){ .iova = iova, .size = size, .vaddr = vaddr };
    g_array_append_val(v->maps, map);
    return 0;
}

static const char *vfio_last_error(void *iommu)
{
    Vfio *v = iommu;

    return v->why[0] != '\0' ? v->why : NULL;
}

static int vfio_dma_unmap(void *iommu, uint64_t iova, uint64_t size, bool all)
{
    Vfio *v = iommu;
    int ret = 0;

    for (guint i = v->maps->len; i-- > 0;) {
        VfioMap *m = &g_array_index(v->maps, VfioMap, i);
        struct vfio_iommu_type1_dma_unmap u = { .argsz = sizeof(u),
                                                .iova = m->iova,
                                                .size = m->size };

        if (!all && (m->iova < iova || m->iova + m->size > iova + size)) {
            continue;
        }
        /* The IOMMU first: the device must not reach pages we give back. */
        if (ioctl(v->container, VFIO_IOMMU_UNMAP_DMA, &u) < 0) {
            ret = -errno;
            continue;
        }
        munmap(m->vaddr, m->size);
        g_array_remove_index_fast(v->maps, i);
    }
    return ret;
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
    } reset = { .r = { .argsz = sizeof(reset), .count = 1 }, .fd = v->group };

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

const VnBackendIommuOps vn_backend_type1 = {
    .name = "type1",
    .dma_map = vfio_dma_map,
    .dma_unmap = vfio_dma_unmap,
    .last_error = vfio_last_error,
};

/* The device's own container (type1) is its IOMMU. */
static const VnBackendIommuOps *vfio_iommu(void *dev, void **iommu)
{
    *iommu = dev;
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
