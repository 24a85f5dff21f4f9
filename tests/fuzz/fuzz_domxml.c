/*
 * libFuzzer target for the domain XML checker (libvirt/domxml.c), what the
 * libvirt hook runs on the XML libvirt gives it: any bytes must parse to a
 * checked domain or be refused with an error, never crash.
 */
#include "common/name.h"
#include "libvirt/domxml.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnDomain) dom = NULL;
    /* An exact-size heap copy (not NUL-terminated, as the API allows). */
    char *copy = malloc(size ? size : 1);

    memcpy(copy, data, size);
    dom = vn_domxml_parse(copy, size, &error);
    if (dom == NULL && error == NULL) {
        abort(); /* a refusal says why */
    }
    for (guint i = 0; dom != NULL && i < dom->devices->len; i++) {
        const VnDomDevice *d = dom->devices->pdata[i];

        if (vn_domain_find(dom, d->device) == NULL || !vn_name_valid(VN_NAME_QDEV_ID, d->alias)) {
            abort(); /* what was accepted must hold up */
        }
    }
    free(copy);
    return 0;
}
