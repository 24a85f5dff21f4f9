/*
 * The vfio backend's IOMMU (backend-type1.c): a VFIO container of its own
 * with a TYPE1v2 IOMMU, joined by the IOMMU group of the function it lends.
 * Private to the vfio backend (backend-vfio.c), which takes its device fd
 * from the group and hands the container to the lender as the device's
 * IOMMU (vn_backend_type1, backend.h).
 *
 * Threads: one thread at a time, as the device's.
 */
#ifndef VN_BACKEND_TYPE1_H
#define VN_BACKEND_TYPE1_H

#include "lending/backend.h"

#include <glib.h>

typedef struct VnBackendType1 VnBackendType1;

/*
 * The container for PCI function @bdf, whose IOMMU group is number @group_id: @group is
 * that group's /dev/vfio/N, open (taken, closed on failure too), or -1 to open it here.
 * The group must be viable (every device in it bound to vfio-pci or to no driver); it
 * joins the container, which gets a TYPE1v2 IOMMU, and the IOMMU's usable IOVA ranges
 * are read.  NULL with @error saying which step failed.
 */
VnBackendType1 *vn_backend_type1_new(const char *bdf, int group_id, int group, GError **error);
/* The group's fd (the container's own), for the device fd and a hot reset. */
int vn_backend_type1_group(VnBackendType1 *t);
/* Drops what is still mapped, then closes the group and the container (close the device
 * first: closing it disables its DMA). */
void vn_backend_type1_free(VnBackendType1 *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnBackendType1, vn_backend_type1_free)

#endif /* VN_BACKEND_TYPE1_H */
