/*
 * The seam between a lender and the device it lends.  The lender reaches
 * its device only through a VnBackendOps table, checked when it is chosen:
 *
 *   vfio-user  a device some vfio-user server serves (our simulated NVMe,
 *              QEMU's x-remote), reached through its socket
 *              (backend-vfio-user.c)
 *   vfio       a PCI function of this host bound to vfio-pci, reached
 *              through Linux VFIO (type1) at its address DDDD:BB:DD.F
 *              (backend-vfio.c)
 *
 * The calls are VFIO's device uAPI, as the vfio-user protocol carries it
 * (linux/vfio.h structs, VFIO_PCI_*_INDEX regions and interrupt indexes),
 * so nothing above the seam knows which backend drives the device.  The
 * backend is a peer like any other (a device server, a device): what it
 * answers is checked by the lender before it reaches the borrower.
 *
 * The seam has two tables, as QEMU's VFIO has VFIODeviceIOOps and
 * VFIOIOMMUClass: VnBackendOps is the device's I/O (regions, config,
 * interrupts, reset), VnBackendIommuOps the IOMMU that gives the device the
 * borrower's memory (DMA map and unmap).  An open device names its IOMMU
 * (VnBackendOps.iommu): a type1 container of its own for vfio
 * (backend-type1.c), the device server's own DMA_MAP and DMA_UNMAP for
 * vfio-user.
 *
 * Errors: -errno (-ETIMEDOUT when the device gave no answer within the
 * timeout it was opened with).  Threads: one thread at a time.
 */
#ifndef VN_BACKEND_H
#define VN_BACKEND_H

#include "vfio-user/wire.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum VnBackendStall {
    VN_BACKEND_TIMED_OUT,   /* @ms: the timeout */
    VN_BACKEND_LATE_ANSWER, /* @ms: how long after the command its answer came */
} VnBackendStall;

/* A command to the device (@what names it) stalled; told from inside the
 * call that saw it. */
typedef void (*VnBackendStallFn)(void *opaque, VnBackendStall ev, const char *what, uint64_t ms);

/*
 * A device's IOMMU: what makes the borrower's memory reachable by the device
 * (its DMA), and unreachable again.  @iommu is the object VnBackendOps.iommu
 * gave with the table (the backend's, valid until its device is closed).
 */
typedef struct VnBackendIommuOps {
    const char *name;
    /* Guest memory at @iova for the device: @size bytes of @fd (borrowed)
     * from @offset, @prot VFIO_DMA_MAP_FLAG_READ/_WRITE. */
    int (*dma_map)(void *iommu, uint64_t iova, uint64_t size, int fd, uint64_t offset,
                   uint32_t prot);
    /* Every mapping (@all), or every one inside [@iova, @iova + @size) (vfio type1
     * semantics); when it returns 0 the device reaches none of them.  On an error those it
     * could not unmap stay mapped (type1 goes on with the others: the fence needs them
     * gone). */
    int (*dma_unmap)(void *iommu, uint64_t iova, uint64_t size, bool all);
    /* Optional: why the last call that failed did, in words the borrower
     * may see ("guest memory [a, b] collides with the IOMMU's reserved range
     * [c, d]"), or NULL when there is nothing to add to its errno. */
    const char *(*last_error)(void *iommu);
} VnBackendIommuOps;

typedef struct VnBackendOps {
    const char *name;
    /*
     * Reach the device @where names (what it is depends on the backend: a
     * socket path for vfio-user) and make it ready to be described; every
     * command answers within @timeout_ms.  @stall (may be NULL) hears of
     * commands that did not.  The device, or NULL with @error.
     */
    void *(*open)(const char *where, unsigned timeout_ms, VnBackendStallFn stall, void *opaque,
                  GError **error);
    /* Optional: the same over @fd, a connection to @where someone else made (a worker
     * without the rights to reach it: vfio-ntbd dials for it); @fd is taken. */
    void *(*open_fd)(int fd, const char *where, unsigned timeout_ms, VnBackendStallFn stall,
                     void *opaque, GError **error);
    void (*close)(void *dev);
    int (*get_info)(void *dev, VnWireDeviceInfo *info);
    /* *fd: the region's mmap fd or -1 (the caller owns it); up to
     * @max_sparse sparse areas, their number in *nr_sparse. */
    int (*get_region_info)(void *dev, uint32_t index, struct vfio_region_info *info, int *fd,
                           struct vfio_region_sparse_mmap_area *sparse, uint32_t max_sparse,
                           uint32_t *nr_sparse);
    int (*get_irq_info)(void *dev, uint32_t index, struct vfio_irq_info *info);
    /* @fds (borrowed): count eventfds for DATA_EVENTFD (NULL: each vector's goes, as a -1
     * would say), else NULL. */
    int (*set_irqs)(void *dev, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                    const uint8_t *bools, const int *fds);
    /* Bytes read or written, or -errno. */
    int (*region_read)(void *dev, uint32_t region, uint64_t offset, void *buf, uint32_t count);
    int (*region_write)(void *dev, uint32_t region, uint64_t offset, const void *buf,
                        uint32_t count);
    /* The device as it came out of its reset, ready to be described again. */
    int (*reset)(void *dev);
    /* Its last command got no answer (nothing answered since). */
    bool (*stalled)(void *dev);
    /* Optional: an fd that hangs up when the device goes away on its own (a device
     * server's socket: the server died), for the lender to watch between commands; -1 or
     * absent when nothing can go (a VFIO device fd).  Only watched, never read. */
    int (*hangup_fd)(void *dev);
    /* The device's IOMMU: its table, and in *@iommu the object that table's calls take
     * (both the device's, until it is closed). */
    const VnBackendIommuOps *(*iommu)(void *dev, void **iommu);
} VnBackendOps;

extern const VnBackendOps vn_backend_vfio_user;
extern const VnBackendOps vn_backend_vfio;
/* Their IOMMUs: the device server's DMA_MAP and DMA_UNMAP (backend-vfio-user.c), a VFIO
 * type1 container (backend-type1.c). */
extern const VnBackendIommuOps vn_backend_vfio_user_iommu;
extern const VnBackendIommuOps vn_backend_type1;
/* Where vfio-user gives a server's first memory BAR its address (a server
 * is not a host: nothing else would; backend-vfio-user.c). */
#define VN_BACKEND_VFIO_USER_BAR_BASE 0xc0000000ull

/* @s is a PCI address as vfio's @where takes it: DDDD:BB:DD.F, lower-case
 * hex, as sysfs names the function. */
bool vn_backend_vfio_address_ok(const char *s);
/* The IOMMU group number of PCI function @bdf (its sysfs iommu_group), or -1 with @error: no
 * such function, or in no group (no IOMMU). */
int vn_backend_vfio_group(const char *bdf, GError **error);

/* Every required member is there (all but open_fd and hangup_fd); false with @error
 * naming what is missing. */
bool vn_backend_ops_valid(const VnBackendOps *ops, GError **error);
/* Every required member is there (name, dma_map, dma_unmap; last_error is optional); false
 * with @error naming what is missing. */
bool vn_backend_iommu_ops_valid(const VnBackendIommuOps *ops, GError **error);
/* The backend called @name, or NULL with @error listing the known ones. */
const VnBackendOps *vn_backend_find(const char *name, GError **error);

#endif /* VN_BACKEND_H */
