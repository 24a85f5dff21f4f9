/*
 * A lent device's identity (see identity.h).  Names come from libpci's
 * lookup in pci.ids (what lspci prints), never from the network.
 */
#define G_LOG_DOMAIN "vfio-ntb.daemon"

#include "identity.h"

#include "lending/pcibind.h"

#include <glib.h>
#include <pci/pci.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* libpci reports through these; its defaults exit the process on an
 * error, which a daemon must not. */
static void pci_say(char *msg, ...) G_GNUC_PRINTF(1, 2);

static void pci_say(char *msg, ...)
{
    g_autofree char *text = NULL;
    va_list ap;

    va_start(ap, msg);
    text = g_strdup_vprintf(msg, ap);
    va_end(ap);
    g_info("libpci: %s", text);
}

static void pci_quiet(char *msg, ...)
{}

/* Only allocation failures reach it once no access method is set up. */
static G_GNUC_NORETURN void pci_fatal(char *msg, ...)
{
    g_critical("libpci: %s", msg);
    abort();
}

static uint64_t attr_hex(const char *dir, const char *name, bool *ok)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autofree char *text = NULL;
    char *end;
    uint64_t v;

    if (!g_file_get_contents(path, &text, NULL, NULL)) {
        *ok = false;
        return 0;
    }
    v = g_ascii_strtoull(text, &end, 16);
    if (end == text) {
        *ok = false;
    }
    return v;
}

/* Bytes of the whole disks under @bdf (partitions are in them). */
static uint64_t storage_size(const char *sys, const char *bdf)
{
    g_autoptr(GPtrArray) disks = vn_pcibind_class_of(sys, "block", bdf);
    uint64_t total = 0;

    for (guint i = 0; i < disks->len; i++) {
        g_autofree char *entry = g_strdup_printf("%s/class/block/%s", sys, (char *)disks->pdata[i]);
        g_autofree char *part = g_build_filename(entry, "partition", NULL);
        g_autofree char *size = g_build_filename(entry, "size", NULL);
        g_autofree char *text = NULL;

        if (!g_file_test(part, G_FILE_TEST_EXISTS) &&
            g_file_get_contents(size, &text, NULL, NULL)) {
            uint64_t sectors = g_ascii_strtoull(text, NULL, 10);

            if (sectors < (UINT64_MAX - total) / 512) {
                total += sectors * 512; /* sysfs counts 512-byte sectors */
            }
        }
    }
    return total;
}

void vn_identity_clean_name(char *name)
{
    size_t i;

    for (i = 0; i < VN_IDENTITY_MAX_NAME && name[i] != '\0'; i++) {
        if (!g_ascii_isprint(name[i])) {
            name[i] = '?';
        }
    }
    name[i] = '\0';
}

bool vn_identity_of_pci(const char *sys, const char *bdf, VnIdentity *id)
{
    g_autofree char *dir = g_strdup_printf("%s/bus/pci/devices/%s", sys, bdf);
    char vd[128] = "", cls[96] = "";
    struct pci_access *pa;
    bool ok = true;

    memset(id, 0, sizeof(*id));
    id->vendor = (uint16_t)attr_hex(dir, "vendor", &ok);
    id->device = (uint16_t)attr_hex(dir, "device", &ok);
    id->class_code = (uint32_t)attr_hex(dir, "class", &ok) & 0xffffff;
    if (!ok) {
        return false;
    }
    g_strlcpy(id->pci, bdf, sizeof(id->pci));
    id->size = storage_size(sys, bdf);
    pa = pci_alloc();
    pa->error = pci_fatal;
    pa->warning = pci_say;
    pa->debug = pci_quiet;
    /* Names only: no access method is initialised (pci_init would probe
     * the bus and exit the process on a failure). */
    if (pci_load_name_list(pa)) {
        /* pci.ids alone, not udev's hwdb: the same names, and libpci would
         * leak the udev handle it opens for it. */
        const int db = PCI_LOOKUP_NO_HWDB;
        const char *c =
            pci_lookup_name(pa, cls, sizeof(cls), PCI_LOOKUP_CLASS | PCI_LOOKUP_NO_NUMBERS | db,
                            id->class_code >> 8);
        const char *v = pci_lookup_name(
            pa, vd, sizeof(vd), PCI_LOOKUP_VENDOR | PCI_LOOKUP_DEVICE | db, id->vendor, id->device);

        g_snprintf(id->name, sizeof(id->name), "%s%s%s", c != NULL ? c : "", c != NULL ? ": " : "",
                   v != NULL ? v : "");
    }
    pci_cleanup(pa);
    if (id->name[0] == '\0') {
        g_snprintf(id->name, sizeof(id->name), "class %06x", id->class_code);
    }
    vn_identity_clean_name(id->name);
    id->known = true;
    return true;
}
