/*
 * A PCI function's driver: users, group, binds (see pcibind.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.lending"

#include "pcibind.h"

#include "backend.h"

#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* Lines of mountinfo or swaps read, at most. */
#define MAX_TABLE_LINES 65536u
/* Users named in one sentence, at most (the rest are counted). */
#define MAX_NAMED 8u

static char *function_dir(const char *sys, const char *bdf)
{
    return g_strdup_printf("%s/bus/pci/devices/%s", sys, bdf);
}

/* The basename of the link @dir/@name points to, or "" when there is none. */
static char *link_name(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autofree char *target = g_file_read_link(path, NULL);

    return target != NULL ? g_path_get_basename(target) : g_strdup("");
}

char *vn_pcibind_driver(const char *sys, const char *bdf, GError **error)
{
    g_autofree char *dir = function_dir(sys, bdf);

    if (!g_file_test(dir, G_FILE_TEST_IS_DIR)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND, "no PCI function %s on this host",
                    bdf);
        return NULL;
    }
    return link_name(dir, "driver");
}

/* A sysfs attribute's first line, or NULL. */
static char *read_attr(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autofree char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL)) {
        return NULL;
    }
    text[strcspn(text, "\n")] = '\0';
    return g_steal_pointer(&text);
}

/* What a sentence of users is built from. */
typedef struct Users {
    GString *text;
    unsigned named, more;
} Users;

static void user(Users *u, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void user(Users *u, const char *fmt, ...)
{
    va_list ap;

    if (u->named == MAX_NAMED) {
        u->more++;
        return;
    }
    if (u->text->len > 0) {
        g_string_append(u->text, "; ");
    }
    va_start(ap, fmt);
    g_string_append_vprintf(u->text, fmt, ap);
    va_end(ap);
    u->named++;
}

GPtrArray *vn_pcibind_class_of(const char *sys, const char *cls, const char *bdf)
{
    g_autofree char *cdir = g_strdup_printf("%s/class/%s", sys, cls);
    g_autofree char *needle = g_strdup_printf("/%s/", bdf);
    g_autoptr(GDir) d = g_dir_open(cdir, 0, NULL);
    GPtrArray *found = g_ptr_array_new_with_free_func(g_free);
    const char *name;
    unsigned n = 0;

    while (d != NULL && (name = g_dir_read_name(d)) != NULL && n++ < VN_PCIBIND_MAX_CLASS_ENTRIES) {
        g_autofree char *entry = g_build_filename(cdir, name, NULL);
        g_autofree char *real = realpath(entry, NULL);
        g_autofree char *slashed = real != NULL ? g_strconcat(real, "/", NULL) : NULL;

        if (slashed != NULL && strstr(slashed, needle) != NULL) {
            g_ptr_array_add(found, g_strdup(name));
        }
    }
    return found;
}

/* @fn for each of @bdf's entries of class @cls, with the entry's directory. */
static void for_class(const char *sys, const char *cls, const char *bdf, Users *u,
                      void (*fn)(Users *u, const char *dir, const char *name, void *opaque),
                      void *opaque)
{
    g_autoptr(GPtrArray) names = vn_pcibind_class_of(sys, cls, bdf);

    for (guint i = 0; i < names->len; i++) {
        g_autofree char *entry =
            g_strdup_printf("%s/class/%s/%s", sys, cls, (char *)names->pdata[i]);

        fn(u, entry, names->pdata[i], opaque);
    }
}

/* Whether @path (mountinfo, swaps) has a line whose field @field is @want;
 * the line's field @out (or the whole line's first field) into *@found. */
static bool table_has(const char *path, unsigned field, const char *want, unsigned out,
                      char **found)
{
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL)) {
        return false;
    }
    lines = g_strsplit(text, "\n", MAX_TABLE_LINES);
    for (unsigned i = 0; lines[i] != NULL; i++) {
        g_auto(GStrv) f = g_strsplit_set(lines[i], " \t", 0);
        guint nf = g_strv_length(f);

        if (field < nf && out < nf && strcmp(f[field], want) == 0) {
            *found = g_strdup(f[out]);
            return true;
        }
    }
    return false;
}

typedef struct Procfs {
    const char *proc;
} Procfs;

static void block_user(Users *u, const char *dir, const char *name, void *opaque)
{
    Procfs *p = opaque;
    g_autofree char *dev = read_attr(dir, "dev");
    g_autofree char *mountinfo = g_strdup_printf("%s/self/mountinfo", p->proc);
    g_autofree char *swaps = g_strdup_printf("%s/swaps", p->proc);
    g_autofree char *devpath = g_strdup_printf("/dev/%s", name);
    g_autofree char *where = NULL, *swap = NULL;
    g_autofree char *holders = g_build_filename(dir, "holders", NULL);
    g_autoptr(GDir) hd = g_dir_open(holders, 0, NULL);
    const char *holder = hd != NULL ? g_dir_read_name(hd) : NULL;

    if (dev != NULL && table_has(mountinfo, 2, dev, 4, &where)) {
        user(u, "%s is mounted on %s", name, where);
    }
    if (table_has(swaps, 0, devpath, 0, &swap)) {
        user(u, "%s is a swap area in use", name);
    }
    if (holder != NULL) {
        user(u, "%s is held by %s", name, holder);
    }
}

static void net_user(Users *u, const char *dir, const char *name, void *opaque)
{
    g_autofree char *flags = read_attr(dir, "flags");

    /* IFF_UP */
    if (flags != NULL && (g_ascii_strtoull(flags, NULL, 16) & 0x1) != 0) {
        user(u, "network interface %s is up", name);
    }
}

/* Processes with @rdev (a character device) open. */
static void drm_user(Users *u, const char *dir, const char *name, void *opaque)
{
    Procfs *p = opaque;
    g_autofree char *dev = read_attr(dir, "dev");
    g_autoptr(GDir) pd = g_dir_open(p->proc, 0, NULL);
    unsigned maj, min, procs = 0;
    const char *pid;
    dev_t rdev;

    if (dev == NULL || sscanf(dev, "%u:%u", &maj, &min) != 2) {
        return;
    }
    rdev = makedev(maj, min);
    while (pd != NULL && (pid = g_dir_read_name(pd)) != NULL && procs < VN_PCIBIND_MAX_PROCS) {
        g_autofree char *fddir = NULL;
        g_autoptr(GDir) fds = NULL;
        const char *fd;
        unsigned n = 0;

        if (!g_ascii_isdigit(pid[0])) {
            continue;
        }
        procs++;
        fddir = g_strdup_printf("%s/%s/fd", p->proc, pid);
        fds = g_dir_open(fddir, 0, NULL);
        while (fds != NULL && (fd = g_dir_read_name(fds)) != NULL &&
               n++ < VN_PCIBIND_MAX_FDS_PER_PROC) {
            g_autofree char *path = g_build_filename(fddir, fd, NULL);
            struct stat st;

            if (stat(path, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == rdev) {
                g_autofree char *commf = g_strdup_printf("%s/%s", p->proc, pid);
                g_autofree char *comm = read_attr(commf, "comm");

                user(u, "/dev/dri/%s is open in process %s (%s)", name, pid,
                     comm != NULL ? comm : "?");
                return;
            }
        }
    }
}

char *vn_pcibind_users(const char *sys, const char *proc, const char *bdf)
{
    Users u = { .text = g_string_new(NULL) };
    Procfs p = { proc };

    for_class(sys, "block", bdf, &u, block_user, &p);
    for_class(sys, "net", bdf, &u, net_user, &p);
    for_class(sys, "drm", bdf, &u, drm_user, &p);
    if (u.more > 0) {
        g_string_append_printf(u.text, "; and %u more", u.more);
    }
    if (u.text->len == 0) {
        g_string_free(u.text, TRUE);
        return NULL;
    }
    return g_string_free(u.text, FALSE);
}

/* Drivers a VFIO group may share with vfio-pci (drivers that set
 * driver_managed_dma, or none). */
static bool vfio_compatible(const char *driver)
{
    return driver[0] == '\0' || strcmp(driver, "vfio-pci") == 0 ||
           strcmp(driver, "pcieport") == 0 || strcmp(driver, "pci-stub") == 0;
}

char *vn_pcibind_group_conflicts(const char *sys, const char *bdf)
{
    g_autofree char *dir = function_dir(sys, bdf);
    g_autofree char *gdir = g_build_filename(dir, "iommu_group", "devices", NULL);
    g_autoptr(GDir) d = g_dir_open(gdir, 0, NULL);
    Users u = { .text = g_string_new(NULL) };
    const char *other;
    unsigned n = 0;

    while (d != NULL && (other = g_dir_read_name(d)) != NULL &&
           n++ < VN_PCIBIND_MAX_CLASS_ENTRIES) {
        g_autofree char *odir = g_build_filename(gdir, other, NULL);
        g_autofree char *driver = link_name(odir, "driver");

        if (strcmp(other, bdf) != 0 && !vfio_compatible(driver)) {
            user(&u, "%s (%s)", other, driver);
        }
    }
    if (u.more > 0) {
        g_string_append_printf(u.text, " and %u more", u.more);
    }
    if (u.text->len == 0) {
        g_string_free(u.text, TRUE);
        return NULL;
    }
    return g_string_free(u.text, FALSE);
}

/* Write @text to sysfs file @dir/@name; false with @error naming it. */
static bool attr_write(const char *dir, const char *name, const char *text, GError **error)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    size_t len = strlen(text);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC); /* O_TRUNC: for a plain file */
    ssize_t n;
    int e;

    if (fd < 0) {
        e = errno;
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(e), "cannot open %s: %s", path,
                    g_strerror(e));
        return false;
    }
    do {
        n = write(fd, text, len);
    } while (n < 0 && errno == EINTR);
    e = errno;
    close(fd);
    if (n != (ssize_t)len) {
        g_set_error(error, G_IO_ERROR, g_io_error_from_errno(n < 0 ? e : EIO),
                    "writing \"%s\" to %s: %s", text, path, g_strerror(n < 0 ? e : EIO));
        return false;
    }
    return true;
}

/* Probe drivers for @bdf; nothing binding is no error (checked after). */
static void probe(const char *sys, const char *bdf)
{
    g_autofree char *bus = g_strdup_printf("%s/bus/pci", sys);

    (void)attr_write(bus, "drivers_probe", bdf, NULL);
}

bool vn_pcibind_to_vfio(const char *sys, const char *bdf, char **was, GError **error)
{
    g_autofree char *dir = function_dir(sys, bdf);
    g_autofree char *now = NULL;

    *was = vn_pcibind_driver(sys, bdf, error);
    if (*was == NULL) {
        return false;
    }
    if (strcmp(*was, "vfio-pci") == 0) {
        return true;
    }
    if (!attr_write(dir, "driver_override", "vfio-pci", error) ||
        (**was != '\0' && !attr_write(dir, "driver/unbind", bdf, error))) {
        g_prefix_error(error, "binding %s to vfio-pci: ", bdf);
        return false;
    }
    probe(sys, bdf);
    now = link_name(dir, "driver");
    if (strcmp(now, "vfio-pci") != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED,
                    "%s did not bind to vfio-pci (is the vfio-pci module loaded?)", bdf);
        return false;
    }
    g_message("%s: bound to vfio-pci (was %s)", bdf, **was != '\0' ? *was : "unbound");
    return true;
}

GPtrArray *vn_pcibind_sriov_enable(const char *sys, const char *bdf, unsigned n, GError **error)
{
    g_autofree char *dir = function_dir(sys, bdf);
    g_autofree char *total = read_attr(dir, "sriov_totalvfs");
    g_autofree char *now = read_attr(dir, "sriov_numvfs");
    g_autofree char *want = g_strdup_printf("%u", n);
    g_autoptr(GPtrArray) vfs = g_ptr_array_new_with_free_func(g_free);

    if (total == NULL || now == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED,
                    "%s has no SR-IOV capability (or no such function)", bdf);
        return NULL;
    }
    if (n == 0 || n > g_ascii_strtoull(total, NULL, 10)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                    "%s has at most %s virtual functions, not %u", bdf, total, n);
        return NULL;
    }
    /* The kernel takes a new count only from 0. */
    if (strcmp(now, want) != 0 &&
        ((strcmp(now, "0") != 0 && !attr_write(dir, "sriov_numvfs", "0", error)) ||
         !attr_write(dir, "sriov_numvfs", want, error))) {
        g_prefix_error(error, "creating %u virtual functions of %s (is its own driver bound?): ", n,
                       bdf);
        return NULL;
    }
    for (unsigned i = 0; i < n; i++) {
        g_autofree char *link = g_strdup_printf("virtfn%u", i);
        g_autofree char *vf = link_name(dir, link);

        if (vf[0] == '\0') {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "%s has no virtual function %u", bdf,
                        i);
            return NULL;
        }
        g_ptr_array_add(vfs, g_steal_pointer(&vf));
    }
    if (strcmp(now, want) != 0) {
        g_message("%s: %u virtual functions created", bdf, n);
    }
    return g_steal_pointer(&vfs);
}

bool vn_pcibind_restore(const char *sys, const char *bdf, const char *driver, GError **error)
{
    g_autofree char *dir = function_dir(sys, bdf);
    g_autofree char *now = NULL;

    if (strcmp(driver, "vfio-pci") == 0) {
        return true; /* it was vfio-pci's before we took it */
    }
    now = vn_pcibind_driver(sys, bdf, error);
    if (now == NULL) {
        return false;
    }
    if (!attr_write(dir, "driver_override", "\n", error) ||
        (strcmp(now, "vfio-pci") == 0 && !attr_write(dir, "driver/unbind", bdf, error))) {
        g_prefix_error(error, "giving %s back to %s: ", bdf, driver[0] ? driver : "the host");
        return false;
    }
    probe(sys, bdf);
    g_free(now);
    now = link_name(dir, "driver");
    if (driver[0] != '\0' && strcmp(now, driver) != 0) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "%s went to %s, not back to %s", bdf,
                    now[0] ? now : "no driver", driver);
        return false;
    }
    g_message("%s: given back to %s", bdf, now[0] ? now : "no driver");
    return true;
}

/* A kept file is two short lines. */
#define VN_PCIBIND_KEPT_MAX 256

bool vn_pcibind_keep(const char *path, const char *bdf, const char *driver, GError **error)
{
    g_autofree char *text = g_strdup_printf("%s\n%s\n", driver, bdf);

    return g_file_set_contents_full(path, text, -1, G_FILE_SET_CONTENTS_CONSISTENT, 0600, error);
}

bool vn_pcibind_kept(const char *path, char **driver, char **bdf)
{
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    gsize len = 0;

    *driver = *bdf = NULL;
    if (!g_file_get_contents(path, &text, &len, NULL) || len > VN_PCIBIND_KEPT_MAX ||
        strlen(text) != len) {
        return false;
    }
    lines = g_strsplit(text, "\n", 3);
    if (lines[0] == NULL || strlen(lines[0]) > 64 ||
        !g_regex_match_simple("^[A-Za-z0-9_.-]*$", lines[0], 0, 0)) {
        return false;
    }
    if (lines[1] != NULL && lines[1][0] != '\0') {
        if (!vn_backend_vfio_address_ok(lines[1])) {
            return false;
        }
        *bdf = g_strdup(lines[1]);
    }
    *driver = g_strdup(lines[0]);
    return true;
}

bool vn_pcibind_give_back(const char *sys, const char *path, const char *bdf, GError **error)
{
    g_autofree char *driver = NULL, *named = NULL;

    if (!vn_pcibind_kept(path, &driver, &named)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "%s: not what a lender worker keeps of a managed function", path);
        return false;
    }
    if ((named == NULL && bdf == NULL) ||
        (named != NULL && bdf != NULL && strcmp(named, bdf) != 0)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s names %s, not %s", path,
                    named != NULL ? named : "no function", bdf != NULL ? bdf : "one");
        return false;
    }
    if (!vn_pcibind_restore(sys, named != NULL ? named : bdf, driver, error)) {
        return false;
    }
    unlink(path);
    return true;
}
