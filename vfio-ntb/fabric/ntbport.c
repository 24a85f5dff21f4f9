/*
 * Opening an NTB port by its spec, whichever provider serves it (ntbport.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.fabric"

#include "ntbport.h"

#include <errno.h>
#include <gio/gio.h>
#include <string.h>

bool vn_ntbport_spec_ok(const char *spec, GError **error)
{
    if (spec == NULL || strlen(spec) > VN_NTBPORT_MAX_SPEC) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb port: a spec of at most %u characters is needed", VN_NTBPORT_MAX_SPEC);
        return false;
    }
    if (g_str_has_prefix(spec, "pair:")) {
        const char *slash = strrchr(spec, '/');

        if (slash == NULL || (strcmp(slash, "/0") != 0 && strcmp(slash, "/1") != 0)) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                        "ntb port %s: an emulated port is pair:KEY/0 or pair:KEY/1", spec);
            return false;
        }
    } else if (!g_str_has_prefix(spec, "/dev/vfio-ntb/") ||
               spec[strlen("/dev/vfio-ntb/")] == '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "ntb port %s: not /dev/vfio-ntb/NAME (the vfio_ntb module's) nor "
                    "pair:KEY/SIDE (emulated)",
                    spec);
        return false;
    }
    return true;
}

VnNtbPort *vn_ntbport_open(const char *spec, GError **error)
{
    VnNtbPort *p = NULL;

    if (!vn_ntbport_spec_ok(spec, error)) {
        return NULL;
    }
    if (g_str_has_prefix(spec, "pair:")) {
        const char *slash = strrchr(spec, '/');
        g_autofree char *key = g_strndup(spec + 5, (gsize)(slash - spec - 5));

        p = vn_ntbport_pair_open(key, (unsigned)(slash[1] - '0'), error);
    } else {
        p = vn_ntbport_kmod_open(spec, error);
    }
    if (p == NULL) {
        return NULL;
    }
    p->spec = g_strdup(spec);
    if (p->info.windows < 1 || p->info.spads < VN_NTBPORT_MIN_SPADS || p->info.doorbells < 3) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "ntb port %s: %u windows, %u scratchpads, %u doorbell bits: the fabric "
                    "needs at least 1, %u and 3",
                    spec, p->info.windows, p->info.spads, p->info.doorbells, VN_NTBPORT_MIN_SPADS);
        vn_ntbport_close(p);
        return NULL;
    }
    return p;
}

void vn_ntbport_close(VnNtbPort *p)
{
    if (p != NULL) {
        g_free(p->spec);
        p->ops->close(p);
    }
}
