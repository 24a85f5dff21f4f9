/*
 * The `type1` IOMMU (backend.h, backend-type1.h): the vfio backend's device
 * reaches the borrower's memory through a VFIO container of its own with a
 * TYPE1v2 IOMMU (Debian's kernels have no iommufd), which its IOMMU group
 * joins, so the device reaches only what dma_map gave it.
 *
 * DMA maps mmap the window's fd and hand that mapping to VFIO_IOMMU_MAP_DMA
 * at the guest-physical IOVA, after checking it against the IOMMU's usable
 * ranges (a refusal says which range it hit: last_error).  Unmaps go to
 * VFIO_IOMMU_UNMAP_DMA one mapping at a time, the IOMMU before our mmap.
 * The kernel answers every call at once.
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lending/backend-type1.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

/* The IOMMU's usable IOVA ranges we keep (type1 reports a handful). */
#define VN_TYPE1_MAX_RANGES 16
/* DMA mappings a borrower may hold at once (guest RAM is a few regions). */
#define VN_TYPE1_MAX_MAPS 256
/* The IOMMU's info with its capability chain fits in this. */
#define VN_TYPE1_INFO_MAX 4096

typedef struct Type1Map {
    uint64_t iova;
    uint64_t size;
    void *vaddr;
} Type1Map;

struct VnBackendType1 {
    char bdf[16]; /* the function whose group joined: named in refusals */
    int container;
    int group;
    struct vfio_iova_range ranges[VN_TYPE1_MAX_RANGES];
    uint32_t nr_ranges;
    GArray *maps;  /* Type1Map */
    char why[160]; /* the last refusal in words ("" none) */
};

void vn_backend_type1_free(VnBackendType1 *t)
{
    if (t == NULL) {
        return;
    }
    if (t->maps != NULL) {
        for (guint i = 0; i < t->maps->len; i++) {
            Type1Map *m = &g_array_index(t->maps, Type1Map, i);

            munmap(m->vaddr, m->size);
        }
        g_array_unref(t->maps);
    }
    vn_util_close_fd(&t->group);
    vn_util_close_fd(&t->container);
    g_free(t);
}

int vn_backend_type1_group(VnBackendType1 *t)
{
    return t->group;
}

/* The IOMMU's usable IOVA ranges (capability IOVA_RANGE); none kept means
 * the kernel did not say, and every IOVA is tried. */
static void read_ranges(VnBackendType1 *t)
{
    g_autofree uint8_t *buf = g_malloc0(VN_TYPE1_INFO_MAX);
    struct vfio_iommu_type1_info *info = (void *)buf;
    uint32_t off;

    info->argsz = VN_TYPE1_INFO_MAX;
    if (ioctl(t->container, VFIO_IOMMU_GET_INFO, info) < 0 ||
        !(info->flags & VFIO_IOMMU_INFO_CAPS) || info->argsz > VN_TYPE1_INFO_MAX) {
        return;
    }
    for (off = info->cap_offset;
         off != 0 && off + sizeof(struct vfio_info_cap_header) <= VN_TYPE1_INFO_MAX;) {
        struct vfio_info_cap_header *h = (void *)(buf + off);

        if (h->id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE &&
            off + sizeof(struct vfio_iommu_type1_info_cap_iova_range) <= VN_TYPE1_INFO_MAX) {
            struct vfio_iommu_type1_info_cap_iova_range *r = (void *)h;
            uint32_t n = r->nr_iovas;

            if (off + sizeof(*r) + (uint64_t)n * sizeof(r->iova_ranges[0]) > VN_TYPE1_INFO_MAX) {
                return;
            }
            t->nr_ranges = MIN(n, VN_TYPE1_MAX_RANGES);
            memcpy(t->ranges, r->iova_ranges, t->nr_ranges * sizeof(t->ranges[0]));
        }
        if (h->next <= off) {
            break; /* a chain goes forward */
        }
        off = h->next;
    }
}

VnBackendType1 *vn_backend_type1_new(const char *bdf, int group_id, int group, GError **error)
{
    struct vfio_group_status status = { .argsz = sizeof(status) };
    g_autoptr(VnBackendType1) t = g_new0(VnBackendType1, 1);

    t->container = -1;
    t->group = group;
    g_strlcpy(t->bdf, bdf, sizeof(t->bdf));
    t->maps = g_array_new(FALSE, FALSE, sizeof(Type1Map));
    if (t->group < 0) {
        g_autofree char *group_path = g_strdup_printf("/dev/vfio/%d", group_id);

        t->group = open(group_path, O_RDWR | O_CLOEXEC);
        if (t->group < 0) {
            g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                        "%s (IOMMU group of %s): %s (is it bound to vfio-pci, and not in use?)",
                        group_path, bdf, g_strerror(errno));
            return NULL;
        }
    }
    /* /dev/vfio/vfio is everyone's (0666): an unprivileged worker opens its own. */
    t->container = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    if (t->container < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                    "/dev/vfio/vfio: %s (is vfio-pci loaded?)", g_strerror(errno));
        return NULL;
    }
    if (ioctl(t->container, VFIO_GET_API_VERSION) != VFIO_API_VERSION ||
        ioctl(t->container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) <= 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "this kernel's VFIO has no type1v2 IOMMU");
        return NULL;
    }
    if (ioctl(t->group, VFIO_GROUP_GET_STATUS, &status) < 0 ||
        !(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_BUSY,
                    "IOMMU group %d of %s is not viable: every device in it must be bound "
                    "to vfio-pci (see /sys/kernel/iommu_groups/%d/devices)",
                    group_id, bdf, group_id);
        return NULL;
    }
    if (ioctl(t->group, VFIO_GROUP_SET_CONTAINER, &t->container) < 0 ||
        ioctl(t->container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) < 0) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(errno),
                    "IOMMU group %d of %s: no IOMMU domain: %s (interrupt remapping off?)",
                    group_id, bdf, g_strerror(errno));
        return NULL;
    }
    read_ranges(t);
    return g_steal_pointer(&t);
}

/* [iova, iova + size) within one usable range, else why not (the message
 * names both). */
static int iova_check(VnBackendType1 *t, uint64_t iova, uint64_t size)
{
    uint64_t last = iova + size - 1;

    if (t->nr_ranges == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < t->nr_ranges; i++) {
        if (iova >= t->ranges[i].start && last <= t->ranges[i].end) {
            return 0;
        }
    }
    for (uint32_t i = 0; i + 1 < t->nr_ranges; i++) {
        if (last > t->ranges[i].end && iova < t->ranges[i + 1].start) {
            g_snprintf(t->why, sizeof(t->why),
                       "guest memory [0x%" PRIx64 ", 0x%" PRIx64 "] "
                       "collides with the IOMMU's reserved range [0x%" PRIx64 ", 0x%" PRIx64
                       "] of %s",
                       iova, last, (uint64_t)t->ranges[i].end + 1,
                       (uint64_t)t->ranges[i + 1].start - 1, t->bdf);
            g_warning("vfio %s", t->why);
            return -ERANGE;
        }
    }
    g_snprintf(t->why, sizeof(t->why),
               "guest memory [0x%" PRIx64 ", 0x%" PRIx64 "] is "
               "outside the IOMMU's usable addresses for %s",
               iova, last, t->bdf);
    return -ERANGE;
}

static int type1_dma_map(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                         uint32_t prot)
{
    VnBackendType1 *t = iommu;
    struct vfio_iommu_type1_dma_map m = { .argsz = sizeof(m) };
    int mprot = 0, ret;
    Type1Map map;
    void *vaddr;

    t->why[0] = '\0'; /* an earlier map's reason is not this one's */
    if (fd < 0 || size == 0 || iova + size < iova || t->maps->len >= VN_TYPE1_MAX_MAPS) {
        return -EINVAL;
    }
    if ((ret = iova_check(t, iova, size)) < 0) {
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
    if (ioctl(t->container, VFIO_IOMMU_MAP_DMA, &m) < 0) {
        ret = -errno;
        munmap(vaddr, size);
        return ret;
    }
    map = (Type1Map){ .iova = iova, .size = size, .vaddr = vaddr };
    g_array_append_val(t->maps, map);
    return 0;
}

static const char *type1_last_error(void *iommu)
{
    VnBackendType1 *t = iommu;

    return t->why[0] != '\0' ? t->why : NULL;
}

static int type1_dma_unmap(void *iommu, uint64_t iova, uint64_t size, bool all)
{
    VnBackendType1 *t = iommu;
    int ret = 0;

    for (guint i = t->maps->len; i-- > 0;) {
        Type1Map *m = &g_array_index(t->maps, Type1Map, i);
        struct vfio_iommu_type1_dma_unmap u = { .argsz = sizeof(u),
                                                .iova = m->iova,
                                                .size = m->size };

        if (!all && (m->iova < iova || m->iova + m->size > iova + size)) {
            continue;
        }
        /* The IOMMU first: the device must not reach pages we give back. */
        if (ioctl(t->container, VFIO_IOMMU_UNMAP_DMA, &u) < 0) {
            ret = -errno;
            continue;
        }
        munmap(m->vaddr, m->size);
        g_array_remove_index_fast(t->maps, i);
    }
    return ret;
}

const VnBackendIommuOps vn_backend_type1 = {
    .name = "type1",
    .dma_map = type1_dma_map,
    .dma_unmap = type1_dma_unmap,
    .last_error = type1_last_error,
};
