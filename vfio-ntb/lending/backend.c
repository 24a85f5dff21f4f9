/*
 * The device backends a lender may use (backend.h), and the checks of a
 * backend's tables (its device's and its IOMMU's).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "lending/backend.h"

#include <gio/gio.h>
#include <string.h>

static const VnBackendOps *const backends[] = {
    &vn_backend_vfio_user,
    &vn_backend_vfio,
};

bool vn_backend_ops_valid(const VnBackendOps *ops, GError **error)
{
    const char *missing = NULL;

    if (ops == NULL) {
        missing = "the table";
    } else if (ops->name == NULL || ops->name[0] == '\0') {
        missing = "name";
    } else if (ops->open == NULL || ops->close == NULL) {
        missing = "open and close";
    } else if (ops->get_info == NULL || ops->get_region_info == NULL || ops->get_irq_info == NULL) {
        missing = "get_info, get_region_info and get_irq_info";
    } else if (ops->set_irqs == NULL) {
        missing = "set_irqs";
    } else if (ops->region_read == NULL || ops->region_write == NULL) {
        missing = "region_read and region_write";
    } else if (ops->reset == NULL || ops->stalled == NULL) {
        missing = "reset and stalled";
    } else if (ops->iommu == NULL) {
        missing = "iommu";
    }
    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "device backend %s: %s missing",
                    ops != NULL && ops->name != NULL ? ops->name : "(unnamed)", missing);
        return false;
    }
    return true;
}

bool vn_backend_iommu_ops_valid(const VnBackendIommuOps *ops, GError **error)
{
    const char *missing = NULL;

    if (ops == NULL) {
        missing = "the table";
    } else if (ops->name == NULL || ops->name[0] == '\0') {
        missing = "name";
    } else if (ops->dma_map == NULL || ops->dma_unmap == NULL) {
        missing = "dma_map and dma_unmap";
    }
    if (missing != NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "IOMMU %s: %s missing",
                    ops != NULL && ops->name != NULL ? ops->name : "(unnamed)", missing);
        return false;
    }
    return true;
}

const VnBackendOps *vn_backend_find(const char *name, GError **error)
{
    g_autoptr(GString) known = g_string_new(NULL);

    for (size_t i = 0; i < G_N_ELEMENTS(backends); i++) {
        if (name != NULL && strcmp(name, backends[i]->name) == 0) {
            return backends[i];
        }
        g_string_append_printf(known, "%s%s", i > 0 ? ", " : "", backends[i]->name);
    }
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                "no device backend \"%.40s\" (known: %s)", name != NULL ? name : "(null)",
                known->str);
    return NULL;
}
